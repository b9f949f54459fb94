package node

import (
	"bytes"
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/nvme/dhchap"
	"github.com/blockwire/blockwire/nvme/nvmetarget"
	"github.com/blockwire/blockwire/nvme/tcptarget"
	"github.com/blockwire/blockwire/scsi"
	"github.com/blockwire/blockwire/scsitarget"
)

// nvmeSub is a target served over NVMe: its NVM subsystem, the access
// rules it admits hosts by (an atomic copy: Connect and the namespace
// lookups of the I/O path read it without the node's lock), and its
// namespaces' units with the capacity watches on them.
type nvmeSub struct {
	sub    *nvmetarget.Subsystem
	access atomic.Pointer[nvmeAccess]
	units  map[uint32]*blockcore.Unit
	watch  map[uint32]func()
}

// nvmeAccess is a target's access rules as the NVMe paths read them:
// the target, and each masked host's namespaces worked out once (the I/O
// path asks for every command; parsing the entry's LUN list there would
// allocate per I/O).
type nvmeAccess struct {
	t    config.Target
	sees map[string]map[uint64]bool // host → the LUNs it sees; absent: every LUN
	// auth is each host's DH-HMAC-CHAP secrets, read when the rules
	// were (absent: the host need not authenticate).
	auth map[string]nvmetarget.AuthKeys
}

func newNVMeAccess(t config.Target) *nvmeAccess {
	a := &nvmeAccess{t: t, sees: map[string]map[uint64]bool{}, auth: map[string]nvmetarget.AuthKeys{}}
	for _, e := range t.ACL {
		if m, err := e.LUNMap(); e.Host != "" && err == nil && m != nil {
			a.sees[e.Host] = map[uint64]bool{}
			for l := range m {
				a.sees[e.Host][l] = true
			}
		}
		if e.Host != "" && e.DHCHAP != nil {
			a.auth[e.Host] = authKeys(&t, e.Host)
		}
	}
	return a
}

// authKeys are host's DH-HMAC-CHAP secrets in t. A secret that cannot
// be read fails closed: a random one the host cannot know (the change
// was validated; this is a file that changed since).
func authKeys(t *config.Target, host string) nvmetarget.AuthKeys {
	h, c, err := t.NVMeAuth(host)
	if err != nil {
		k := dhchap.NewSecret(32, 0)
		return nvmetarget.AuthKeys{Host: &k}
	}
	return nvmetarget.AuthKeys{Host: h, Ctrl: c}
}

// sameAuth reports whether host's secrets are the same in a and b.
func sameAuth(a, b *nvmeAccess, host string) bool {
	x, y := a.auth[host], b.auth[host]
	same := func(p, q *dhchap.Secret) bool {
		return p == nil && q == nil || p != nil && q != nil && p.Transform == q.Transform && bytes.Equal(p.Key, q.Key)
	}
	return same(x.Host, y.Host) && same(x.Ctrl, y.Ctrl)
}

// visible reports whether host sees namespace nsid (LUN nsid-1).
func (a *nvmeAccess) visible(host string, nsid uint32) bool {
	if nsid == 0 {
		return false
	}
	m, masked := a.sees[host]
	return !masked || m[uint64(nsid-1)]
}

// nvmePortal is an nvme-tcp portal as bound.
type nvmePortal struct {
	portal config.Portal
	addr   netip.AddrPort
	id     uint16
}

// newNVMe makes the node's NVMe target and its NVMe/TCP server (serving
// nothing until a portal opens).
func (n *Node) newNVMe() {
	n.nvme = nvmetarget.New(nvmetarget.Options{Logger: n.log, Portals: n.nvmeDiscoveryPortals,
		ControllersPerSource: n.cfg.WithDefaults().Limits.MaxSessionsPerSource, Sources: n.sources,
		DiscoveryAllow: func(host string, remote net.Addr) bool {
			d := n.nvmeDisc.Load()
			return d == nil || d.NVMeAllows(host, remote)
		},
		DiscoveryAuth: func(host string) nvmetarget.AuthKeys {
			if d := n.nvmeDisc.Load(); d != nil {
				return authKeys(d, host)
			}
			return nvmetarget.AuthKeys{}
		}})
	lim := n.cfg.WithDefaults().Limits
	n.nvmeSrv = tcptarget.New(tcptarget.Options{Target: n.nvme, Logger: n.log, Budget: n.budget, SetupTimeout: lim.LoginTimeout,
		Sources: n.sources,
		Poll:    n.poll})
	n.nvmeSubs = map[string]*nvmeSub{}
	n.setNVMeDiscovery(n.cfg.Discovery)
}

// setNVMeDiscovery sets who may read the discovery log: the discovery
// rules' NVMe hosts once discovery is restricted.
func (n *Node) setNVMeDiscovery(d *config.Discovery) {
	if d == nil {
		n.nvmeDisc.Store(nil)
		return
	}
	t := d.AsTarget()
	n.nvmeDisc.Store(&t)
}

// nvmeDiscoveryPortals lists the nvme-tcp portals for the discovery log,
// each with the subsystems it serves.
func (n *Node) nvmeDiscoveryPortals() []nvmetarget.Portal {
	n.mu.Lock()
	defer n.mu.Unlock()
	byNQN := map[string]string{}
	for _, t := range n.cfg.Targets {
		byNQN[t.SubsystemNQN()] = t.Name
	}
	out := make([]nvmetarget.Portal, 0, len(n.nvmeOn))
	for _, p := range n.nvmeOn {
		portal := p.portal
		out = append(out, nvmetarget.Portal{ID: p.id, Addr: p.addr, Serves: func(nqn string) bool {
			name, ok := byNQN[nqn]
			return ok && portal.Serves(name)
		}})
	}
	return out
}

// addNVMe serves target i of cfg as an NVM subsystem. mu held (or before
// Start).
func (n *Node) addNVMe(cfg *config.Config, i int, dev *scsitarget.Device) error {
	tc := cfg.Targets[i]
	ns := &nvmeSub{units: map[uint32]*blockcore.Unit{}, watch: map[uint32]func(){}}
	ns.access.Store(newNVMeAccess(tc))
	sc := nvmetarget.SubsystemConfig{NQN: tc.SubsystemNQN(), Model: "blockwire " + tc.Name,
		Allow:   func(host string, remote net.Addr) bool { return ns.access.Load().t.NVMeAllows(host, remote) },
		Visible: func(host string, nsid uint32) bool { return ns.access.Load().visible(host, nsid) },
		Auth:    func(host string) nvmetarget.AuthKeys { return ns.access.Load().auth[host] }}
	if len(tc.PortGroups) > 0 {
		// ALUA is on: NVMe reports the same state as ANA, this gateway's
		// port group's (its TPGT), and tells the hosts when it changes.
		tpgt := cmp.Or(tc.TPGT, 1)
		sc.ANA = func() nvmetarget.ANAState { return anaOf(dev.GroupState(tpgt)) }
	}
	sub, err := n.nvme.AddSubsystem(sc)
	if err != nil {
		return err
	}
	if sc.ANA != nil {
		dev.WatchALUA(sub.ANAChanged)
	}
	ns.sub = sub
	if tc.Protected() && !tc.NVMeListed() {
		n.log.Warn("target has an ACL or CHAP but no NVMe hosts: NVMe connections to it are refused", "target", tc.Name)
	}
	n.nvmeSubs[tc.Name] = ns
	n.syncNVMe(tc.Name, dev)
	n.log.Info("serving NVMe subsystem", "target", tc.Name, "nqn", sub.NQN(), "namespaces", len(ns.units))
	return nil
}

// anaOf is the ANA state of an ALUA state: standby and unavailable
// paths are inaccessible (the host keeps them, and tries them again when
// told of a change).
func anaOf(s scsi.ALUAState, ok bool) nvmetarget.ANAState {
	switch {
	case !ok, s == scsi.ActiveOptimized:
		return nvmetarget.ANAOptimized
	case s == scsi.ActiveNonOptimized:
		return nvmetarget.ANANonOptimized
	}
	return nvmetarget.ANAInaccessible
}

// syncNVMe makes a subsystem's namespaces its device's LUs (namespace ID
// = LUN + 1), sharing each LU's unit. mu held.
func (n *Node) syncNVMe(name string, dev *scsitarget.Device) {
	ns := n.nvmeSubs[name]
	if ns == nil || dev == nil {
		return
	}
	want := map[uint32]*blockcore.Unit{}
	for _, l := range dev.LUNs() {
		if l < config.MaxLUN {
			want[uint32(l)+1] = dev.LU(l).Unit()
		}
	}
	for id, u := range ns.units {
		if want[id] != u {
			ns.watch[id]()
			delete(ns.watch, id)
			delete(ns.units, id)
			ns.sub.SetNamespace(id, nil)
		}
	}
	for id, u := range want {
		if ns.units[id] == u {
			continue
		}
		ns.units[id] = u
		ns.sub.SetNamespace(id, u)
		sub, nsid := ns.sub, id
		ns.watch[id] = u.WatchCapacity(func() { sub.CapacityChanged(nsid) })
	}
}

// dropNVMe stops serving a target over NVMe: its controllers end. mu
// held.
func (n *Node) dropNVMe(name string) {
	ns := n.nvmeSubs[name]
	if ns == nil {
		return
	}
	for _, cancel := range ns.watch {
		cancel()
	}
	delete(n.nvmeSubs, name)
	n.nvme.RemoveSubsystem(ns.sub.NQN())
}

// revokeNVMe applies a target's new access rules to its live
// controllers: a host no longer admitted is disconnected at once; one
// whose view of the namespaces changed is told (namespace attribute
// notices). mu held.
func (n *Node) revokeNVMe(tc config.Target) {
	ns := n.nvmeSubs[tc.Name]
	if ns == nil {
		return
	}
	was := ns.access.Load()
	now := newNVMeAccess(tc)
	ns.access.Store(now)
	if k := ns.sub.Revoke(tc.NVMeAllows); k > 0 {
		n.log.Info("change: NVMe controllers ended", "target", tc.Name, "count", k, "why", "the target's access rules no longer admit their hosts")
	}
	// A host whose secrets changed authenticated with the old ones: its
	// controllers end, and it connects again with the new.
	if k := ns.sub.Revoke(func(host string, _ net.Addr) bool { return sameAuth(was, now, host) }); k > 0 {
		n.log.Info("change: NVMe controllers ended", "target", tc.Name, "count", k, "why", "their hosts' DH-HMAC-CHAP secrets changed")
	}
	for id := range ns.units {
		for _, c := range ns.sub.Controllers() {
			if was.visible(c.Host, id) != now.visible(c.Host, id) {
				ns.sub.CapacityChanged(id)
				break
			}
		}
	}
}

// startNVMe opens an nvme-tcp portal.
func (n *Node) startNVMe(p config.Portal) error {
	l, err := net.Listen("tcp", p.Address)
	if err != nil {
		return err
	}
	n.tcp = append(n.tcp, l)
	addr := l.Addr().String()
	n.portals = append(n.portals, Portal{Transport: p.Transport, Address: addr})
	ap, _ := netip.ParseAddrPort(addr)
	n.nvmeOn = append(n.nvmeOn, nvmePortal{portal: p, addr: ap, id: uint16(len(n.nvmeOn) + 1)})
	n.serve("NVMe/TCP portal "+p.Address, func() error {
		if err := n.nvmeSrv.Serve(l); err != tcptarget.ErrClosed {
			return err
		}
		return nil
	})
	nqns := []string{}
	for _, t := range n.cfg.Targets {
		if p.Serves(t.Name) {
			nqns = append(nqns, t.SubsystemNQN())
		}
	}
	n.log.Info("serving NVMe/TCP", "portal", addr, "subsystems", strings.Join(nqns, " "))
	return nil
}

// nvmeSessions describes the NVMe controllers as sessions (admin
// sessions, drop, metrics): ID "nvme-NQN-CNTLID"... kept short as
// "nvme-<target index>-<cntlid>".
func (n *Node) nvmeSessions() []scsitarget.SessionInfo {
	n.mu.Lock()
	type named struct {
		name string
		sub  *nvmetarget.Subsystem
	}
	subs := make([]named, 0, len(n.nvmeSubs))
	for name, ns := range n.nvmeSubs {
		subs = append(subs, named{name, ns.sub})
	}
	n.mu.Unlock()
	var out []scsitarget.SessionInfo
	for _, s := range subs {
		for _, c := range s.sub.Controllers() {
			out = append(out, scsitarget.SessionInfo{Fabric: "nvme-tcp", ID: nvmeSessionID(s.sub.NQN(), c.ID), Target: s.name, Initiator: c.Host,
				Stats: c.Stats, Params: map[string]string{"queues": strconv.Itoa(c.Queues), "subsystem": s.sub.NQN()},
				Conns: []scsitarget.ConnInfo{{ID: "0", Remote: c.Remote, Transport: "nvme-tcp"}}})
		}
	}
	return out
}

func nvmeSessionID(nqn string, cntlid uint16) string { return fmt.Sprintf("nvme-%d@%s", cntlid, nqn) }

// dropNVMeSession ends the controller a session ID names.
func (n *Node) dropNVMeSession(id string) bool {
	rest, ok := strings.CutPrefix(id, "nvme-")
	if !ok {
		return false
	}
	num, nqn, ok := strings.Cut(rest, "@")
	c, err := strconv.ParseUint(num, 10, 16)
	if !ok || err != nil {
		return false
	}
	s := n.nvme.Subsystem(nqn)
	return s != nil && s.Drop(uint16(c))
}
