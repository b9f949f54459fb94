// Package nvmetarget is the NVMe over Fabrics controller model (NVMe
// over Fabrics 1.1, NVMe Base 2.0), independent of the transport: NVM
// subsystems whose namespaces are blockcore units, the dynamic controller
// model (a controller made by each admin queue's Connect, its I/O queues
// joining it by controller ID), the admin command set a host needs
// (Identify, Get Log Page, Get/Set Features, Asynchronous Event Request,
// Keep Alive with its timeout enforced, Abort), the properties (CAP, VS,
// CC, CSTS), the NVM I/O commands, and the discovery controller. A
// transport (nvme/tcptarget) frames the capsules and moves the data: it
// hands the controller a command with its host-to-controller data
// already received, and sends what the controller returns.
package nvmetarget

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/internal/persource"
)

// DiscoveryNQN is the well-known NQN of the discovery subsystem.
const DiscoveryNQN = "nqn.2014-08.org.nvmexpress.discovery"

// Defaults of Options.
const (
	DefaultQueueSize   = 128 // entries per queue (CAP.MQES + 1)
	DefaultIOQueues    = 16  // I/O queues per controller
	DefaultControllers = 256 // controllers of the whole target
	// DefaultControllersPerSource: half of them from one address, as
	// iSCSI's sessions of one address (MaxSessionsPerSource).
	DefaultControllersPerSource = 128
	// DefaultInCapsuleData lets a host send writes up to 128 KiB in the
	// command capsule, without waiting for an R2T (a round trip less);
	// what a queue may make the target hold is the same either way (its
	// entries times the largest transfer, within the I/O budget).
	DefaultInCapsuleData = 128 << 10
	// DefaultMDTS is the largest transfer, as a power of two of 4 KiB
	// pages: 1 MiB.
	DefaultMDTS = 8
	// AdminQueueSize is the admin queue's largest size.
	AdminQueueSize = 32
	// aerLimit is how many Asynchronous Event Requests a controller
	// holds (AERL + 1).
	aerLimit = 4
	// abortLimit is ACL + 1.
	abortLimit = 4
)

// Options configure a Target. Zero values take the defaults above.
type Options struct {
	Logger *slog.Logger
	// QueueSize bounds the entries of an I/O queue (what Connect's
	// SQSIZE may ask for).
	QueueSize int
	// IOQueues bounds the I/O queues of a controller.
	IOQueues int
	// Controllers bounds the controllers of the target (discovery
	// controllers included): a host cannot make it hold more.
	// ControllersPerSource bounds those of one source, so that one host
	// cannot take every controller from the others; Sources says what a
	// source is (an address, or an IPv6 network).
	Controllers          int
	ControllersPerSource int
	Sources              persource.Sources
	// InCapsuleData is the most data an I/O command capsule may carry
	// (IOCCSZ less the entry).
	InCapsuleData int
	// MDTS bounds a command's data: 4 KiB << MDTS.
	MDTS uint8
	// Firmware is the revision reported (8 ASCII characters at most).
	Firmware string
	// Referrals lists the discovery log's entries: the node's portals
	// serving each subsystem (Portal.Serves), and the discovery
	// subsystem's own portals.
	Portals func() []Portal
	// DiscoveryAllow reports whether a host may connect to the discovery
	// controller (nil: every host).
	DiscoveryAllow func(host string, remote net.Addr) bool
	// DiscoveryAuth gives the DH-HMAC-CHAP secrets a host authenticates
	// the discovery controller's queues with (as SubsystemConfig.Auth).
	DiscoveryAuth func(host string) AuthKeys
	// AuthTimeout bounds a queue's authentication, from its Connect
	// (default DefaultAuthTimeout): a queue not authenticated by then is
	// closed.
	AuthTimeout time.Duration
}

// Portal is a transport address a subsystem is reachable at, for the
// discovery log page.
type Portal struct {
	ID   uint16
	Addr netip.AddrPort
	// Serves reports whether the portal serves subsystem nqn (nil: all).
	Serves func(nqn string) bool
}

// Target is a node's NVM subsystems and its discovery subsystem.
type Target struct {
	o   Options
	log *slog.Logger

	// mu guards subs and ctrls (lock order: Target.mu, then
	// Subsystem.mu, then Controller.mu; no I/O under any of them).
	mu      sync.Mutex
	subs    map[string]*Subsystem
	ctrls   int
	ctrlsOf persource.Counts[string] // the controllers of each source
	disc    *Subsystem

	// genctr counts the discovery log's changes (GENCTR).
	genctr atomic.Uint64
	// refused counts Connects refused, by reason (metrics).
	refused sync.Map // string → *atomic.Uint64
}

// New returns an empty target.
func New(o Options) *Target {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	o.QueueSize = cmpOr(o.QueueSize, DefaultQueueSize)
	o.IOQueues = cmpOr(o.IOQueues, DefaultIOQueues)
	o.Controllers = cmpOr(o.Controllers, DefaultControllers)
	o.ControllersPerSource = cmpOr(o.ControllersPerSource, DefaultControllersPerSource)
	o.InCapsuleData = cmpOr(o.InCapsuleData, DefaultInCapsuleData)
	if o.AuthTimeout == 0 {
		o.AuthTimeout = DefaultAuthTimeout
	}
	if o.MDTS == 0 {
		o.MDTS = DefaultMDTS
	}
	if o.Firmware == "" {
		o.Firmware = "blockwir"
	}
	t := &Target{o: o, log: o.Logger, subs: map[string]*Subsystem{}}
	t.disc = &Subsystem{t: t, nqn: DiscoveryNQN, discovery: true, ctrls: map[uint16]*Controller{}}
	t.disc.authSeq.Store(mrand.Uint32())
	t.disc.ns.Store(&map[uint32]*blockcore.Unit{})
	return t
}

func cmpOr(v, d int) int {
	if v <= 0 {
		return d
	}
	return v
}

// MaxTransfer is the most data one command may move.
func (t *Target) MaxTransfer() int { return 4096 << t.o.MDTS }

// InCapsuleData is the most data an I/O command capsule may carry; the
// admin queue takes a Connect's 1024 bytes and at most this much.
func (t *Target) InCapsuleData() int { return t.o.InCapsuleData }

// SubsystemConfig describes one NVM subsystem.
type SubsystemConfig struct {
	NQN    string
	Serial string // up to 20 ASCII characters
	Model  string // up to 40
	// Allow reports whether host (its NQN) may connect from remote; nil:
	// every host. It is asked at every Connect, so a change applies to
	// the next one; Revoke ends what is connected already.
	Allow func(host string, remote net.Addr) bool
	// Visible reports whether host sees namespace nsid (per-host
	// masking); nil: every namespace.
	Visible func(host string, nsid uint32) bool
	// Auth, when set, gives the DH-HMAC-CHAP secrets of a host (auth.go):
	// a host with a secret must authenticate every queue. nil, or no
	// host secret: no authentication.
	Auth func(host string) AuthKeys
	// ANA, when set, turns on asymmetric namespace access reporting: the
	// state of this gateway's path to every namespace now (call
	// ANAChanged when it changes). nil: no ANA (every path optimized).
	ANA func() ANAState
}

// Subsystem is one NVM subsystem: its namespaces and controllers.
type Subsystem struct {
	t         *Target
	nqn       string
	cfg       SubsystemConfig
	discovery bool

	// resvWatch cancels each namespace's reservation notices (mu).
	resvWatch map[uint32]func()

	// authSeq numbers the DH-HMAC-CHAP challenges (from a random start).
	authSeq atomic.Uint32

	// anaChanges counts ANA state changes (the ANA log's CHGCNT).
	anaChanges atomic.Uint64

	// ns maps namespace IDs to units: replaced whole on a change (under
	// mu), read without a lock by every I/O.
	ns atomic.Pointer[map[uint32]*blockcore.Unit]

	mu     sync.Mutex
	ctrls  map[uint16]*Controller
	nextID uint16
	closed bool
}

// ErrExists: a subsystem of that NQN is already there.
var ErrExists = errors.New("nvmetarget: subsystem exists")

// AddSubsystem adds an NVM subsystem with no namespaces.
func (t *Target) AddSubsystem(c SubsystemConfig) (*Subsystem, error) {
	if c.NQN == "" || len(c.NQN) > 223 || c.NQN == DiscoveryNQN {
		return nil, fmt.Errorf("nvmetarget: %q is not an NVM subsystem NQN (1 to 223 bytes, not the discovery NQN)", c.NQN)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.subs[c.NQN] != nil {
		return nil, fmt.Errorf("%w: %s", ErrExists, c.NQN)
	}
	s := &Subsystem{t: t, nqn: c.NQN, cfg: c, ctrls: map[uint16]*Controller{}}
	s.authSeq.Store(mrand.Uint32())
	s.ns.Store(&map[uint32]*blockcore.Unit{})
	t.subs[c.NQN] = s
	t.genctr.Add(1)
	return s, nil
}

// RemoveSubsystem removes a subsystem and ends its controllers.
func (t *Target) RemoveSubsystem(nqn string) {
	t.mu.Lock()
	s := t.subs[nqn]
	delete(t.subs, nqn)
	t.genctr.Add(1)
	t.mu.Unlock()
	if s != nil {
		s.mu.Lock()
		s.closed = true
		for _, cancel := range s.resvWatch {
			cancel()
		}
		s.resvWatch = nil
		s.mu.Unlock()
		s.Revoke(func(string, net.Addr) bool { return true })
	}
}

// Subsystem returns the subsystem of nqn, nil if none.
func (t *Target) Subsystem(nqn string) *Subsystem {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.subs[nqn]
}

// Subsystems lists the NVM subsystems' NQNs, sorted.
func (t *Target) Subsystems() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.subs))
	for n := range t.subs {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// NQN is the subsystem's NQN.
func (s *Subsystem) NQN() string { return s.nqn }

// SetNamespace attaches u as namespace nsid (1 to 0xfffffffe), or with u
// nil detaches it; every controller gets a namespace attribute notice.
func (s *Subsystem) SetNamespace(nsid uint32, u *blockcore.Unit) error {
	if nsid == 0 || nsid == 0xffffffff {
		return fmt.Errorf("nvmetarget: namespace ID %d is reserved", nsid)
	}
	s.mu.Lock()
	ns := maps.Clone(*s.ns.Load())
	if u == nil {
		delete(ns, nsid)
	} else {
		ns[nsid] = u
	}
	s.ns.Store(&ns)
	ctrls := s.controllers()
	if cancel := s.resvWatch[nsid]; cancel != nil {
		cancel()
		delete(s.resvWatch, nsid)
	}
	if u != nil {
		if s.resvWatch == nil {
			s.resvWatch = map[uint32]func(){}
		}
		s.resvWatch[nsid] = u.WatchReservations(func(n blockcore.ReservationNotice, names []string) { s.reservationNotice(nsid, n, names) })
	}
	s.mu.Unlock()
	for _, c := range ctrls {
		c.nsChanged(nsid)
	}
	return nil
}

// Namespaces lists the attached namespace IDs, ascending.
func (s *Subsystem) Namespaces() []uint32 {
	return slices.Sorted(maps.Keys(*s.ns.Load()))
}

// CapacityChanged tells the controllers that namespace nsid's capacity
// changed.
func (s *Subsystem) CapacityChanged(nsid uint32) {
	s.mu.Lock()
	ctrls := s.controllers()
	s.mu.Unlock()
	for _, c := range ctrls {
		c.nsChanged(nsid)
	}
}

// controllers returns the live controllers (s.mu held).
func (s *Subsystem) controllers() []*Controller {
	out := make([]*Controller, 0, len(s.ctrls))
	for _, c := range s.ctrls {
		out = append(out, c)
	}
	return out
}

// Controllers describes the subsystem's controllers now.
func (s *Subsystem) Controllers() []ControllerInfo {
	s.mu.Lock()
	ctrls := s.controllers()
	s.mu.Unlock()
	out := make([]ControllerInfo, 0, len(ctrls))
	for _, c := range ctrls {
		out = append(out, c.Info())
	}
	slices.SortFunc(out, func(a, b ControllerInfo) int { return int(a.ID) - int(b.ID) })
	return out
}

// Revoke ends every controller whose host keep no longer allows (its
// queues' connections are closed at once): access changes apply to live
// controllers, not only to the next Connect.
func (s *Subsystem) Revoke(keep func(host string, remote net.Addr) bool) int {
	s.mu.Lock()
	ctrls := s.controllers()
	s.mu.Unlock()
	n := 0
	for _, c := range ctrls {
		if !keep(c.hostNQN, c.remote) {
			c.log.Warn("NVMe controller ended: its host is no longer allowed")
			c.destroy()
			n++
		}
	}
	return n
}

// Drop ends controller id; false if there is none.
func (s *Subsystem) Drop(id uint16) bool {
	s.mu.Lock()
	c := s.ctrls[id]
	s.mu.Unlock()
	if c == nil {
		return false
	}
	c.destroy()
	return true
}

// allows reports whether host may connect from remote.
func (s *Subsystem) allows(host string, remote net.Addr) bool {
	if s.discovery {
		return s.t.o.DiscoveryAllow == nil || s.t.o.DiscoveryAllow(host, remote)
	}
	return s.cfg.Allow == nil || s.cfg.Allow(host, remote)
}

// visible reports whether host sees nsid.
func (s *Subsystem) visible(host string, nsid uint32) bool {
	return s.cfg.Visible == nil || s.cfg.Visible(host, nsid)
}

// namespace returns namespace nsid as host sees it (nil: none).
func (s *Subsystem) namespace(host string, nsid uint32) *blockcore.Unit {
	u := (*s.ns.Load())[nsid]
	if u == nil || !s.visible(host, nsid) {
		return nil
	}
	return u
}

// Refusals counts the Connects refused, by reason.
func (t *Target) Refusals() map[string]uint64 {
	out := map[string]uint64{}
	t.refused.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Uint64).Load()
		return true
	})
	return out
}

func (t *Target) refuse(reason string) {
	v, _ := t.refused.LoadOrStore(reason, new(atomic.Uint64))
	v.(*atomic.Uint64).Add(1)
}

// Controllers is the number of live controllers.
func (t *Target) Controllers() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ctrls
}
