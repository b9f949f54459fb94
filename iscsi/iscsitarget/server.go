// Package iscsitarget is the iSCSI target role of RFC 7143: it accepts
// connections, runs the login phase (security and operational negotiation,
// CHAP, session creation and reinstatement), and drives the full feature
// phase — SCSI commands with immediate, unsolicited and solicited data,
// Data-In, task management, text, NOP and logout — through the Datamover
// Interface (package datamover) into the transport-neutral SCSI core
// (package target at the repository root).
package iscsitarget

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/internal/bufpool"
	"github.com/blockwire/blockwire/internal/logsample"
	"github.com/blockwire/blockwire/internal/persource"
	"github.com/blockwire/blockwire/iscsi/auth"
	"github.com/blockwire/blockwire/scsitarget"
)

// Target is one iSCSI target node served by a Server.
type Target struct {
	Name   string // iSCSI name (iqn./eui./naa.)
	Alias  string
	Device *scsitarget.Device
	// TPGT is the target portal group tag of every portal (default 1).
	TPGT uint16
	// Initiators, when non-empty, lists the initiator names allowed to log
	// in; others fail with 0202 (authorization failure). Restricted makes
	// an empty list admit nobody (an ACL naming only SRP initiators).
	Initiators []string
	Restricted bool
	// LUNMaps gives initiators their view of the LUNs: the numbers they
	// use, each mapped to the device's LUN (scsitarget.Nexus.LUNs);
	// initiators not in it see every LUN under its own number.
	LUNMaps map[string]map[uint64]uint64
	// Sources, for an initiator in it, are the only addresses or
	// networks it may log in from (others get 0202).
	Sources map[string][]netip.Prefix
	// Portals, when not nil, are the only portals ("host:port" as
	// listened on; an unspecified host stands for any address on that
	// port) where the target is listed by SendTargets and can be logged in
	// to — an empty list, none; a login through another portal gets 0203,
	// not found. Nil: every portal.
	Portals []string
	// CHAP, when set, is required of every initiator (one-way CHAP).
	CHAP *auth.Credentials
	// InitiatorCHAP gives per-initiator CHAP credentials; an initiator
	// listed here must authenticate with its own.
	InitiatorCHAP map[string]auth.Credentials
	// MutualCHAP, when set, are the target's credentials for initiators
	// that ask for mutual authentication.
	MutualCHAP *auth.Credentials
	// Redirect, when set, is the TargetAddress ("host:port[,tpgt]") that
	// logins to this target are sent to, after the ACL check: Login
	// Response status 0101, moved temporarily, or 0102, moved
	// permanently, with RedirectPermanent (RFC 7143 §11.13.5, §13.8).
	Redirect          string
	RedirectPermanent bool
	// TargetResets lists the initiators allowed TARGET WARM RESET and
	// TARGET COLD RESET (RFC 7143 §11.5.1); AnyTargetReset allows every
	// initiator the target admits. Each reaches every LU and every
	// initiator of the target, so others get "function authorization
	// failed" and nothing happens.
	TargetResets   []string
	AnyTargetReset bool
}

// onPortal reports whether a connection that reached local ("host:port")
// may see the target.
func (t *Target) onPortal(local string) bool {
	if t.Portals == nil {
		return true
	}
	lh, lp, err := net.SplitHostPort(local)
	if err != nil {
		return false
	}
	la, _ := netip.ParseAddr(lh)
	for _, p := range t.Portals {
		h, port, err := net.SplitHostPort(p)
		if err != nil || port != lp {
			continue
		}
		if a, err := netip.ParseAddr(h); err == nil && (a.IsUnspecified() || a.Unmap() == la.Unmap()) {
			return true
		}
	}
	return false
}

// admitsFrom reports whether initiator may log in from remote
// ("host:port").
func (t *Target) admitsFrom(initiator, remote string) bool {
	prefixes, ok := t.Sources[initiator]
	if !ok {
		return true
	}
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return false
	}
	for _, p := range prefixes {
		if p.Contains(ap.Addr().Unmap()) {
			return true
		}
	}
	return false
}

func (t *Target) allows(initiator string) bool {
	if len(t.Initiators) == 0 {
		return !t.Restricted
	}
	for _, i := range t.Initiators {
		if i == initiator {
			return true
		}
	}
	return false
}

// chapFor returns the credentials an initiator must prove, or nil when the
// target needs no authentication from it.
func (t *Target) chapFor(initiator string) *auth.Credentials {
	if c, ok := t.InitiatorCHAP[initiator]; ok {
		return &c
	}
	return t.CHAP
}

// Options tune a Server. Zero values pick the defaults in parentheses.
type Options struct {
	// LoginTimeout bounds the whole login phase (15s).
	LoginTimeout time.Duration
	// NopInterval is how long a connection may be idle before the target
	// pings it with a NOP-In (10s); NopTimeout is how long the ping may go
	// unanswered before the connection is dropped (15s). A negative
	// NopInterval disables pings.
	NopInterval time.Duration
	NopTimeout  time.Duration
	// CmdWindow is the number of commands the initiator may have queued
	// (MaxCmdSN - ExpCmdSN + 1; 128).
	CmdWindow uint32
	// MaxRecvDataSegmentLength is what the target declares (262144).
	MaxRecvDataSegmentLength int
	// MaxConnections per session (8).
	MaxConnections int
	// MaxSessions bounds the sessions of all targets together, discovery
	// ones included (1024); a login beyond it fails with "out of
	// resources" (RFC 7143 §11.13.5, status 0302h).
	MaxSessions int
	// Sources says what one address is to the per-source bounds below:
	// the address itself by default, or an IPv6 peer's network.
	Sources persource.Sources
	// MaxSessionsPerSource bounds the normal sessions whose leading
	// connection came from one address (128), so that one initiator host
	// cannot take all MaxSessions and lock the others out; a login beyond
	// it fails with "out of resources". A host with a session to each of
	// many targets (one target per volume) may need it raised.
	MaxSessionsPerSource int
	// MaxWorkingPerSource bounds one address's commands on the LUs'
	// workers — executing, or answered and waiting for the peer to take
	// the answer — across all its connections (256). Each connection
	// holds at most maxWorking alone; a host that stops taking answers on
	// many connections would otherwise hold all of an LU's detached
	// answers (scsitarget: 1024 at least) and then its workers. Past the
	// bound the address's further commands wait, holding no worker,
	// until one of its commands is done (conn.toWorker).
	MaxWorkingPerSource int
	// Budget bounds the I/O buffers of all sessions together and each
	// session's share (blockcore.IOBudget; shared with the node's other
	// fabrics). Nil: 1 GiB, 128 MiB a session. A command that finds no
	// room gets TASK SET FULL.
	Budget *blockcore.IOBudget
	// Memory, when set, supplies the task buffers (an RDMA device's
	// registered memory: iSER moves them without a bounce copy).
	Memory datamover.Memory
	// MaxDiscoverySessions bounds discovery sessions, which are not
	// counted in MaxSessions (16): clients that only ask for the target
	// list cannot take the sessions that carry data.
	MaxDiscoverySessions int
	// MaxDiscoverySessionsPerSource bounds the discovery sessions of one
	// address (4): a host cannot take them all and keep the others from
	// the target list. DiscoveryIdle ends a discovery session that has
	// asked for nothing in that long (30s), pings answered or not.
	MaxDiscoverySessionsPerSource int
	DiscoveryIdle                 time.Duration
	// DataTimeout ends a WRITE whose data stops coming: one the
	// initiator owes Data-Out (an R2T outstanding, or unsolicited data
	// announced) that gets none for this long (15s) is answered CHECK
	// CONDITION, ABORTED COMMAND / INITIATOR RESPONSE TIMEOUT, and its
	// buffer and share of the I/O budget are freed; a second on the same
	// connection ends the connection. Negative: never.
	DataTimeout time.Duration
	// SolicitedWrites bounds the WRITEs of one connection whose data the
	// target solicits at once (R2Ts outstanding, 8). A WRITE that needs
	// R2Ts beyond it waits, in arrival order, holding no buffer and no
	// I/O budget beyond the immediate and unsolicited data it brought;
	// its buffer is taken when its turn comes. What a connection holds
	// for data that has not come is then bounded by this many transfers,
	// not by its command window (writes_waited counts the waits).
	SolicitedWrites int
	// MaxLoginsPerSource bounds the connections from one address that
	// have not finished logging in (8); more are closed as they arrive.
	MaxLoginsPerSource int
	// MaxLogins bounds the connections of every address together that
	// have not finished logging in (256), as sshd's MaxStartups does: a
	// host with many addresses cannot hold thousands of half-open logins.
	// More are closed as they arrive.
	MaxLogins int
	// LogoutWait is how long Shutdown waits for initiators to log out
	// after the Async Message asking them to (3s).
	LogoutWait time.Duration
	// RequireHeaderDigest and RequireDataDigest make CRC32C the only
	// acceptable digest (RFC 7143 §13.1); by default the target accepts
	// both and follows the initiator's order of preference.
	RequireHeaderDigest bool
	RequireDataDigest   bool
	// Gateway says this node reaches LUNs through other targets (remote
	// backends), EndNode that it has LUNs of its own. They answer the
	// node preference an iSER initiator may put in its connection
	// request (the iSER-on-InfiniBand draft part III); neither means an end node.
	Gateway, EndNode bool

	// afterRespond, in tests, runs between a command's response and the
	// release of its task.
	afterRespond func(itt uint32)
}

// DefaultOptions returns the options a zero Options stands for: the one
// place the iSCSI target's defaults are written.
func DefaultOptions() Options {
	var o Options
	o.defaults()
	return o
}

func (o *Options) defaults() {
	if o.LoginTimeout == 0 {
		o.LoginTimeout = 15 * time.Second
	}
	if o.NopInterval == 0 {
		o.NopInterval = 10 * time.Second
	}
	if o.NopTimeout == 0 {
		o.NopTimeout = 15 * time.Second
	}
	if o.CmdWindow == 0 {
		o.CmdWindow = 128
	}
	if o.MaxRecvDataSegmentLength == 0 {
		o.MaxRecvDataSegmentLength = 262144
	}
	if o.MaxConnections == 0 {
		o.MaxConnections = 8
	}
	if o.MaxSessions == 0 {
		o.MaxSessions = 1024
	}
	if o.MaxSessionsPerSource == 0 {
		o.MaxSessionsPerSource = 128
	}
	if o.MaxWorkingPerSource == 0 {
		o.MaxWorkingPerSource = defaultMaxWorkingPerSource
	}
	if o.Budget == nil {
		o.Budget = blockcore.NewIOBudget(DefaultIOBudget, DefaultSessionIOBudget)
	}
	if o.MaxDiscoverySessions == 0 {
		o.MaxDiscoverySessions = 16
	}
	if o.MaxDiscoverySessionsPerSource == 0 {
		o.MaxDiscoverySessionsPerSource = 4
	}
	if o.DiscoveryIdle == 0 {
		o.DiscoveryIdle = 30 * time.Second
	}
	if o.DataTimeout == 0 {
		o.DataTimeout = 15 * time.Second
	}
	if o.SolicitedWrites == 0 {
		o.SolicitedWrites = 8
	}
	if o.MaxLoginsPerSource == 0 {
		o.MaxLoginsPerSource = 8
	}
	if o.MaxLogins == 0 {
		o.MaxLogins = 256
	}
	if o.LogoutWait == 0 {
		o.LogoutWait = 3 * time.Second
	}
}

// Server serves iSCSI targets on one or more portals.
type Server struct {
	log   *slog.Logger
	opts  Options
	pool  bufpool.Pool
	tasks sync.Pool // *task

	// Lock order: mu is taken alone — never while a session's or a
	// connection's lock is held, and neither is taken under it.
	mu            sync.Mutex
	targets       map[string]*Target
	discovery     *Target  // discovery sessions' access rules (SetDiscovery)
	portals       []string // for SendTargets, "host:port"
	acceptors     map[datamover.Acceptor]struct{}
	conns         map[*conn]struct{}
	sessions      map[uint16]*session
	nextTSIH      uint16
	closing       bool
	connWG        sync.WaitGroup
	loginFailures [4]atomic.Uint64 // by status class (LoginFailures)
	// logins counts, by source address, accepted connections that have
	// not finished logging in (Options.MaxLoginsPerSource); refused
	// counts the connections closed for it.
	logins  persource.Counts[string]
	refused atomic.Int64
	// loginsAll counts them all (Options.MaxLogins); refusedAll counts
	// the connections closed for it.
	loginsAll  int
	refusedAll atomic.Uint64
	// setups holds, oldest first, the login slots whose connections are
	// still in their fabric's set-up; setupsEvicted counts those that
	// gave their place to a newer connection (takeLoginSlot).
	setups        list.List
	setupsEvicted atomic.Uint64
	// sources holds, by address, what its connections share: the count
	// of their commands on LU workers (Options.MaxWorkingPerSource).
	sources map[string]*source
	// Logins refused for the session bounds, and receivers that waited
	// for their address's commands on workers (BoundsHit).
	sessionsFull, discoveryFull, sourceSessionsFull, sourceWaits atomic.Uint64
	sourceDiscoveryFull, discoveryIdle, dataTimeouts             atomic.Uint64
	writesWaited                                                 atomic.Uint64
	// loginTimeouts counts the connections dropped for a login not
	// complete in time (their warnings are thinned out past 16).
	loginTimeouts atomic.Int64
	setupFailed   atomic.Int64 // connections whose fabric set-up failed
}

// loginSlot is an accepted connection's place among its source's logins
// in progress; release frees it (once) at full feature phase or when the
// connection ends.
type loginSlot struct {
	s   *Server
	src string
	// Under s.mu. released: the place is free again. setup: the slot is
	// in s.setups, its connection's fabric set-up (Establish) under way;
	// cancel ends that set-up when the slot is evicted.
	released bool
	setup    *list.Element
	cancel   context.CancelFunc
}

// takeLoginSlot admits a new connection from addr, or returns nil when its
// source has too many logins in progress, or when every address's
// together are at Options.MaxLogins and none of them is still in its
// fabric's set-up. Such a set-up — an RDMA connection request answered
// and waiting for the peer's RTU, a TCP connection that has sent nothing
// — is what a flood of spoofed or empty connections holds: the oldest
// one gives its place to the new connection (as a SYN queue drops its
// oldest entry), so a genuine peer, whose set-up completes in a round
// trip, still gets in. cancel ends the new connection's set-up when it
// is evicted in turn.
func (s *Server) takeLoginSlot(addr net.Addr, cancel context.CancelFunc) *loginSlot {
	src := s.opts.Sources.Of(addr)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.loginsAll >= s.opts.MaxLogins && s.setups.Len() == 0 {
		s.refusedAll.Add(1)
		return nil
	}
	if !s.logins.Take(src, s.opts.MaxLoginsPerSource) {
		s.refused.Add(1)
		return nil
	}
	if s.loginsAll >= s.opts.MaxLogins {
		old := s.setups.Front().Value.(*loginSlot)
		old.releaseLocked()
		old.cancel()
		s.setupsEvicted.Add(1)
	}
	s.loginsAll++
	l := &loginSlot{s: s, src: src, cancel: cancel}
	l.setup = s.setups.PushBack(l)
	return l
}

// established takes the slot out of the set-ups (its connection is set
// up; its login goes on); false when it was evicted meanwhile.
func (l *loginSlot) established() bool {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.setup != nil {
		l.s.setups.Remove(l.setup)
		l.setup = nil
	}
	return !l.released
}

// source is the address the slot's connection came from ("" without a
// slot).
func (l *loginSlot) source() string {
	if l == nil {
		return ""
	}
	return l.src
}

func (l *loginSlot) release() {
	if l == nil {
		return
	}
	l.s.mu.Lock()
	l.releaseLocked()
	l.s.mu.Unlock()
}

func (l *loginSlot) releaseLocked() {
	if l.released {
		return
	}
	l.released = true
	l.s.logins.Give(l.src)
	l.s.loginsAll--
	if l.setup != nil {
		l.s.setups.Remove(l.setup)
		l.setup = nil
	}
}

// NewServer returns a server with no targets.
func NewServer(log *slog.Logger, opts Options) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opts.defaults()
	s := &Server{
		log:       log,
		opts:      opts,
		targets:   map[string]*Target{},
		acceptors: map[datamover.Acceptor]struct{}{},
		conns:     map[*conn]struct{}{},
		sessions:  map[uint16]*session{},
	}
	if opts.Memory != nil {
		s.pool.Source = opts.Memory
	}
	return s
}

// The I/O buffer budget when Options.Budget is nil.
const (
	DefaultIOBudget        = 1 << 30
	DefaultSessionIOBudget = 128 << 20
)

// maxWorking is how many commands one connection may have on its LUs'
// workers (blockcore.DefaultWorkers: 64 per LU), executing or answering,
// before its receiver runs them itself (LUs that never block, over TCP)
// or the commands wait for a worker (conn.toWorker). It bounds what a
// peer that stops taking its answers holds per connection (their workers
// are detached:
// scsitarget.LU.Detach). 32 is a whole Linux session's default queue
// depth: at 16, two qemu-img processes 16 deep on one core reached 124–136k
// 4 KiB reads/s against 127–147k at 32 (4 alternating rounds), one
// connection 32 deep on an O_DIRECT file LU 49–51k writes/s against
// 53–55k, and iSER over the software RoCE device at QD 32 lost 5 %.
const maxWorking = 32

// dispatch hands a task whose data is complete to its LU's queue
// (scsitarget.LU.Submit: the execution model iSCSI shares with SRP); a full
// queue answers it TASK SET FULL.
func (s *Server) dispatch(t *task) {
	if !t.c.sess.tgt.Device.Submit(&t.cmd, t) {
		t.c.mu.Lock()
		t.full = true
		t.c.mu.Unlock()
		t.execute()
	}
}

// AddTarget registers a target.
func (s *Server) AddTarget(t *Target) error {
	if t.Name == "" || t.Device == nil {
		return errors.New("iscsi: target needs a name and a device")
	}
	if t.TPGT == 0 {
		t.TPGT = 1
	}
	if err := t.checkSecrets(); err != nil {
		return fmt.Errorf("iscsi: target %s: %w", t.Name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.targets[t.Name]; dup {
		return fmt.Errorf("iscsi: target %s already exists", t.Name)
	}
	s.targets[t.Name] = t
	return nil
}

// checkSecrets holds the target's CHAP secrets to RFC 7143 §12.1.3: at
// least 96 bits each, and the target's own (mutual CHAP) secret never one
// an initiator authenticates with.
func (t *Target) checkSecrets() error {
	var errs []error
	ini := map[string]bool{}
	check := func(what string, c *auth.Credentials) {
		if err := auth.CheckSecret(c.Secret); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}
	if t.CHAP != nil {
		check("CHAP", t.CHAP)
		ini[t.CHAP.Secret] = true
	}
	for name, c := range t.InitiatorCHAP {
		check("CHAP of "+name, &c)
		ini[c.Secret] = true
	}
	if t.MutualCHAP != nil {
		check("mutual CHAP", t.MutualCHAP)
		if ini[t.MutualCHAP.Secret] {
			errs = append(errs, errors.New("the mutual CHAP secret is also an initiator's secret (RFC 7143 §12.1.3 forbids it)"))
		}
	}
	return errors.Join(errs...)
}

// SetDiscovery sets the access rules of discovery sessions: d's
// Initiators (who may ask for the target list), CHAP, InitiatorCHAP and
// MutualCHAP, as for a target; nil: anyone, no authentication. Logins
// from now on follow them.
func (s *Server) SetDiscovery(d *Target) error {
	if d != nil {
		if err := d.checkSecrets(); err != nil {
			return fmt.Errorf("iscsi: discovery: %w", err)
		}
		dc := *d // its access rules; a discovery session reaches no target
		dc.Name, dc.Device, dc.TPGT, dc.Redirect = "", nil, 1, ""
		d = &dc
	}
	s.mu.Lock()
	s.discovery = d
	s.mu.Unlock()
	return nil
}

// discoveryTarget is what a discovery session logs in to: no name, no
// device, the discovery access rules.
func (s *Server) discoveryTarget() *Target {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.discovery == nil {
		return &Target{TPGT: 1}
	}
	t := *s.discovery
	return &t
}

// UpdateTarget replaces the access rules of a target — every field of t
// but its Device and TPGT, which stay. They hold at once: a session
// logged in that the new rules would not admit now (its initiator, its
// address), whose initiator's view of the LUNs or CHAP credentials changed,
// ends; the others keep going.
func (s *Server) UpdateTarget(t *Target) error {
	if err := t.checkSecrets(); err != nil {
		return fmt.Errorf("iscsi: target %s: %w", t.Name, err)
	}
	s.mu.Lock()
	old := s.targets[t.Name]
	if old == nil {
		s.mu.Unlock()
		return fmt.Errorf("iscsi: no target %s", t.Name)
	}
	nt := *t // every access rule is t's; what cannot change live is old's
	nt.Device, nt.TPGT = old.Device, old.TPGT
	s.targets[t.Name] = &nt
	var live []*session
	for _, ss := range s.sessions {
		if ss.targetName == t.Name && !ss.discovery {
			live = append(live, ss)
		}
	}
	s.mu.Unlock()
	// The rules hold for sessions already logged in too: a session the
	// new rules would not let in now ends (an initiator still admitted
	// logs in again under them); one whose view of the LUNs changed sees
	// the new one at once, told by a unit attention.
	for _, ss := range live {
		if why := revoked(old, &nt, ss); why != "" {
			ss.close(why)
			continue
		}
		if m := nt.LUNMaps[ss.initiator]; !maps.Equal(old.LUNMaps[ss.initiator], m) || (m == nil) != (old.LUNMaps[ss.initiator] == nil) {
			s.log.Info("access changed: the initiator's view of the LUNs changed; it is told by REPORTED LUNS DATA HAS CHANGED", "tsih", ss.tsih, "initiator", ss.initiator)
			nt.Device.SetNexusLUNs(ss.nexus, m)
		}
	}
	return nil
}

// revoked says why a session logged in under old's rules may not go on
// under nt's, or "".
func revoked(old, nt *Target, ss *session) string {
	ini := ss.initiator
	switch {
	case !nt.allows(ini):
		return "access revoked: the initiator is no longer in the target's ACL"
	case !reflect.DeepEqual(old.chapFor(ini), nt.chapFor(ini)):
		return "access changed: the CHAP credentials the initiator proved changed"
	}
	for _, c := range ss.connList() {
		if !nt.admitsFrom(ini, c.dm.RemoteAddr()) {
			return "access revoked: the initiator's from no longer admits " + c.dm.RemoteAddr()
		}
	}
	return ""
}

// RemoveTarget stops offering a target and closes its sessions. The
// caller closes its Device.
func (s *Server) RemoveTarget(name string) error {
	s.mu.Lock()
	if s.targets[name] == nil {
		s.mu.Unlock()
		return fmt.Errorf("iscsi: no target %s", name)
	}
	delete(s.targets, name)
	var drop []*session
	for _, ss := range s.sessions {
		if ss.targetName == name {
			drop = append(drop, ss)
		}
	}
	s.mu.Unlock()
	for _, ss := range drop {
		ss.close("the target was removed")
	}
	return nil
}

func (s *Server) target(name string) *Target {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.targets[name]
}

func (s *Server) targetList() []*Target {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Target, 0, len(s.targets))
	for _, t := range s.targets {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Serve accepts connections from a fabric's acceptor (package fabric:
// iSCSI/TCP, the shared iSCSI/iSER portal, iSER on an RDMA/CM device) until
// Shutdown or an accept error. It closes a at Shutdown.
func (s *Server) Serve(a datamover.Acceptor) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		a.Close()
		return net.ErrClosed
	}
	s.acceptors[a] = struct{}{}
	s.portals = append(s.portals, a.Addr())
	s.mu.Unlock()
	s.log.Info("listening", "portal", a.Addr())
	var delay time.Duration
	for {
		in, err := a.Accept(context.Background())
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			// The portal is gone (its RDMA device removed, say): no
			// longer listed; a new Serve may bring it back.
			s.mu.Lock()
			delete(s.acceptors, a)
			if i := slices.Index(s.portals, a.Addr()); i >= 0 {
				s.portals = slices.Delete(s.portals, i, i+1)
			}
			s.mu.Unlock()
			return err
		}
		delay = 0
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.LoginTimeout)
		slot := s.takeLoginSlot(in.RemoteAddr(), cancel)
		if slot == nil {
			cancel()
			if n := s.refused.Load() + int64(s.refusedAll.Load()); logsample.Keep(n) {
				s.log.Warn("connection closed: too many logins in progress, from its address or in all", "remote", in.RemoteAddr().String(),
					"limit_per_source", s.opts.MaxLoginsPerSource, "limit", s.opts.MaxLogins, "refused", n)
			}
			in.Close()
			continue
		}
		go s.establish(ctx, cancel, in, slot)
	}
}

// establish lets the fabric finish setting up an accepted connection (an
// MPA exchange, an RDMA/CM accept; bounded by the login timeout, ended by
// cancel when a newer connection takes its slot) and runs it. The
// connection holds its login slot until its login completes.
func (s *Server) establish(ctx context.Context, cancel context.CancelFunc, in datamover.Incoming, slot *loginSlot) {
	defer cancel()
	// What the connection holds once logged in (an iSER ring) counts
	// against its source's part of the I/O budget.
	mem := s.opts.Budget.NewShare(slot.source())
	est, err := in.Establish(ctx, datamover.AcceptParams{Window: s.opts.CmdWindow, EndNode: s.opts.EndNode, Gateway: s.opts.Gateway,
		SendTimeout: s.opts.NopTimeout, Memory: mem, Logger: s.log})
	if err == nil && !slot.established() {
		// Evicted as it completed: its place is another's now.
		est.Close()
		err = errors.New("its place among the logins in progress went to a newer connection")
	}
	if err != nil {
		mem.Close()
		slot.release()
		// A fabric's set-up that fails (junk instead of an MPA
		// Request, a refused RDMA/CM connection) is anyone's to cause:
		// thinned out as the login timeouts are.
		if n := s.setupFailed.Add(1); logsample.Keep(n) {
			s.log.Info("connection refused", "remote", in.RemoteAddr().String(), "err", err, "refused", n)
		}
		return
	}
	remote := in.RemoteAddr().String()
	if est.Kind == datamover.KindISER {
		remote = "iser:" + remote
	}
	c := newConn(s, remote, est)
	c.slot = slot
	c.mem = mem
	s.start(c, func() { slot.release(); est.Close() })
}

// start runs a connection until it ends; abort closes its transport when
// the server is already shutting down.
func (s *Server) start(c *conn, abort func()) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		abort()
		if c.mem != nil {
			c.mem.Close()
		}
		return
	}
	s.conns[c] = struct{}{}
	c.src = s.joinSource(c.slot.source())
	s.connWG.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.connWG.Done()
		c.run()
		c.awaitBackground()
		if c.mem != nil {
			c.mem.Close() // the datamover gave its charge back as it ended
		}
		s.mu.Lock()
		delete(s.conns, c)
		s.leaveSource(c.src)
		s.mu.Unlock()
	}()
}

// Shutdown stops accepting, asks every logged-in initiator to log out
// (Async Message, event 1), waits up to Options.LogoutWait (or ctx) for
// them, then drops the remaining connections after their in-flight
// commands complete.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	for a := range s.acceptors {
		a.Close()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.requestLogout(int(s.opts.LogoutWait / time.Second))
	}
	done := make(chan struct{})
	go func() { s.connWG.Wait(); close(done) }()
	wait, cancel := context.WithTimeout(ctx, s.opts.LogoutWait)
	defer cancel()
	select {
	case <-done:
		return nil
	case <-wait.Done():
	}
	s.mu.Lock()
	for c := range s.conns {
		c.drainAndClose()
	}
	s.mu.Unlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sessions ------------------------------------------------------------

func (s *Server) allocTSIH() uint16 {
	for {
		s.nextTSIH++
		if s.nextTSIH == 0 {
			continue
		}
		if _, used := s.sessions[s.nextTSIH]; !used {
			return s.nextTSIH
		}
	}
}

// findSession returns the session with the same initiator name, ISID and
// target (RFC 7143 §4.4.3: the session identifier is ISID + initiator name
// + target portal group).
func (s *Server) findSession(initiator string, isid [6]byte, targetName string, discovery bool) *session {
	for _, ss := range s.sessions {
		if ss.initiator == initiator && ss.isid == isid && ss.targetName == targetName && ss.discovery == discovery {
			return ss
		}
	}
	return nil
}

// BoundsHit counts, by bound, the times a peer met one of the bounds on
// what it may make the server hold: connections closed for their
// address's logins in progress (logins_per_source), for all addresses'
// (logins, Options.MaxLogins), connections still in their fabric's
// set-up that gave their place to a newer one at that bound
// (logins_setup_evicted), and for a login not finished in time
// (login_timeout); logins refused "out of resources"
// for the sessions (sessions, discovery_sessions, sessions_per_source,
// discovery_sessions_per_source); discovery sessions ended for asking
// nothing in DiscoveryIdle (discovery_idle); WRITEs ended for data
// that stopped coming (data_timeout, Options.DataTimeout); WRITEs that
// waited for their R2Ts behind the connection's earlier ones, holding no
// buffer meanwhile (writes_waited, Options.SolicitedWrites);
// and receivers that stopped reading while their address's commands held
// its share of the LU workers (working_per_source). A count that grows
// is a host at a bound: one misbehaving, or one that needs it raised.
func (s *Server) BoundsHit() map[string]uint64 {
	return map[string]uint64{
		"logins_per_source":             uint64(s.refused.Load()),
		"logins":                        s.refusedAll.Load(),
		"logins_setup_evicted":          s.setupsEvicted.Load(),
		"login_timeout":                 uint64(s.loginTimeouts.Load()),
		"sessions":                      s.sessionsFull.Load(),
		"discovery_sessions":            s.discoveryFull.Load(),
		"discovery_sessions_per_source": s.sourceDiscoveryFull.Load(),
		"discovery_idle":                s.discoveryIdle.Load(),
		"data_timeout":                  s.dataTimeouts.Load(),
		"writes_waited":                 s.writesWaited.Load(),
		"sessions_per_source":           s.sourceSessionsFull.Load(),
		"working_per_source":            s.sourceWaits.Load(),
	}
}

// LoginFailures counts failed logins by status class (RFC 7143 §11.13.5):
// index 1 redirection, 2 initiator error, 3 target error.
func (s *Server) LoginFailures() [4]uint64 {
	var out [4]uint64
	for i := range out {
		out[i] = s.loginFailures[i].Load()
	}
	return out
}

// DropSession closes every connection of the session whose ID
// (scsitarget.SessionInfo: the TSIH in decimal) is id — an administrator's
// decision; the initiator may log in again. It reports whether the session
// existed.
func (s *Server) DropSession(id string) bool {
	tsih, err := strconv.ParseUint(id, 10, 16)
	if err != nil {
		return false
	}
	s.mu.Lock()
	found := s.sessions[uint16(tsih)]
	s.mu.Unlock()
	if found == nil {
		return false
	}
	found.close("dropped by the administrator")
	return true
}

// Sessions returns a snapshot of the active sessions, for administration.
func (s *Server) Sessions() []scsitarget.SessionInfo {
	s.mu.Lock()
	list := make([]*session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		list = append(list, ss)
	}
	s.mu.Unlock()
	sort.Slice(list, func(i, j int) bool { return list[i].tsih < list[j].tsih })
	out := make([]scsitarget.SessionInfo, 0, len(list))
	for _, ss := range list {
		out = append(out, ss.info())
	}
	return out
}

// defaultMaxWorkingPerSource is Options.MaxWorkingPerSource's default: a
// quarter of the detached answers an LU allows at least (1024), and 8
// connections at their maxWorking.
const defaultMaxWorkingPerSource = 256

// source is what the connections from one address share (Server.sources).
type source struct {
	addr  string
	limit int32
	refs  int // connections; Server.mu

	working atomic.Int32  // the connections' commands on LU workers
	waiting atomic.Int32  // receivers waiting for working to fall
	mu      sync.Mutex    // a leaf: guards free
	free    chan struct{} // closed when working falls to limit
	waits   atomic.Int64  // times a receiver waited (its warnings are thinned)
}

// joinSource counts a connection from addr among its source's (s.mu
// held).
func (s *Server) joinSource(addr string) *source {
	src := s.sources[addr]
	if src == nil {
		if s.sources == nil {
			s.sources = map[string]*source{}
		}
		src = &source{addr: addr, limit: int32(s.opts.MaxWorkingPerSource), free: make(chan struct{})}
		s.sources[addr] = src
	}
	src.refs++
	return src
}

// leaveSource ends a connection's place in its source (s.mu held).
func (s *Server) leaveSource(src *source) {
	if src == nil {
		return
	}
	if src.refs--; src.refs <= 0 {
		delete(s.sources, src.addr)
	}
}

// add counts a command handed to an LU's worker.
func (src *source) add() {
	if src != nil {
		src.working.Add(1)
	}
}

// done counts a worker's command answered, waking the receivers that wait
// once the count is back within the limit.
func (src *source) done() {
	if src == nil {
		return
	}
	if src.working.Add(-1) <= src.limit && src.waiting.Load() > 0 {
		src.mu.Lock()
		close(src.free)
		src.free = make(chan struct{})
		src.mu.Unlock()
	}
}

// over reports whether the source's commands on workers exceed its limit
// (never, without a source).
func (src *source) over() bool {
	return src != nil && src.working.Load() > src.limit
}

// wait blocks while the source is over its limit (or until stop is
// closed); it reports whether it waited.
func (src *source) wait(stop <-chan struct{}) bool {
	if !src.over() {
		return false
	}
	src.waiting.Add(1)
	defer src.waiting.Add(-1)
	src.mu.Lock()
	free := src.free
	src.mu.Unlock()
	// Checked again once free is ours: a done between the first check
	// and here closed the channel before it, and would wake no one.
	if !src.over() {
		return false
	}
	select {
	case <-free:
	case <-stop:
	}
	return true
}
