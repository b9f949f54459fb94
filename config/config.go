// Package config is blockwire's declarative configuration: targets, their
// LUNs and backends, portals, initiator ACLs and CHAP secrets, in TOML. It
// validates everything before anything is served and reports each error
// with its location.
package config

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/blockwire/blockwire/scsi"
	"github.com/blockwire/blockwire/srp"
)

// Config is the whole file.
type Config struct {
	// Portals are where the targets are served, each with its fabric
	// and, optionally, the targets it serves ([[portal]]). Listen,
	// SRPListen, ROCEListen and SRPROCEListen are shorthands for portals
	// serving every target (AllPortals lists both).
	Portals []Portal `toml:"portal,omitempty"`
	// Listen lists the iSCSI/TCP portals, "host:port".
	Listen []string `toml:"listen,omitempty"`
	// Metrics is the host:port of the Prometheus endpoint (GET /metrics);
	// empty: none.
	Metrics string `toml:"metrics,omitempty"`
	// AdminSocket is the Unix socket of the administration API (blockwire
	// admin); empty: none.
	AdminSocket string `toml:"admin_socket,omitempty"`
	// AdminDirs are the directories in which the administration API may
	// name files (LUN backing files, save destinations); empty: none.
	AdminDirs []string `toml:"admin_dirs,omitempty"`
	// ISNS is the iSNS server (host[:port]) the targets and portals are
	// registered with (RFC 4171); empty: none.
	ISNS string `toml:"isns,omitempty"`
	// ISER turns iSER off on the listen portals when false (default on:
	// connection-first and RFC 5046 iSER share the iSCSI/TCP port).
	ISER *bool `toml:"iser,omitempty"`
	// SRPListen serves every target over SRP on these host:port
	// addresses (software iWARP, as Linux ib_srp reaches it); SRPIDExt is
	// the first target's SRP port ID, ID_EXT[:IOC_GUID] in hex, unless it
	// sets its own (default: from the target's name).
	SRPListen []string `toml:"srp_listen,omitempty"`
	SRPIDExt  string   `toml:"srp_id_ext,omitempty"`
	// NVMeListen serves every target over NVMe/TCP on these host:port
	// addresses (an nvme-tcp portal each; 4420 is NVMe/TCP's port).
	NVMeListen []string `toml:"nvme_listen,omitempty"`
	// ROCEListen serves iSER, SRPROCEListen SRP, on the software RoCEv2
	// device (InfiniBand RC over UDP) at these address:port portals;
	// ROCEUDPPort is its UDP port.
	ROCEListen    []string `toml:"roce_listen,omitempty"`
	SRPROCEListen []string `toml:"srp_roce_listen,omitempty"`
	ROCEUDPPort   int      `toml:"roce_udp_port,omitzero"`
	// ROCEGSO, when false, has the software RoCEv2 device send one
	// datagram per packet instead of UDP GSO runs (default on): packet
	// captures on the host then show packets, not GSO datagrams.
	ROCEGSO *bool `toml:"roce_gso,omitempty"`
	// Poll has the target's receivers — each iSCSI/TCP and NVMe/TCP
	// connection's reader, each software RoCEv2 device's receiving
	// goroutine — poll
	// their sockets up to this long ("1ms") after finding them empty
	// before they sleep, and an I/O alone on a file LUN's io_uring poll
	// its completion queue: what lands meanwhile is read without a wake-up,
	// for lower latency at low queue depths, at the price of the CPU the
	// polling takes while traffic flows. Each receiver adapts its polling
	// within this to how long its peer takes to send again (internal/spin,
	// KVM's halt-polling rule), and stops polling a peer that idles past
	// a millisecond; the TCP readers poll as one group (sockpoll.Group:
	// one a core at a time, none while another has just gone to sleep).
	// 0, the default: they sleep at once. At most 1ms.
	Poll time.Duration `toml:"poll,omitzero"`
	// RDMADevice chooses the RDMA device under the iser-roce and srp-roce
	// portals: "auto" (the default: the kernel RDMA device a portal's
	// address belongs to — an RDMA NIC, rxe, siw — when this build has
	// verbs support and the address has one, else the software RoCEv2
	// device), "soft" (the software device always) or a kernel device's
	// name as rdma link lists it (mlx5_0, rxe0).
	RDMADevice string `toml:"rdma_device,omitempty"`
	// RDMAMemory bounds the memory registered with a kernel RDMA device;
	// the locked-memory limit must allow it.
	RDMAMemory string `toml:"rdma_memory,omitempty"`
	Limits     Limits `toml:"limits,omitempty"`
	// Discovery sets who may open discovery sessions and how they
	// authenticate (nil: anyone, no authentication).
	Discovery *Discovery `toml:"discovery,omitempty"`
	Targets   []Target   `toml:"target"`
}

// MaxLUN bounds LUN numbers: a LUN is below it (SAM-5's flat space
// addressing, which is also what NVMe's namespace IDs N+1 stay within).
const MaxLUN = 16384

// MaxMemoryLUN is the largest in-memory LUN a configuration may declare:
// 1 PiB, the memory backend's bound (backend/mem.MaxSize; a test in
// package node keeps the two equal, since config imports no backend).
const MaxMemoryLUN = 1 << 50

// The fabrics a portal can serve.
const (
	// ISCSI is iSCSI over TCP; unless iser = false the same port also
	// takes iSER over the software iWARP device (connection first, or
	// RFC 5046's upgrade after a TCP login).
	ISCSI = "iscsi"
	// ISERRoCE is iSER on the software RoCEv2 device (InfiniBand RC in
	// UDP, RDMA/CM as Linux rxe speaks it).
	ISERRoCE = "iser-roce"
	// SRP is SRP over the software iWARP device (RDMA/CM, as Linux ib_srp
	// reaches it); SRPRoCE over the software RoCEv2 device.
	SRP     = "srp"
	SRPRoCE = "srp-roce"
	// NVMeTCP (nvme.go) is NVMe over Fabrics on TCP.
)

// Portal is one address a fabric is served on.
type Portal struct {
	// Transport is iscsi, iser-roce, srp, srp-roce or nvme-tcp.
	Transport string `toml:"transport"`
	// Address is host:port (RoCE: the local IP address and the port the
	// service ID names).
	Address string `toml:"address"`
	// Targets are the names of the targets served here (empty: all).
	Targets []string `toml:"targets,omitempty"`
}

// Serves reports whether the portal serves the named target.
func (p Portal) Serves(name string) bool {
	return len(p.Targets) == 0 || slices.Contains(p.Targets, name)
}

// AllPortals returns the portals: the [[portal]] entries, then one for
// each address of the listen, roce_listen, srp_listen, srp_roce_listen
// and nvme_listen shorthands.
func (c *Config) AllPortals() []Portal {
	out := slices.Clone(c.Portals)
	for _, k := range []struct {
		tr    string
		addrs []string
	}{{ISCSI, c.Listen}, {ISERRoCE, c.ROCEListen}, {SRP, c.SRPListen}, {SRPRoCE, c.SRPROCEListen}, {NVMeTCP, c.NVMeListen}} {
		for _, a := range k.addrs {
			out = append(out, Portal{Transport: k.tr, Address: a})
		}
	}
	return out
}

// Limits bound what initiators may use; zero keeps the default, which
// Settings declares with each key's flag and range. Durations are strings
// such as "15s".
type Limits struct {
	// LoginTimeout drops a connection whose login has not finished.
	LoginTimeout time.Duration `toml:"login_timeout,omitzero"`
	// NopInterval pings a connection idle this long (negative:
	// never); NopTimeout drops it when the ping goes unanswered.
	NopInterval time.Duration `toml:"nop_interval,omitzero"`
	NopTimeout  time.Duration `toml:"nop_timeout,omitzero"`
	// MaxSessions counts all targets' normal sessions.
	MaxSessions int `toml:"max_sessions,omitzero"`
	// MaxSessionsPerSource counts the normal sessions of one address:
	// one initiator host cannot take them all.
	MaxSessionsPerSource int `toml:"max_sessions_per_source,omitzero"`
	// MaxWorkingPerSource counts one address's commands on LU workers,
	// executing or waiting for the peer to take their answers, across
	// its connections; past it they stop being read.
	MaxWorkingPerSource int `toml:"max_working_per_source,omitzero"`
	// MaxDiscoverySessions bounds discovery sessions, counted apart from
	// MaxSessions; MaxLoginsPerSource the connections of one address
	// still logging in.
	MaxDiscoverySessions int `toml:"max_discovery_sessions,omitzero"`
	MaxLoginsPerSource   int `toml:"max_logins_per_source,omitzero"`
	// SourcePrefixV6 is what one source is to every per-source bound
	// (logins, sessions, working commands, SRP channels, RoCE connection
	// requests, MPA handshakes, control connections) when the peer is
	// IPv6: the network of its address's first this many bits (by
	// default each address alone). A peer given a routed /64 takes any of its
	// addresses at will: where such peers reach a portal, 64 bounds them.
	// IPv4 addresses always count alone.
	SourcePrefixV6 int `toml:"source_prefix_v6,omitzero"`
	// MaxConnections per session.
	MaxConnections int `toml:"max_connections,omitzero"`
	// CmdWindow is how many commands a session may have outstanding.
	CmdWindow int `toml:"cmd_window,omitzero"`
	// MaxRecvDataSegmentLength is the largest data segment the target
	// accepts.
	MaxRecvDataSegmentLength int `toml:"max_recv_data_segment_length,omitzero"`
	// IOBudget bounds the I/O buffers of all sessions together,
	// SessionIOBudget one session's share (sizes such as "128MiB"):
	// commands beyond them get TASK SET FULL.
	IOBudget        string `toml:"io_budget,omitempty"`
	SessionIOBudget string `toml:"session_io_budget,omitempty"`
}

// Budgets returns IOBudget and SessionIOBudget in bytes (0: default).
func (l *Limits) Budgets() (io, session int64, err error) {
	if l.IOBudget != "" {
		if io, err = ParseSize(l.IOBudget); err != nil {
			return 0, 0, err
		}
	}
	if l.SessionIOBudget != "" {
		if session, err = ParseSize(l.SessionIOBudget); err != nil {
			return 0, 0, err
		}
	}
	return io, session, nil
}

// Target is one iSCSI target.
type Target struct {
	Name  string `toml:"name"`
	Alias string `toml:"alias,omitempty"`
	// Initiators is the ACL: initiator names allowed to log in (empty and
	// no acl entries: all).
	Initiators []string `toml:"initiators,omitempty"`
	// ACL entries admit one initiator each, optionally with CHAP
	// credentials of its own (which replace the target's chap for it).
	ACL []ACL `toml:"acl,omitempty"`
	// SRPInitiators are the SRP initiator port IDs admitted when the
	// target is served over SRP (32 hex digits, or initiator_ext:GUID).
	// SRP has no CHAP: a target with an ACL or CHAP must list them to be
	// served over SRP at all; one without either admits every port
	// unless this is set.
	SRPInitiators []string `toml:"srp_initiators,omitempty"`
	// NQN is the NVM subsystem NQN the target is served under over NVMe
	// (default: its name if that is an NQN, else NQNPrefix + its name).
	NQN string `toml:"nqn,omitempty"`
	// Hosts are the NVMe host NQNs admitted when the target is served
	// over NVMe. As with SRP, a target with an ACL or CHAP must list them
	// to be served over NVMe at all; one without either admits every
	// host unless this is set.
	Hosts      []string `toml:"hosts,omitempty"`
	CHAP       *Secret  `toml:"chap,omitempty"`
	MutualCHAP *Secret  `toml:"mutual_chap,omitempty"`
	// Portals, when set, are the only portals (listen addresses, as
	// given in listen) on which the target is listed and reachable: a
	// login through another gets "not found". Empty: every portal.
	Portals []string `toml:"portals,omitempty"`
	// Redirect sends this target's logins to another portal
	// ("host:port[,tpgt]"): login status 0101, moved temporarily, or with
	// RedirectPermanent 0102, moved permanently (RFC 7143 §11.13.5). A
	// redirecting target needs no LUNs.
	Redirect          string `toml:"redirect,omitempty"`
	RedirectPermanent bool   `toml:"redirect_permanent,omitempty"`
	// SRPIDExt is the target's SRP target port ID, ID_EXT[:IOC_GUID] in
	// hex (default: derived from the name; the file's srp_id_ext is the
	// first target's).
	SRPIDExt string `toml:"srp_id_ext,omitempty"`
	// TPGT is the target portal group tag, also the relative target port
	// identifier (default 1). Gateways serving one shared image give
	// each its own.
	TPGT uint16 `toml:"tpgt,omitzero"`
	// TargetReset lets every initiator the target admits send TARGET
	// WARM RESET and TARGET COLD RESET (iSCSI), which reach every LU and
	// every initiator of the target; without it only ACL entries with
	// target_reset may, and others get "function authorization failed".
	TargetReset bool `toml:"target_reset,omitempty"`
	// PortGroups turns on ALUA: "ID=state" for every gateway's target
	// port group (ID = that gateway's tpgt), state active-optimized,
	// active-non-optimized, standby or unavailable.
	PortGroups []string `toml:"port_groups,omitempty"`
	LUNs       []LUN    `toml:"lun"`
}

// Discovery is the access rules of discovery sessions (SendTargets):
// like a target's, without LUNs.
type Discovery struct {
	// Initiators may open discovery sessions (empty and no acl: all).
	Initiators []string `toml:"initiators,omitempty"`
	ACL        []ACL    `toml:"acl,omitempty"`
	// CHAP is required of every discovery session (per-initiator
	// credentials in acl replace it); MutualCHAP answers initiators that
	// ask the target to authenticate.
	CHAP       *Secret `toml:"chap,omitempty"`
	MutualCHAP *Secret `toml:"mutual_chap,omitempty"`
}

// AsTarget returns the rules as a target's (without name and LUNs).
func (d *Discovery) AsTarget() Target {
	return Target{Initiators: d.Initiators, ACL: d.ACL, CHAP: d.CHAP, MutualCHAP: d.MutualCHAP}
}

// ACL admits one initiator: an iSCSI initiator name, or an SRP initiator
// port ID (32 hex digits, or initiator_ext:GUID).
type ACL struct {
	Initiator    string `toml:"initiator,omitempty"`
	SRPInitiator string `toml:"srp_initiator,omitempty"`
	// Host is an NVMe host NQN; its luns (plain numbers) are the
	// namespaces it sees.
	Host string `toml:"host,omitempty"`
	// LUNs, when set, are the only LUNs the initiator sees, each "N"
	// (LUN N under its own number) or "M=N" (LUN N seen as M): LUN
	// masking and numbering per initiator, on every fabric.
	LUNs []string `toml:"luns,omitempty"`
	// CHAP replaces the target's chap for this initiator (iSCSI only).
	CHAP *Secret `toml:"chap,omitempty"`
	// DHCHAP is an NVMe host's DH-HMAC-CHAP secret, in the form nvme
	// gen-dhchap-key writes ("DHHC-1:XX:…:"), without a user: the host
	// must authenticate with it (NVMe in-band authentication).
	// DHCHAPCtrl is the controller's, for a host that asks the
	// controller to authenticate too (bidirectional).
	DHCHAP     *Secret `toml:"dhchap,omitempty"`
	DHCHAPCtrl *Secret `toml:"dhchap_ctrl,omitempty"`
	// From, when set, admits the initiator only from these addresses or
	// networks ("192.0.2.7", "10.0.0.0/8", "fd00::/8").
	From []string `toml:"from,omitempty"`
	// TargetReset lets this initiator send TARGET WARM RESET and TARGET
	// COLD RESET (iSCSI only).
	TargetReset bool `toml:"target_reset,omitempty"`
}

// Sources parses From (nil: from anywhere).
func (a *ACL) Sources() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range a.From {
		p, err := netip.ParsePrefix(f)
		if err != nil {
			ip, err2 := netip.ParseAddr(f)
			if err2 != nil {
				return nil, fmt.Errorf("%q is neither an address nor a network (ADDR/BITS)", f)
			}
			p = netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// admitsFrom reports whether the entry admits a connection from remote
// (nil: an address unknown, admitted only by an entry without from).
func (a *ACL) admitsFrom(remote net.Addr) bool {
	src, err := a.Sources()
	return err == nil && (remote == nil && src == nil || remote != nil && AdmitsFrom(src, remote))
}

// AdmitsFrom reports whether an address is in the prefixes (nil: all).
func AdmitsFrom(prefixes []netip.Prefix, addr net.Addr) bool {
	if prefixes == nil {
		return true
	}
	var ip netip.Addr
	switch a := addr.(type) {
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	case *net.UDPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	default:
		if ap, err := netip.ParseAddrPort(addr.String()); err == nil {
			ip = ap.Addr()
		}
	}
	ip = ip.Unmap()
	for _, p := range prefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// LUNMap parses LUNs: the initiator's LUN number to the target's; nil
// when every LUN is seen under its own number.
func (a *ACL) LUNMap() (map[uint64]uint64, error) {
	if len(a.LUNs) == 0 {
		return nil, nil
	}
	m := map[uint64]uint64{}
	for _, e := range a.LUNs {
		vs, ts, mapped := strings.Cut(e, "=")
		if !mapped {
			ts = vs
		}
		v, err1 := strconv.ParseUint(strings.TrimSpace(vs), 10, 64)
		t, err2 := strconv.ParseUint(strings.TrimSpace(ts), 10, 64)
		if err1 != nil || err2 != nil || v >= 16384 {
			return nil, fmt.Errorf("%q: want N or M=N (LUN numbers, M below 16384)", e)
		}
		if _, dup := m[v]; dup {
			return nil, fmt.Errorf("LUN %d mapped twice", v)
		}
		m[v] = t
	}
	return m, nil
}

// Protected reports whether logins to the target are restricted (an ACL
// or CHAP).
func (t *Target) Protected() bool {
	if t.AllowedInitiators() != nil || t.CHAP != nil {
		return true
	}
	for _, a := range t.ACL {
		if a.CHAP != nil || a.DHCHAP != nil {
			return true
		}
	}
	return false
}

// SRPAllows reports whether the SRP initiator port id may log in to the
// target (see SRPInitiators); an unparsable entry admits nobody.
func (t *Target) SRPAllows(id srp.PortID, remote net.Addr) bool {
	if !t.SRPListed() {
		return !t.Protected()
	}
	if a, ok := t.SRPEntry(id); ok {
		// An entry's from holds even where srp_initiators lists the port
		// too, as an iSCSI name's does.
		return a.admitsFrom(remote)
	}
	for _, s := range t.SRPInitiators {
		if p, err := srp.ParsePortID(s); err == nil && p == id {
			return true
		}
	}
	return false
}

// SRPListed reports whether the target names any SRP initiator.
func (t *Target) SRPListed() bool {
	if len(t.SRPInitiators) > 0 {
		return true
	}
	for _, a := range t.ACL {
		if a.SRPInitiator != "" {
			return true
		}
	}
	return false
}

// SRPEntry returns the ACL entry of an SRP initiator port.
func (t *Target) SRPEntry(id srp.PortID) (ACL, bool) {
	for _, a := range t.ACL {
		if p, err := srp.ParsePortID(a.SRPInitiator); a.SRPInitiator != "" && err == nil && p == id {
			return a, true
		}
	}
	return ACL{}, false
}

// SRPLUNMap is the LUN map of an SRP initiator port (nil: all LUNs).
func (t *Target) SRPLUNMap(id srp.PortID) map[uint64]uint64 {
	a, ok := t.SRPEntry(id)
	if !ok {
		return nil
	}
	m, _ := a.LUNMap() // validated
	return m
}

// SRPTargets returns the indexes of the targets served over SRP: those
// an srp or srp-roce portal serves.
func (c *Config) SRPTargets() []int {
	var out []int
	portals := c.AllPortals()
	for i, t := range c.Targets {
		for _, p := range portals {
			if (p.Transport == SRP || p.Transport == SRPRoCE) && p.Serves(t.Name) {
				out = append(out, i)
				break
			}
		}
	}
	return out
}

// SRPPortID returns the SRP target port ID (ID_EXT, IOC GUID) of the
// target at index i: its srp_id_ext, the file's for the first target, or
// one derived from its name (FNV-1a, the same across restarts).
func (c *Config) SRPPortID(i int) (idExt, iocGUID uint64, err error) {
	t := c.Targets[i]
	v := t.SRPIDExt
	if v == "" && i == 0 {
		v = c.SRPIDExt
	}
	if v == "" {
		h := fnv.New64a()
		h.Write([]byte(t.Name))
		id := h.Sum64()
		return id, id, nil
	}
	a, b, ok := strings.Cut(v, ":")
	if !ok {
		b = a
	}
	hi, err1 := strconv.ParseUint(strings.TrimPrefix(a, "0x"), 16, 64)
	lo, err2 := strconv.ParseUint(strings.TrimPrefix(b, "0x"), 16, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("srp_id_ext: want ID_EXT[:IOC_GUID] in hex, not %q", v)
	}
	return hi, lo, nil
}

// AllowedInitiators returns the initiators of the ACL (nil: everyone).
func (t *Target) AllowedInitiators() []string {
	if len(t.Initiators) == 0 && len(t.ACL) == 0 {
		return nil
	}
	out := append([]string{}, t.Initiators...)
	for _, a := range t.ACL {
		if a.Initiator != "" {
			out = append(out, a.Initiator)
		}
	}
	return out // empty, not nil, when only SRP initiators are listed
}

// Secret is a CHAP user and secret. The secret comes from exactly one of
// Secret, SecretFile (a relative path is found beside the configuration
// file) or SecretEnv.
type Secret struct {
	User       string `toml:"user"`
	Secret     string `toml:"secret,omitempty"`
	SecretFile string `toml:"secret_file,omitempty"`
	SecretEnv  string `toml:"secret_env,omitempty"`
}

// LUN is one logical unit.
type LUN struct {
	ID   uint64 `toml:"id"`
	Size string `toml:"size,omitempty"` // e.g. "1GiB", "512MiB", bytes
	File string `toml:"file,omitempty"` // empty: in memory
	// Grow lets Size grow an existing File (sparse); without it a Size
	// that differs from the file's is an error. Nothing shrinks a file.
	Grow bool `toml:"grow,omitempty"`
	// Remote backs the LUN with a LUN of another target, reached through
	// blockwire's initiator: iscsi://, iser:// or srp:// (this node is
	// then a gateway for it). Size and block size are the remote's.
	Remote string `toml:"remote,omitempty"`
	// RBD backs the LUN with a Ceph RBD image, "pool/image" or
	// "pool/namespace/image" (a build with the rbd tag); CephConf,
	// CephKeyring and CephUser say how to reach the cluster (defaults:
	// librados's ceph.conf search, what it names, "admin").
	RBD         string `toml:"rbd,omitempty"`
	CephConf    string `toml:"ceph_conf,omitempty"`
	CephKeyring string `toml:"ceph_keyring,omitempty"`
	CephUser    string `toml:"ceph_user,omitempty"`
	BlockSize   int    `toml:"block_size,omitzero"`
	ReadOnly    bool   `toml:"read_only,omitempty,omitzero"`
	Removable   bool   `toml:"removable,omitempty,omitzero"`
	Serial      string `toml:"serial,omitempty"`
	// IOEngine is how a File LUN's reads and writes reach the kernel:
	// "auto" (or empty: io_uring where the kernel allows it, else
	// pread/pwrite), "io_uring" (fail where it is refused) or "pread".
	IOEngine string `toml:"io_engine,omitempty"`
	// Direct opens File with O_DIRECT, bypassing the page cache; the
	// block size must be a multiple of the file's direct-I/O alignment
	// (checked at start).
	Direct bool `toml:"direct,omitempty"`
	// WriteCache false starts the LU with its write cache disabled (WCE
	// 0 in the caching mode page, SBC-4 §4.15): every write is flushed to
	// stable storage before it is acknowledged, as with FUA. Unset: on.
	WriteCache *bool `toml:"write_cache,omitempty"`
}

// validateAccess checks the access rules of a target, or of discovery
// (where names them in the errors): initiator names, ACL entries (their
// LUN maps against t's LUNs), CHAP secrets, SRP port IDs.
func validateAccess(where string, t Target, add func(format string, args ...any)) {
	for j, in := range t.Initiators {
		if err := ValidName(in); err != nil {
			add("%s.initiators[%d]: %v", where, j, err)
		}
	}
	secrets := []struct {
		name string
		sec  *Secret
	}{{"chap", t.CHAP}, {"mutual_chap", t.MutualCHAP}}
	seenACL := map[string]bool{}
	lunIDs := map[uint64]bool{}
	for _, l := range t.LUNs {
		lunIDs[l.ID] = true
	}
	for j, a := range t.ACL {
		who := a.Initiator
		switch {
		case btoi(a.Initiator != "")+btoi(a.SRPInitiator != "")+btoi(a.Host != "") > 1:
			add("%s.acl[%d]: more than one of initiator, srp_initiator and host set (one entry, one initiator)", where, j)
		case a.Host != "":
			if err := ValidNQN(a.Host); err != nil {
				add("%s.acl[%d].host: %v", where, j, err)
			}
			who = a.Host
			if a.CHAP != nil {
				add("%s.acl[%d].chap: CHAP is iSCSI's; an NVMe host authenticates with dhchap (DH-HMAC-CHAP)", where, j)
			}
			validateDHCHAP(fmt.Sprintf("%s.acl[%d]", where, j), a, add)
			if a.TargetReset {
				add("%s.acl[%d].target_reset: NVMe has no target reset", where, j)
			}
			for _, e := range a.LUNs {
				if strings.Contains(e, "=") {
					add("%s.acl[%d].luns: %q: an NVMe host sees LUN N as namespace N+1; it cannot be renumbered", where, j, e)
				}
			}
		case a.SRPInitiator != "":
			p, err := srp.ParsePortID(a.SRPInitiator)
			if err != nil {
				add("%s.acl[%d].srp_initiator: %v", where, j, err)
			}
			who = p.String()
			if a.CHAP != nil {
				add("%s.acl[%d].chap: SRP has no CHAP", where, j)
			}
			if a.TargetReset {
				add("%s.acl[%d].target_reset: SRP has no target reset", where, j)
			}
		default:
			if err := ValidName(a.Initiator); err != nil {
				add("%s.acl[%d].initiator: %v", where, j, err)
			}
		}
		if a.Host == "" && (a.DHCHAP != nil || a.DHCHAPCtrl != nil) {
			add("%s.acl[%d].dhchap: DH-HMAC-CHAP is NVMe's (an entry with host)", where, j)
		}
		if seenACL[who] {
			add("%s.acl[%d]: %s listed twice", where, j, who)
		}
		seenACL[who] = true
		if _, err := a.Sources(); err != nil {
			add("%s.acl[%d].from: %v", where, j, err)
		}
		if m, err := a.LUNMap(); err != nil {
			add("%s.acl[%d].luns: %v", where, j, err)
		} else {
			for v, tl := range m {
				if !lunIDs[tl] {
					add("%s.acl[%d].luns: LUN %d (seen as %d) is not a LUN of the target", where, j, tl, v)
				}
			}
		}
		secrets = append(secrets, struct {
			name string
			sec  *Secret
		}{fmt.Sprintf("acl[%d].chap", j), a.CHAP})
	}
	for _, s := range secrets {
		if s.sec == nil {
			continue
		}
		if s.sec.User == "" {
			add("%s.%s.user: empty", where, s.name)
		}
		if v, err := s.sec.Value(); err != nil {
			add("%s.%s: %v", where, s.name, err)
		} else if len(v) < 12 {
			add("%s.%s: a %d-byte secret is too short: at least 12 bytes (96 bits) without IPsec (RFC 7143 §12.1.3)", where, s.name, len(v))
		}
	}
	if t.MutualCHAP != nil && t.CHAP == nil {
		add("%s.mutual_chap: needs chap as well", where)
	}
	for j, p := range t.SRPInitiators {
		if _, err := srp.ParsePortID(p); err != nil {
			add("%s.srp_initiators[%d]: %v", where, j, err)
		}
	}
	if t.CHAP != nil && t.MutualCHAP != nil {
		a, _ := t.CHAP.Value()
		b, _ := t.MutualCHAP.Value()
		if a != "" && a == b {
			add("%s: chap and mutual_chap use the same secret (RFC 7143 §12.1.3 forbids it)", where)
		}
	}
}

// Load reads and validates a configuration file.
func Load(path string) (*Config, error) {
	var c Config
	md, err := toml.DecodeFile(path, &c)
	if err != nil {
		if strings.Contains(err.Error(), "destination has type string") {
			err = fmt.Errorf("%w (write it as a string in quotes: size = \"64MiB\", durations as \"15s\")", err)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c.resolvePaths(filepath.Dir(path))
	var errs []error
	for _, k := range md.Undecoded() {
		errs = append(errs, fmt.Errorf("%s: unknown key %s", path, k))
	}
	if err := c.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", path, err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &c, nil
}

// resolvePaths makes the relative paths a file names — secret_file, a
// LUN's file, ceph_conf and ceph_keyring — relative to dir, the
// configuration file's directory, rather than to wherever blockwire was
// started: absolute, so that the running configuration names them the same
// from any directory (a relative --config would otherwise leave them
// relative to the working directory, and a file saved elsewhere would name
// them wrongly).
func (c *Config) resolvePaths(dir string) {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	c.paths(func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	})
}

// RelativeTo is the configuration as a file in dir should say it: the
// paths under dir relative to it (Load makes them relative to the file's
// directory again), others absolute.
func (c *Config) RelativeTo(dir string) *Config {
	d := c.Clone()
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	d.paths(func(p string) string {
		if r, err := filepath.Rel(dir, p); err == nil && filepath.IsAbs(p) && r != ".." && !strings.HasPrefix(r, ".."+string(filepath.Separator)) {
			return r
		}
		return p
	})
	return d
}

// paths rewrites every path the configuration names through fixPath.
func (c *Config) paths(fixPath func(string) string) {
	for i := range c.Targets {
		for j := range c.Targets[i].LUNs {
			l := &c.Targets[i].LUNs[j]
			for _, p := range []*string{&l.File, &l.CephConf, &l.CephKeyring} {
				if *p != "" {
					*p = fixPath(*p)
				}
			}
		}
	}
	for _, sec := range c.secrets() {
		if sec.SecretFile != "" {
			sec.SecretFile = fixPath(sec.SecretFile)
		}
	}
}

// secrets are every CHAP secret the configuration holds: targets',
// their ACL entries' and discovery's.
func (c *Config) secrets() []*Secret {
	var out []*Secret
	access := func(chap, mutual *Secret, acl []ACL) {
		out = append(out, chap, mutual)
		for i := range acl {
			out = append(out, acl[i].CHAP, acl[i].DHCHAP, acl[i].DHCHAPCtrl)
		}
	}
	for i := range c.Targets {
		t := &c.Targets[i]
		access(t.CHAP, t.MutualCHAP, t.ACL)
	}
	if d := c.Discovery; d != nil {
		access(d.CHAP, d.MutualCHAP, d.ACL)
	}
	return slices.DeleteFunc(out, func(s *Secret) bool { return s == nil })
}

// SecretExposure names what lets users other than the owner read a CHAP
// secret: a secret_file, or the configuration file itself (path) when it
// holds a secret inline, that group or others may read. Empty: nothing.
func (c *Config) SecretExposure(path string) []string {
	var out []string
	check := func(file, what string) {
		if st, err := os.Stat(file); err == nil && st.Mode().Perm()&0o077 != 0 {
			out = append(out, fmt.Sprintf("%s (%s) is mode %04o: group or others can read the secret (chmod 600 it)", file, what, st.Mode().Perm()))
		}
	}
	inline, seen := false, map[string]bool{}
	for _, sec := range c.secrets() {
		switch {
		case sec.SecretFile != "" && !seen[sec.SecretFile]:
			seen[sec.SecretFile] = true
			what := "secret_file of user " + sec.User
			if sec.User == "" {
				what = "a DH-HMAC-CHAP secret_file"
			}
			check(sec.SecretFile, what)
		case sec.Secret != "":
			inline = true
		}
	}
	if inline && path != "" {
		check(path, "a configuration with an inline secret")
	}
	return out
}

// Validate checks every field and returns all problems found.
func (c *Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for i, l := range c.Listen {
		if !strings.Contains(l, ":") {
			add("listen[%d]: %q is not host:port", i, l)
		}
	}
	for i, l := range c.SRPListen {
		if !strings.Contains(l, ":") {
			add("srp_listen[%d]: %q is not host:port", i, l)
		}
	}
	for _, k := range []struct {
		key   string
		addrs []string
	}{{"roce_listen", c.ROCEListen}, {"srp_roce_listen", c.SRPROCEListen}} {
		for i, l := range k.addrs {
			if _, _, err := net.SplitHostPort(l); err != nil {
				add("%s[%d]: %q is not address:port", k.key, i, l)
			}
		}
	}
	errs = append(errs, c.checkSettings()...)
	c.validateNVMe(add)
	if (len(c.SRPListen) > 0 || len(c.SRPROCEListen) > 0) && len(c.Targets) == 0 {
		add("srp_listen: no target to serve")
	}
	tnames := map[string]bool{}
	for _, t := range c.Targets {
		tnames[t.Name] = true
	}
	for i, p := range c.Portals {
		where := fmt.Sprintf("portal[%d]", i)
		switch p.Transport {
		case ISCSI, SRP, NVMeTCP:
			if !strings.Contains(p.Address, ":") {
				add("%s.address: %q is not host:port", where, p.Address)
			}
		case ISERRoCE, SRPRoCE:
			if _, _, err := net.SplitHostPort(p.Address); err != nil {
				add("%s.address: %q is not address:port", where, p.Address)
			}
		default:
			add("%s.transport: %q (iscsi, iser-roce, srp, srp-roce or nvme-tcp)", where, p.Transport)
		}
		for _, n := range p.Targets {
			if !tnames[n] {
				add("%s.targets: no target %q", where, n)
			}
		}
	}
	for i, d := range c.AdminDirs {
		if !strings.HasPrefix(d, "/") {
			add("admin_dirs[%d]: %q is not an absolute path", i, d)
		}
	}
	if c.Metrics != "" && !strings.Contains(c.Metrics, ":") {
		add("metrics: %q is not host:port", c.Metrics)
	}
	names := map[string]bool{}
	for i, t := range c.Targets {
		where := fmt.Sprintf("target[%d]", i)
		if err := ValidName(t.Name); err != nil {
			add("%s.name: %v", where, err)
		}
		if names[t.Name] {
			add("%s.name: duplicate target %q", where, t.Name)
		}
		names[t.Name] = true
		validateTarget(where, t, add)
	}
	if c.Discovery != nil {
		validateAccess("discovery", c.Discovery.AsTarget(), add)
	}
	if len(c.Targets) == 0 {
		add("no [[target]]: the configuration serves nothing (add a [[target]] with a name and a [[target.lun]])")
	}
	srpNamed := map[string]bool{} // targets an SRP portal names
	for _, p := range c.Portals {
		if p.Transport == SRP || p.Transport == SRPRoCE {
			for _, n := range p.Targets {
				srpNamed[n] = true
			}
		}
	}
	for _, i := range c.SRPTargets() {
		if _, _, err := c.SRPPortID(i); err != nil {
			add("target[%d].%v", i, err)
		}
		// A protected target that only a shorthand puts on SRP admits
		// no SRP initiator (SRPAllows); one a portal names must say
		// which.
		if t := c.Targets[i]; t.Protected() && !t.SRPListed() && (srpNamed[t.Name] || i == 0 && len(c.Portals) == 0) {
			add("target[%d] (%s) is served over SRP and has an ACL or CHAP, which SRP cannot check (it has no CHAP): list the SRP initiator port IDs it admits (srp_initiators) or do not serve it over SRP", i, t.Name)
		}
	}
	return errors.Join(errs...)
}

// validateTarget checks one [[target]] and its LUNs; where is where it is
// ("target[0]"). Names across targets are Validate's.
func validateTarget(where string, t Target, add func(format string, args ...any)) {
	validateAccess(where, t, add)
	if len(t.LUNs) == 0 && t.Redirect == "" {
		add("%s: no lun", where)
	}
	for j, p := range t.Portals {
		if _, _, err := net.SplitHostPort(p); err != nil {
			add("%s.portals[%d]: %q is not host:port", where, j, p)
		}
	}
	if t.Redirect != "" {
		addr, _, _ := strings.Cut(t.Redirect, ",")
		if _, _, err := net.SplitHostPort(addr); err != nil {
			add("%s.redirect: %q is not host:port[,tpgt] (an IPv6 address in brackets)", where, t.Redirect)
		}
	} else if t.RedirectPermanent {
		add("%s.redirect_permanent: needs redirect", where)
	}
	if len(t.PortGroups) > 0 {
		own := t.TPGT
		if own == 0 {
			own = 1
		}
		found := false
		for _, g := range t.PortGroups {
			pg, err := scsi.ParsePortGroup(g)
			if err != nil {
				add("%s.port_groups: %v", where, err)
			} else if pg.ID == own {
				found = true
			}
		}
		if !found {
			add("%s.port_groups: none is this target's own group %d (its tpgt)", where, own)
		}
	}
	ids := map[uint64]bool{}
	for j, l := range t.LUNs {
		lw := fmt.Sprintf("%s.lun[%d]", where, j)
		if ids[l.ID] {
			add("%s.id: duplicate LUN %d", lw, l.ID)
		}
		ids[l.ID] = true
		validateLUN(lw, l, add)
	}
}

// validateLUN checks one [[target.lun]]; lw is where it is ("target[0].lun[1]").
func validateLUN(lw string, l LUN, add func(format string, args ...any)) {
	if l.ID >= MaxLUN {
		add("%s.id: %d above %d", lw, l.ID, MaxLUN-1)
	}
	if l.RBD != "" {
		if l.Remote != "" || l.File != "" || l.Size != "" {
			add("%s: rbd excludes remote, file and size (the image has its own)", lw)
		}
		if n := strings.Count(l.RBD, "/"); n < 1 || n > 2 || strings.HasPrefix(l.RBD, "/") || strings.HasSuffix(l.RBD, "/") || strings.Contains(l.RBD, "//") {
			add("%s.rbd: %q is not pool/image or pool/namespace/image", lw, l.RBD)
		}
	} else if l.Remote != "" {
		if !strings.HasPrefix(l.Remote, "iscsi://") && !strings.HasPrefix(l.Remote, "iser://") && !strings.HasPrefix(l.Remote, "srp://") && !strings.HasPrefix(l.Remote, "nvme+tcp://") {
			add("%s.remote: %q is not an iscsi://, iser://, srp:// or nvme+tcp:// URL", lw, RedactURL(l.Remote))
		}
		if l.File != "" || l.Size != "" {
			add("%s: remote excludes file and size (the remote LUN has its own)", lw)
		}
	} else if l.Size != "" {
		if n, err := ParseSize(l.Size); err != nil {
			add("%s.size: %v", lw, err)
		} else if bs := max(l.BlockSize, 512); n%int64(bs) != 0 {
			add("%s.size: %d bytes is not a multiple of the %d-byte block", lw, n, bs)
		} else if l.File == "" && n > MaxMemoryLUN {
			add("%s.size: %q: an in-memory LUN holds at most 1 PiB", lw, l.Size)
		}
	} else if l.File == "" {
		add("%s: an in-memory LUN needs a size", lw)
	}
	if bs := l.BlockSize; bs != 0 && bs != 512 && bs != 4096 {
		add("%s.block_size: %d (512 or 4096)", lw, bs)
	}
	switch l.IOEngine {
	case "", "auto", "io_uring", "pread":
	default:
		add("%s.io_engine: %q (auto, io_uring or pread)", lw, l.IOEngine)
	}
	if (l.Direct || l.IOEngine != "") && l.File == "" {
		add("%s: direct and io_engine are for a file LUN (set file)", lw)
	}
}

// Value returns the secret from wherever it is configured to come from.
func (s *Secret) Value() (string, error) {
	n := 0
	for _, v := range []string{s.Secret, s.SecretFile, s.SecretEnv} {
		if v != "" {
			n++
		}
	}
	if n != 1 {
		return "", errors.New("exactly one of secret, secret_file, secret_env must be set")
	}
	switch {
	case s.SecretFile != "":
		b, err := os.ReadFile(s.SecretFile)
		if err != nil {
			return "", err
		}
		v := strings.TrimRight(string(b), "\r\n")
		if v == "" {
			return "", fmt.Errorf("secret_file %s is empty", s.SecretFile)
		}
		return v, nil
	case s.SecretEnv != "":
		v := os.Getenv(s.SecretEnv)
		if v == "" {
			return "", fmt.Errorf("environment variable %s is empty or unset", s.SecretEnv)
		}
		return v, nil
	}
	return s.Secret, nil
}

// ValidName checks the form of an iSCSI name (RFC 7143 §4.2.7): iqn.,
// eui. or naa. followed by allowed characters, at most 223 bytes.
func ValidName(n string) error {
	if n == "" {
		return errors.New("empty iSCSI name")
	}
	if len(n) > 223 {
		return fmt.Errorf("iSCSI name of %d bytes exceeds 223", len(n))
	}
	lower := strings.ToLower(n)
	if !strings.HasPrefix(lower, "iqn.") && !strings.HasPrefix(lower, "eui.") && !strings.HasPrefix(lower, "naa.") {
		return fmt.Errorf("iSCSI name %q does not start with iqn, eui or naa followed by a dot", n)
	}
	for _, r := range n {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == ':') {
			return fmt.Errorf("iSCSI name %q contains %q", n, r)
		}
	}
	return nil
}

// Clone copies the configuration deeply: nothing the copy holds is shared
// with c.
func (c *Config) Clone() *Config {
	d := *c
	d.Portals = slices.Clone(c.Portals)
	for i := range d.Portals {
		d.Portals[i].Targets = slices.Clone(d.Portals[i].Targets)
	}
	d.Listen, d.AdminDirs = slices.Clone(c.Listen), slices.Clone(c.AdminDirs)
	d.SRPListen, d.ROCEListen, d.SRPROCEListen = slices.Clone(c.SRPListen), slices.Clone(c.ROCEListen), slices.Clone(c.SRPROCEListen)
	d.ISER, d.ROCEGSO = clonePtr(c.ISER), clonePtr(c.ROCEGSO)
	if c.Discovery != nil {
		x := *c.Discovery
		x.Initiators, x.ACL = slices.Clone(x.Initiators), cloneACL(x.ACL)
		x.CHAP, x.MutualCHAP = clonePtr(x.CHAP), clonePtr(x.MutualCHAP)
		d.Discovery = &x
	}
	d.Targets = slices.Clone(c.Targets)
	for i := range d.Targets {
		t := &d.Targets[i]
		t.Initiators, t.SRPInitiators, t.Portals, t.PortGroups = slices.Clone(t.Initiators), slices.Clone(t.SRPInitiators), slices.Clone(t.Portals), slices.Clone(t.PortGroups)
		t.ACL = cloneACL(t.ACL)
		t.CHAP, t.MutualCHAP = clonePtr(t.CHAP), clonePtr(t.MutualCHAP)
		t.LUNs = slices.Clone(t.LUNs)
		for j := range t.LUNs {
			t.LUNs[j].WriteCache = clonePtr(t.LUNs[j].WriteCache)
		}
	}
	return &d
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

func cloneACL(a []ACL) []ACL {
	a = slices.Clone(a)
	for i := range a {
		a[i].LUNs, a[i].From, a[i].CHAP = slices.Clone(a[i].LUNs), slices.Clone(a[i].From), clonePtr(a[i].CHAP)
	}
	return a
}

// sizeUnits are the binary units sizes are written in, largest first.
var sizeUnits = [...]struct {
	suf string
	m   int64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}

// FormatSize writes a size as an operator would: in the largest binary
// unit that holds it exactly ("64MiB", "1GiB"), else in bytes.
func FormatSize(n int64) string {
	for _, u := range sizeUnits {
		if n >= u.m && n%u.m == 0 {
			return strconv.FormatInt(n/u.m, 10) + u.suf
		}
	}
	return strconv.FormatInt(n, 10)
}

// HumanSize writes a size for a person to read, in the largest binary
// unit it reaches: whole where that unit holds it exactly, else to one
// decimal ("1.5GiB").
func HumanSize(n int64) string {
	for _, u := range sizeUnits {
		switch {
		case n >= u.m && n%u.m == 0:
			return strconv.FormatInt(n/u.m, 10) + u.suf
		case n >= u.m:
			return strconv.FormatFloat(float64(n)/float64(u.m), 'f', 1, 64) + u.suf
		}
	}
	return strconv.FormatInt(n, 10)
}

// ParseSize parses "1GiB", "512MiB", "4k", "1G" (binary multiples) or a
// plain byte count.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	units := []struct {
		suf string
		m   int64
	}{
		{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
		{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"k", 1 << 10},
		{"t", 1 << 40}, {"g", 1 << 30}, {"m", 1 << 20}, {"B", 1},
	}
	for _, u := range units {
		if strings.HasSuffix(t, u.suf) {
			mult = u.m
			t = strings.TrimSuffix(t, u.suf)
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(t), 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("bad size %q: a positive number of bytes, or with a unit: KiB, MiB, GiB, TiB (K, M, G, T are the same)", s)
	}
	if n > (1<<62)/mult {
		return 0, fmt.Errorf("size %q too large", s)
	}
	return n * mult, nil
}

// RedactURL hides the password of a user%password@ URL.
func RedactURL(u string) string {
	i := strings.Index(u, "://")
	j := strings.LastIndexByte(u, '@')
	if i < 0 || j < i {
		return u
	}
	if k := strings.IndexByte(u[i+3:j], '%'); k >= 0 {
		return u[:i+3+k] + "%(secret)" + u[j:]
	}
	return u
}
