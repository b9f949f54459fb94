// Package node assembles a running blockwire from a configuration: the
// SCSI targets and their backends, the iSCSI, iSER and SRP fabrics on their
// portals, the administration API, the metrics and iSNS registration. It is
// the one place where the layers meet (docs/architecture.md); the command
// line only turns flags and files into a config.Config and calls it.
//
//	n, err := node.New(cfg, node.Options{Logger: log})
//	err = n.Start()
//	changes, err := n.Apply(newCfg) // SIGHUP, admin reload
//	n.Sessions()                    // every fabric's
//	err = n.Shutdown(ctx)
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blockwire/blockwire/admin"
	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/datamover/iser"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/internal/httpguard"
	"github.com/blockwire/blockwire/internal/persource"
	"github.com/blockwire/blockwire/internal/sockpoll"
	"github.com/blockwire/blockwire/iscsi/iscsitarget"
	"github.com/blockwire/blockwire/isns"
	"github.com/blockwire/blockwire/metrics"
	"github.com/blockwire/blockwire/nvme/nvmetarget"
	"github.com/blockwire/blockwire/nvme/tcptarget"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/roce"
	"github.com/blockwire/blockwire/rdma/siw"
	"github.com/blockwire/blockwire/rdma/verbs"
	"github.com/blockwire/blockwire/scsitarget"
	"github.com/blockwire/blockwire/srp"
	"github.com/blockwire/blockwire/srp/srptarget"
)

// Options are what a configuration file does not say: where the node logs
// and the surfaces only a command line sets up.
type Options struct {
	Logger *slog.Logger
	// ConfigFile is the file Reload reads and Save writes by default
	// (SIGHUP, the administration API); empty: Reload fails and Save
	// needs a path.
	ConfigFile string
	// StateFile is where the node records what it serves, before every
	// change takes effect (docs/operations.md): the configuration file
	// as last applied and the administration API's changes on top of it.
	// At start, a state that exists is merged with the configuration
	// (Reload's merge). Empty: changes last only until the process ends.
	StateFile string
	// StrictSecrets refuses a configuration whose CHAP secrets group or
	// others can read (config.SecretExposure); without it each is a
	// warning in the log.
	StrictSecrets bool
	// RequireHeaderDigest and RequireDataDigest make CRC32C the only
	// iSCSI digest accepted (RFC 7143 §13.1).
	RequireHeaderDigest, RequireDataDigest bool
	// AdminHTTP serves the administration API over HTTP on this loopback
	// host:port too, guarded by admin.Protect with a per-run token
	// written to AdminTokenFile (mode 0600; removed at Shutdown).
	AdminHTTP, AdminTokenFile string
	// MetricsToken, when set, must be sent by every metrics scrape as a
	// bearer token.
	MetricsToken string
	// RoCEUDPPort is the software RoCEv2 devices' UDP port when the
	// configuration sets none (default 4791, RoCEv2's).
	RoCEUDPPort int
	// Backend, when set, is asked first for the storage of every LUN the
	// node builds (from the configuration, a reload or the administration
	// API): a program that embeds the node serves its own storage this
	// way. A nil result with no error leaves the LUN to the built-in
	// backends (memory, file, RBD, remote); an error fails the LUN as
	// theirs would. The LU owns what it returns and closes it
	// (backend.Closer) when the LUN goes.
	Backend BackendOpener
}

// BackendOpener opens the storage of a target's LUN (Options.Backend).
type BackendOpener func(target string, lun config.LUN) (backend.Backend, error)

// Portal is a portal as it runs: the address it was given and the one it
// got (a port 0 picks a free port).
type Portal struct {
	Transport string // config.ISCSI, config.ISERRoCE, config.SRP, config.SRPRoCE, config.NVMeTCP
	Address   string
}

// Node is a running blockwire.
type Node struct {
	opts   Options
	log    *slog.Logger
	budget *blockcore.IOBudget
	iscsi  *iscsitarget.Server
	iwarp  *siw.Fabric
	// iserPortal, when set, makes the iSCSI portals take iSER over the
	// software iWARP device too.
	iserPortal *fabric.ISERPortal
	srpPD      *rdma.PD
	memory     rdma.Memory // a kernel RDMA device's, for task buffers (nil: Go's)

	// Lock order: mu, then the iSCSI server's and the SRP ports' and
	// servers' own locks (AddTarget, UpdateTarget, Add, Sessions). mu
	// serializes configuration changes and is held while they open
	// backends; no fabric's I/O path takes it (SRP logins read the ACL
	// under it).
	mu      sync.Mutex
	cfg     *config.Config
	base    *config.Config // the configuration file as last applied (merge's base)
	devices []*scsitarget.Device
	srp     map[string]*srptarget.Server // by target name
	srpOn   []srpPortal
	// NVMe: the controller model, its NVMe/TCP server, the targets served
	// as subsystems (by target name), the nvme-tcp portals, and who may
	// read the discovery log.
	nvme     *nvmetarget.Target
	nvmeSrv  *tcptarget.Server
	nvmeSubs map[string]*nvmeSub
	nvmeOn   []nvmePortal
	nvmeDisc atomic.Pointer[config.Target]
	poll     *sockpoll.Group          // the TCP readers' polling (serve --poll; restart to change)
	roce     map[string]*roce.Device  // by local address
	verbs    map[string]*verbs.Device // kernel RDMA devices, by name
	iocs     map[string]bool          // IOC service IDs listened to, per RoCE device
	portals  []Portal
	bound    map[string]string // iSCSI portal address as configured → as bound
	pending  []func()          // iSCSI portals' accept loops, started once access is set
	tcp      []net.Listener
	https    []*http.Server
	limits   []*httpguard.Limited // the control surfaces' listeners (BoundsHit)
	sources  persource.Sources    // what one peer is to the per-source bounds (Limits.SourcePrefixV6)
	cleanup  []func()             // at Shutdown, last first
	started  bool
	stopped  bool
	stopc    chan struct{} // closed at Shutdown

	errc    chan error // a portal that failed
	wg      sync.WaitGroup
	isnsEnd func()
}

// srpPortal is one SRP portal: its listeners route logins to the target
// ports it serves.
type srpPortal struct {
	portal config.Portal
	ports  *srptarget.Ports
	addr   string       // as bound
	dev    *roce.Device // srp-roce: the device, for the targets' IOC service IDs
}

// New builds the targets a configuration describes (opening their
// backends) without serving them: Start opens the portals.
func New(cfg *config.Config, opts Options) (*Node, error) {
	base := cfg // what the file says, where there is one: the next reload's base
	if opts.ConfigFile != "" {
		file, err := config.Load(opts.ConfigFile)
		if err != nil {
			return nil, err
		}
		base = file
	}
	var st *state
	if opts.StateFile != "" {
		var err error
		if st, err = loadState(opts.StateFile); err != nil {
			return nil, fmt.Errorf("%w (move it aside to start from the configuration alone)", err)
		}
	}
	if st != nil {
		merged, conflicts := merge(st.Base, st.Running, cfg)
		if len(conflicts) > 0 {
			return nil, fmt.Errorf("the configuration and the changes recorded in the node's state %s disagree: %s — make the configuration say what should run, or move the state aside to start from the configuration alone",
				opts.StateFile, strings.Join(conflicts, "; "))
		}
		cfg = merged
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if exposed := cfg.SecretExposure(opts.ConfigFile); len(exposed) > 0 {
		if opts.StrictSecrets {
			return nil, fmt.Errorf("refused (--strict-secrets): %s", strings.Join(exposed, "; "))
		}
		for _, w := range exposed {
			opts.Logger.Warn("a CHAP secret others can read", "what", w)
		}
	}
	cfg = cfg.Clone()
	// The node-wide settings as they apply: each the file leaves unset at
	// its declared default (config.Settings).
	set := cfg.WithDefaults()
	if opts.RoCEUDPPort == 0 {
		opts.RoCEUDPPort = set.ROCEUDPPort
	}
	lim := set.Limits
	// What one peer is to every per-source bound, on every fabric and
	// control surface alike.
	sources := persource.Sources{V6Bits: lim.SourcePrefixV6}
	ioB, sessB, err := lim.Budgets()
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	n := &Node{opts: opts, log: log, cfg: cfg, base: base.Clone(), srp: map[string]*srptarget.Server{}, roce: map[string]*roce.Device{}, verbs: map[string]*verbs.Device{}, iocs: map[string]bool{}, bound: map[string]string{},
		// One I/O buffer budget for every fabric (iSCSI, iSER, SRP).
		budget: blockcore.NewIOBudget(ioB, sessB),
		// One polling group for every TCP reader (iSCSI and NVMe): they
		// share the cores, and each holds back its polling while
		// another has just gone to sleep (sockpoll.Group).
		poll: sockpoll.NewGroup(cfg.Poll),
		// A stream that takes under 64 KiB in the NOP timeout fails its
		// queue pair: iSER and SRP connections are bounded like TCP ones.
		iwarp:   siw.New(siw.Options{Logger: log, SendTimeout: lim.NopTimeout, Sources: sources}),
		sources: sources,
		srpPD:   rdma.NewDevice("blockwire-srp").AllocPD(),
		errc:    make(chan error, 1), stopc: make(chan struct{})}
	io := iscsitarget.Options{
		LoginTimeout: lim.LoginTimeout, NopInterval: lim.NopInterval, NopTimeout: lim.NopTimeout,
		MaxSessions: lim.MaxSessions, MaxSessionsPerSource: lim.MaxSessionsPerSource, MaxWorkingPerSource: lim.MaxWorkingPerSource, MaxConnections: lim.MaxConnections, MaxDiscoverySessions: lim.MaxDiscoverySessions,
		MaxLoginsPerSource: lim.MaxLoginsPerSource, Sources: sources, CmdWindow: uint32(lim.CmdWindow),
		MaxRecvDataSegmentLength: lim.MaxRecvDataSegmentLength, Budget: n.budget,
		RequireHeaderDigest: opts.RequireHeaderDigest, RequireDataDigest: opts.RequireDataDigest,
	}
	for _, t := range cfg.Targets {
		for _, l := range t.LUNs {
			// What this node is to the iSER-on-InfiniBand draft's iSER connection preference.
			io.Gateway = io.Gateway || l.Remote != ""
			io.EndNode = io.EndNode || l.Remote == ""
		}
	}
	// Kernel RDMA devices under the RDMA/CM portals are opened now: the
	// task buffers come from the first one's registered memory, so iSER
	// and SRP move them with no copy.
	for _, p := range cfg.AllPortals() {
		if p.Transport != config.ISERRoCE && p.Transport != config.SRPRoCE {
			continue
		}
		vd, err := n.verbsDevice(p.Address)
		if err != nil {
			n.closeVerbs()
			return nil, err
		}
		if vd != nil && io.Memory == nil {
			io.Memory = vd.Memory()
			n.memory = vd.Memory()
		}
	}
	if cfg.ISER == nil || *cfg.ISER {
		// One port for iSCSI/TCP and iSER: the first byte tells them
		// apart (an MPA Request or a Login PDU; fabric.Portal).
		n.iserPortal = &fabric.ISERPortal{IWARP: n.iwarp, PD: rdma.NewDevice("blockwire").AllocPD()}
	}
	n.iscsi = iscsitarget.NewServer(log, io)
	n.newNVMe()
	if err := setDiscovery(n.iscsi, cfg.Discovery); err != nil {
		return nil, err
	}
	for i := range cfg.Targets {
		if err := n.addTarget(cfg, i); err != nil {
			n.closeDevices()
			n.closeVerbs()
			return nil, err
		}
	}
	if st != nil {
		// The state's base is the file as it is now. A state that cannot
		// be written does not stop the node serving what it recorded;
		// every change will say so until it can.
		if err := n.record(n.base, n.cfg); err != nil {
			log.Warn("the node's state could not be brought up to date: changes are refused until it can be written", "err", err)
		}
	}
	return n, nil
}

// addTarget builds target i of cfg and serves it on every fabric the node
// runs. Called with mu held (or before Start).
func (n *Node) addTarget(cfg *config.Config, i int) error {
	tc := cfg.Targets[i]
	dev, t, err := buildTarget(tc, n.iscsiPortals(cfg, tc), n.opts.Backend, cfg.Poll, n.log)
	if err != nil {
		return err
	}
	if err := n.iscsi.AddTarget(t); err != nil {
		dev.Close()
		return err
	}
	n.devices = append(n.devices, dev)
	for _, l := range dev.LUNs() {
		lu := dev.LU(l)
		n.log.Info("lun ready", "target", t.Name, "lun", l, "blocks", lu.Blocks(), "block_size", lu.BlockSize(), "read_only", lu.ReadOnly())
	}
	if slices.Contains(cfg.SRPTargets(), i) {
		if err := n.addSRP(cfg, i, dev); err != nil {
			n.removeTarget(tc.Name)
			return err
		}
	}
	if slices.Contains(cfg.NVMeTargets(), i) {
		if err := n.addNVMe(cfg, i, dev); err != nil {
			n.removeTarget(tc.Name)
			return err
		}
	}
	return nil
}

// addSRP makes target i an SRP target port on the SRP portals that serve
// it.
func (n *Node) addSRP(cfg *config.Config, i int, dev *scsitarget.Device) error {
	tc := cfg.Targets[i]
	hi, lo, err := cfg.SRPPortID(i)
	if err != nil {
		return err
	}
	name := tc.Name
	if tc.Protected() && !tc.SRPListed() {
		n.log.Warn("target has an ACL or CHAP but no SRP initiators: SRP logins to it are refused", "target", name)
	}
	s := srptarget.New(srptarget.Options{PD: n.srpPD, Memory: n.memory, Device: dev, IDExt: hi, IOCGUID: lo,
		Logger: n.log.With("target", name), Budget: n.budget, Sources: n.sources,
		// The target's SRP ACL as it is now (reloads and the admin API
		// change it): SRP has no CHAP, so a protected target admits only
		// the ports listed (config.Target.SRPAllows).
		Allow:  func(id srp.PortID, remote net.Addr) bool { return n.srpAllows(name, id, remote) },
		LUNMap: func(id srp.PortID) map[uint64]uint64 { return n.srpLUNMap(name, id) }})
	n.srp[name] = s
	for _, sp := range n.srpOn {
		if err := n.servePort(sp, s, name, hi, lo); err != nil {
			n.dropSRP(name)
			return err
		}
	}
	return nil
}

// servePort puts a target's SRP port on an SRP portal that serves it; on
// a RoCE device also as an InfiniBand I/O controller: REQs to the target's
// IOC GUID as service ID carry the whole SRP_LOGIN_REQ (the SRP InfiniBand annex §A.2), as
// Linux ib_srpt takes them — once per device and GUID.
func (n *Node) servePort(sp srpPortal, s *srptarget.Server, name string, hi, lo uint64) error {
	if !sp.portal.Serves(name) {
		return nil
	}
	if err := sp.ports.Add(s); err != nil {
		return err
	}
	if key := fmt.Sprintf("%p/%x", sp.dev, lo); sp.dev != nil && !n.iocs[key] {
		sl, err := sp.dev.ListenService(lo)
		if err != nil {
			sp.ports.Remove(s)
			return err
		}
		n.iocs[key] = true
		n.serve("SRP service "+fmt.Sprintf("%016x", lo), func() error { return sp.ports.Serve(sl) })
	}
	n.log.Info("serving SRP", "target", name, "transport", sp.portal.Transport, "portal", sp.addr,
		"url", fmt.Sprintf("srp://%s/%016x:%016x/0", sp.addr, hi, lo))
	return nil
}

// dropSRP removes a target's SRP port: logins stop, its channels are
// logged out.
func (n *Node) dropSRP(name string) {
	s := n.srp[name]
	if s == nil {
		return
	}
	for _, sp := range n.srpOn {
		sp.ports.Remove(s)
	}
	delete(n.srp, name)
	s.Close()
}

// removeTarget stops serving a target on every fabric and closes its
// backends. Called with mu held.
func (n *Node) removeTarget(name string) error {
	if err := n.iscsi.RemoveTarget(name); err != nil {
		return err
	}
	n.dropSRP(name)
	n.dropNVMe(name)
	if d := n.device(name); d != nil {
		d.Close()
		n.devices = slices.DeleteFunc(n.devices, func(x *scsitarget.Device) bool { return x == d })
	}
	return nil
}

// iscsiPortals are the iSCSI portal addresses a target is reachable on
// (iscsi/iscsitarget.Target.Portals): nil for all, else those of its own
// portals list that a portal serving it has — an empty list when none
// does. A portal's address is the one it was bound to once it has been
// (a configured port 0 becomes the port it got).
func (n *Node) iscsiPortals(cfg *config.Config, tc config.Target) []string {
	on, restricted := []string{}, false
	for _, p := range cfg.AllPortals() {
		if p.Transport != config.ISCSI && p.Transport != config.ISERRoCE {
			continue
		}
		if !p.Serves(tc.Name) {
			restricted = true
			continue
		}
		a := p.Address
		if b, ok := n.bound[a]; ok {
			a = b
		}
		on = append(on, a)
	}
	own := tc.Portals
	if len(own) == 0 {
		own = nil // portals = [] in a file: no restriction, as documented
	}
	switch {
	case !restricted:
		return own
	case own == nil:
		return on
	}
	return slices.DeleteFunc(slices.Clone(own), func(a string) bool { return !slices.Contains(on, a) })
}

// Start opens the portals, the administration API, the metrics endpoint
// and iSNS registration the configuration names. On an error everything
// it opened is closed again.
func (n *Node) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.started {
		return errors.New("node: already started")
	}
	n.started = true
	if err := n.start(); err != nil {
		n.mu.Unlock()
		n.Shutdown(context.Background())
		n.mu.Lock()
		return err
	}
	return nil
}

func (n *Node) start() error {
	// The API and the metrics first: once a portal accepts, the whole
	// node is up.
	if err := n.startAdmin(); err != nil {
		return err
	}
	if err := n.startMetrics(); err != nil {
		return err
	}
	cfg := n.cfg
	for _, p := range cfg.AllPortals() {
		var err error
		switch p.Transport {
		case config.ISCSI:
			err = n.startISCSI(p)
		case config.ISERRoCE:
			err = n.startISERRoCE(p)
		case config.SRP, config.SRPRoCE:
			err = n.startSRP(p)
		case config.NVMeTCP:
			err = n.startNVMe(p)
		}
		if err != nil {
			return fmt.Errorf("%s portal %s: %w", p.Transport, p.Address, err)
		}
	}
	// The iSCSI portals are bound: the targets' portal restrictions name
	// the addresses they got, before any of them accepts.
	for _, tc := range n.cfg.Targets {
		t, err := targetAccess(tc, n.iscsiPortals(n.cfg, tc))
		if err == nil {
			err = n.iscsi.UpdateTarget(t)
		}
		if err != nil {
			return fmt.Errorf("target %s: %w", tc.Name, err)
		}
	}
	for _, run := range n.pending {
		run()
	}
	n.pending = nil
	if len(n.tcp) > 0 && !slices.ContainsFunc(n.tcp, func(l net.Listener) bool {
		ta, ok := l.Addr().(*net.TCPAddr)
		return !ok || !ta.IP.IsLoopback()
	}) {
		n.log.Info("serving on loopback only; use --listen ADDR:PORT to reach other hosts")
	}
	if cfg.ISNS != "" {
		host, _ := os.Hostname()
		var nodes []isns.Node
		for _, t := range cfg.Targets {
			tpgt := t.TPGT
			if tpgt == 0 {
				tpgt = 1
			}
			nodes = append(nodes, isns.Node{Name: t.Name, Alias: t.Alias, TPGT: tpgt})
		}
		c := &isns.Client{Server: cfg.ISNS, EntityID: "blockwire:" + host, Nodes: nodes, Portals: portalAddrs(n.tcp, n.log), Log: n.log}
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); c.Run(ctx) }()
		n.isnsEnd = func() { stop(); <-done }
	}
	return nil
}

// serve runs a portal's accept loop; its failure ends the node (Err).
func (n *Node) serve(what string, run func() error) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := run(); err != nil {
			select {
			case n.errc <- fmt.Errorf("%s: %w", what, err):
			default:
			}
		}
	}()
}

func (n *Node) startISCSI(p config.Portal) error {
	l, err := net.Listen("tcp", p.Address)
	if err != nil {
		return err
	}
	n.tcp = append(n.tcp, l)
	n.bound[p.Address] = l.Addr().String()
	n.portals = append(n.portals, Portal{Transport: p.Transport, Address: l.Addr().String()})
	a := fabric.TCP(l)
	if n.iserPortal != nil {
		a = fabric.Portal(l, *n.iserPortal)
	}
	a.Poll = n.poll
	n.pending = append(n.pending, func() { n.serve("iSCSI portal "+p.Address, func() error { return n.iscsi.Serve(a) }) })
	return nil
}

// roceDevice returns the software RoCEv2 device of a portal's local
// address, opening it on first use: the iSER and SRP portals on one
// address share it (they would fight over its UDP port).
func (n *Node) roceDevice(addr string) (*roce.Device, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if d := n.roce[host]; d != nil {
		return d, nil
	}
	port := n.cfg.ROCEUDPPort
	if port == 0 {
		port = n.opts.RoCEUDPPort
	}
	d, err := roce.Open(host, roce.Options{Port: port, Logger: n.log, Sources: n.sources, NoGSO: n.cfg.ROCEGSO != nil && !*n.cfg.ROCEGSO, Poll: n.cfg.Poll})
	if err != nil {
		return nil, err
	}
	n.roce[host] = d
	n.cleanup = append(n.cleanup, func() { d.Close() })
	return d, nil
}

func (n *Node) startISERRoCE(p config.Portal) error {
	l, pd, _, err := n.rdmaListen(p.Address)
	if err != nil {
		return err
	}
	n.bound[p.Address] = l.Addr().String()
	n.portals = append(n.portals, Portal{Transport: p.Transport, Address: l.Addr().String()})
	// A RoCE listener that fails is logged, not fatal (the TCP portals go
	// on); the iSCSI server closes it at Shutdown.
	n.pending = append(n.pending, func() {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.keepRDMA(p.Address, "iSER over RDMA/CM", l, pd, func(l rdma.Listener, pd *rdma.PD) error {
				return n.iscsi.Serve(fabric.ISER(l, pd, iser.Options{Logger: n.log}))
			})
		}()
		n.log.Info("serving iSER over RDMA/CM", "portal", p.Address, "device", pd.Device().Name())
	})
	return nil
}

// keepRDMA serves an RDMA/CM portal's listener. When the kernel RDMA
// device under it goes away (rdma link delete, a NIC reset), its
// connections have ended (each with a log line) and the portal waits for
// the device to come back, then listens again; the other portals go on.
func (n *Node) keepRDMA(addr, what string, l rdma.Listener, pd *rdma.PD, serve func(rdma.Listener, *rdma.PD) error) {
	for {
		err := serve(l, pd)
		if err == nil {
			return
		}
		if !errors.Is(err, verbs.ErrDeviceRemoved) {
			n.log.Error(what, "portal", addr, "device", pd.Device().Name(), "err", err)
			return
		}
		name := pd.Device().Name()
		n.log.Error(what+": the RDMA device is gone; the portal waits for it to come back", "portal", addr, "device", name)
		n.dropVerbs(name)
		for {
			select {
			case <-n.stopc:
				return
			case <-time.After(time.Second):
			}
			vd, err := n.reopenVerbs(name)
			if err != nil {
				continue
			}
			if l, err = vd.Listen(addr); err != nil {
				continue
			}
			pd = vd.PD()
			n.log.Info(what+": the RDMA device is back; serving again", "portal", addr, "device", name)
			break
		}
	}
}

// dropVerbs forgets a removed kernel RDMA device and frees what is left
// of it.
func (n *Node) dropVerbs(name string) {
	n.mu.Lock()
	d := n.verbs[name]
	delete(n.verbs, name)
	n.mu.Unlock()
	if d != nil {
		d.Close()
	}
}

// reopenVerbs opens a kernel RDMA device again after it was removed.
func (n *Node) reopenVerbs(name string) (*verbs.Device, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.openVerbs(name)
}

// rdmaListen listens for RDMA/CM connections on addr: on the kernel RDMA
// device rdma_device chooses for it (verbsDevice), else on the software
// RoCEv2 device of its IP address (returned too: it serves SRP I/O
// controller service IDs). pd is the listener's protection domain.
func (n *Node) rdmaListen(addr string) (rdma.Listener, *rdma.PD, *roce.Device, error) {
	vd, err := n.verbsDevice(addr)
	if err != nil {
		return nil, nil, nil, err
	}
	if vd != nil {
		l, err := vd.Listen(addr)
		return l, vd.PD(), nil, err
	}
	d, l, err := n.roceListen(addr)
	if err != nil {
		return nil, nil, nil, err
	}
	return l, d.RDMA().AllocPD(), d, nil
}

// verbsDevice is the kernel RDMA device for an RDMA/CM portal's address
// (config rdma_device), opened on first use; nil means the software
// RoCEv2 device.
func (n *Node) verbsDevice(addr string) (*verbs.Device, error) {
	name := n.cfg.RDMADevice
	switch name {
	case "soft":
		return nil, nil
	case "", "auto":
		if !verbs.Supported {
			return nil, nil
		}
		var err error
		if name, err = verbs.DeviceFor(addr); err != nil || name == "" {
			return nil, nil
		}
	}
	d, err := n.openVerbs(name)
	if err != nil {
		return nil, fmt.Errorf("RDMA device for %s: %w", addr, err)
	}
	return d, nil
}

// openVerbs returns the named kernel RDMA device, opening it on first use
// (rdma_memory was validated: it parses). Called with mu held, or before
// Start.
func (n *Node) openVerbs(name string) (*verbs.Device, error) {
	if d := n.verbs[name]; d != nil {
		return d, nil
	}
	mem, _ := config.ParseSize(n.cfg.WithDefaults().RDMAMemory)
	d, err := verbs.Open(name, verbs.Options{MaxMemory: int(mem), Logger: n.log})
	if err != nil {
		return nil, err
	}
	n.log.Info("RDMA device", "device", d.Info().String())
	n.verbs[name] = d
	return d, nil
}

// closeVerbs closes the kernel RDMA devices (at Shutdown, after every
// connection on them).
func (n *Node) closeVerbs() {
	for name, d := range n.verbs {
		d.Close()
		delete(n.verbs, name)
	}
}

// roceListen listens on addr on the software RoCEv2 device of its IP
// address (roceDevice).
func (n *Node) roceListen(addr string) (*roce.Device, rdma.Listener, error) {
	d, err := n.roceDevice(addr)
	if err != nil {
		return nil, nil, err
	}
	l, err := d.Listen(addr)
	return d, l, err
}

// startSRP opens an SRP portal and puts on it the target ports it serves.
func (n *Node) startSRP(p config.Portal) error {
	sp := srpPortal{portal: p, ports: srptarget.NewPorts(n.log)}
	n.cleanup = append(n.cleanup, func() { sp.ports.Close() })
	var l rdma.Listener
	var pd *rdma.PD
	var err error
	if p.Transport == config.SRP {
		l, err = n.iwarp.Listen(p.Address)
	} else {
		l, pd, sp.dev, err = n.rdmaListen(p.Address)
	}
	if err != nil {
		return err
	}
	sp.addr = l.Addr().String()
	n.srpOn = append(n.srpOn, sp)
	n.portals = append(n.portals, Portal{Transport: p.Transport, Address: sp.addr})
	if pd != nil && pd.Memory() != nil {
		// A kernel RDMA device: the portal outlives its removal.
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.keepRDMA(p.Address, "SRP over RDMA/CM", l, pd, func(l rdma.Listener, _ *rdma.PD) error { return sp.ports.Serve(l) })
		}()
		n.log.Info("serving SRP over RDMA/CM", "portal", p.Address, "device", pd.Device().Name())
	} else {
		n.serve("SRP portal "+p.Address, func() error { return sp.ports.Serve(l) })
	}
	for i, t := range n.cfg.Targets {
		if s := n.srp[t.Name]; s != nil {
			hi, lo, _ := n.cfg.SRPPortID(i)
			if err := n.servePort(sp, s, t.Name, hi, lo); err != nil {
				return err
			}
		}
	}
	return nil
}

// startAdmin serves the administration API on the configuration's Unix
// socket and on Options.AdminHTTP.
func (n *Node) startAdmin() error {
	h := admin.Handler(admin.Options{Control: n.Admin(), Dirs: n.cfg.AdminDirs})
	if path := n.cfg.AdminSocket; path != "" {
		al, err := listenAdminSocket(path)
		if err != nil {
			return fmt.Errorf("admin socket: %w", err)
		}
		n.httpServe(al, h) // closing the listener removes the socket
		n.log.Info("administration API", "socket", path)
	}
	if a := n.opts.AdminHTTP; a != "" {
		// Loopback only, and guarded against what a browser on this
		// host can be made to send (admin.Protect): Host, Origin, JSON
		// only, and the per-run token in a file only this user reads.
		hl, err := net.Listen("tcp", a)
		if err == nil {
			if ta, ok := hl.Addr().(*net.TCPAddr); !ok || !ta.IP.IsLoopback() {
				hl.Close()
				err = errors.New("not a loopback address")
			}
		}
		if err != nil {
			return fmt.Errorf("admin HTTP: %w", err)
		}
		if n.opts.AdminTokenFile == "" {
			hl.Close()
			return errors.New("admin HTTP: no token file")
		}
		token, err := writeToken(n.opts.AdminTokenFile)
		if err != nil {
			hl.Close()
			return fmt.Errorf("admin HTTP: %w", err)
		}
		n.cleanup = append(n.cleanup, func() { os.Remove(n.opts.AdminTokenFile) })
		n.httpServe(hl, admin.Protect(h, hl.Addr().String(), token))
		n.log.Info("administration API", "url", "http://"+hl.Addr().String(), "token_file", n.opts.AdminTokenFile)
	}
	return nil
}

func (n *Node) startMetrics() error {
	if n.cfg.Metrics == "" {
		return nil
	}
	ml, err := net.Listen("tcp", n.cfg.Metrics)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	if metricsExposed(ml.Addr(), n.opts.MetricsToken) {
		n.log.Warn("metrics on a non-loopback address without a token: anyone who reaches it reads every target's and initiator's name; give --metrics-token-file or listen on loopback",
			"metrics", ml.Addr().String())
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics.Protect(metrics.Handler(metrics.New(n)), ml.Addr().String(), n.opts.MetricsToken))
	n.httpServe(ml, mux)
	n.portals = append(n.portals, Portal{Transport: "metrics", Address: ml.Addr().String()})
	n.log.Info("serving metrics", "url", "http://"+ml.Addr().String()+"/metrics")
	return nil
}

// httpServe serves a control surface on l: its connections bounded per
// client address and in all, none held idle for ever (httpguard).
func (n *Node) httpServe(l net.Listener, h http.Handler) {
	hs := httpguard.NewServer(h)
	n.https = append(n.https, hs)
	lim := httpguard.Limit(l, n.sources, httpguard.PerSource, httpguard.Total)
	n.limits = append(n.limits, lim)
	go hs.Serve(lim)
}

// Portals returns the portals being served, with the addresses they got.
func (n *Node) Portals() []Portal {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.portals)
}

// Err reports a portal that stopped accepting; the node should then be
// shut down.
func (n *Node) Err() <-chan error { return n.errc }

// Shutdown deregisters from iSNS, logs SRP channels out, asks iSCSI
// initiators to log out and waits (up to ctx) for them, then closes the
// devices, the API and metrics listeners and the backends.
func (n *Node) Shutdown(ctx context.Context) error {
	n.mu.Lock()
	if n.stopped {
		n.mu.Unlock()
		return nil
	}
	n.stopped = true
	close(n.stopc)
	isnsEnd := n.isnsEnd
	srps := make([]*srptarget.Server, 0, len(n.srp))
	for _, s := range n.srp {
		srps = append(srps, s)
	}
	ports := slices.Clone(n.srpOn)
	n.mu.Unlock()
	if isnsEnd != nil {
		isnsEnd() // deregister first: no new initiators
	}
	for _, sp := range ports {
		sp.ports.Close()
	}
	for _, s := range srps {
		s.Close() // SRP_T_LOGOUT to every channel
	}
	n.nvmeSrv.Close()
	err := n.iscsi.Shutdown(ctx)
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	n.wg.Wait()
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, hs := range n.https {
		hs.Close()
	}
	for _, f := range slices.Backward(n.cleanup) {
		f()
	}
	n.closeDevices()
	n.closeVerbs()
	return err
}

func (n *Node) closeDevices() {
	for _, d := range n.devices {
		if err := d.Close(); err != nil {
			n.log.Error("closing backends", "target", d.Name(), "err", err)
		}
	}
	n.devices = nil
}

// Devices returns the targets' SCSI devices (admin.Control, metrics).
func (n *Node) Devices() []*scsitarget.Device {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.devices)
}

// Sessions returns every fabric's sessions: iSCSI and iSER sessions, and
// SRP I_T nexuses.
func (n *Node) Sessions() []scsitarget.SessionInfo {
	out := n.iscsi.Sessions()
	for _, s := range n.srpServers() {
		out = append(out, s.Sessions()...)
	}
	return append(out, n.nvmeSessions()...)
}

// DropSession ends the session with this ID (scsitarget.SessionInfo.ID).
func (n *Node) DropSession(id string) bool {
	if strings.HasPrefix(id, "nvme-") {
		return n.dropNVMeSession(id)
	}
	if strings.HasPrefix(id, "srp-") {
		for _, s := range n.srpServers() {
			if s.DropSession(id) {
				return true
			}
		}
		return false
	}
	return n.iscsi.DropSession(id)
}

// LoginFailures counts failed iSCSI logins by status class (metrics).
func (n *Node) LoginFailures() [4]uint64 { return n.iscsi.LoginFailures() }

// BoundsHit implements metrics.Source: the bounds peers met, by fabric —
// the iSCSI target's, the SRP targets' (summed), the software iWARP
// device's, the software RoCE devices' (summed) and the control surfaces'
// (admin socket, admin HTTP, metrics: summed, as "control"), and the I/O
// budget's refusals, which every fabric shares ("all"). A fabric with
// no server or device yet shows each of its bounds at 0, named by a zero
// value of its type (whose counts are zero), so the names are each
// package's alone.
func (n *Node) BoundsHit() map[string]map[string]uint64 {
	out := map[string]map[string]uint64{"iscsi": n.iscsi.BoundsHit(), "iwarp": n.iwarp.BoundsHit(),
		// The I/O budget every fabric shares: TASK SET FULL by the bound met.
		"all": n.budget.Refusals(),
		"srp": new(srptarget.Server).BoundsHit(), "roce": new(roce.Device).BoundsHit(),
		"control": new(httpguard.Limited).BoundsHit(), "nvme": n.nvmeSrv.BoundsHit()}
	for _, s := range n.srpServers() {
		for b, v := range s.BoundsHit() {
			out["srp"][b] += v
		}
	}
	n.mu.Lock()
	devs := make([]*roce.Device, 0, len(n.roce))
	for _, d := range n.roce {
		devs = append(devs, d)
	}
	for _, l := range n.limits {
		for b, v := range l.BoundsHit() {
			out["control"][b] += v
		}
	}
	n.mu.Unlock()
	for _, d := range devs {
		for b, v := range d.BoundsHit() {
			out["roce"][b] += v
		}
	}
	return out
}

func (n *Node) srpServers() []*srptarget.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srpServersLocked()
}

// srpServersLocked is srpServers with mu held.
func (n *Node) srpServersLocked() []*srptarget.Server {
	out := make([]*srptarget.Server, 0, len(n.srp))
	for _, s := range n.srp {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *srptarget.Server) int { return strings.Compare(a.PortID().String(), b.PortID().String()) })
	return out
}

// Config returns the running configuration (what Save writes).
func (n *Node) Config() *config.Config {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cfg.Clone()
}

// metricsExposed reports whether metrics at addr without a token can be
// read by anyone who reaches the host: a non-loopback address.
func metricsExposed(addr net.Addr, token string) bool {
	ta, ok := addr.(*net.TCPAddr)
	return ok && !ta.IP.IsLoopback() && token == ""
}
