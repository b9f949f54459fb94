package node_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/blockwire/blockwire/admin"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/internal/waitfor"
	"github.com/blockwire/blockwire/iscsi/initiator"
	"github.com/blockwire/blockwire/metrics"
	"github.com/blockwire/blockwire/node"
	"github.com/blockwire/blockwire/nvme"
	"github.com/blockwire/blockwire/nvme/tcphost"
	"github.com/blockwire/blockwire/scsi"
	"github.com/blockwire/blockwire/scsitarget"
	"github.com/prometheus/client_golang/prometheus"
)

const (
	hostA = "nqn.2014-08.org.nvmexpress:uuid:0000000a-0000-4000-8000-000000000000"
	hostB = "nqn.2014-08.org.nvmexpress:uuid:0000000b-0000-4000-8000-000000000000"
)

// TestNVMeBesideISCSI: one LU served over iSCSI and NVMe/TCP is one unit
// — what one fabric writes the other reads; the discovery log lists the
// subsystem on the portal; a LUN added by the operator appears as a
// namespace, a resize changes the namespace's size; the controller shows
// among the sessions and drop ends it; a host the ACL stops admitting is
// disconnected at once and refused afterwards.
func TestNVMeBesideISCSI(t *testing.T) {
	cfg := &config.Config{Listen: []string{"127.0.0.1:0"}, NVMeListen: []string{"127.0.0.1:0"},
		Targets: []config.Target{{Name: diskA, Hosts: []string{hostA, hostB}, LUNs: []config.LUN{{ID: 0, Size: "8MiB"}}}}}
	n := startNode(t, cfg, node.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nv := portal(t, n, config.NVMeTCP)
	nqn := config.NQNPrefix + diskA

	es, err := tcphost.Discover(ctx, nv, tcphost.Options{HostNQN: hostA})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(es, func(e tcphost.DiscoveryEntry) bool { return e.SubNQN == nqn && e.Addr == nv }) {
		t.Fatalf("discovery log %+v lacks %s at %s", es, nqn, nv)
	}

	c, err := tcphost.Connect(ctx, nv, nqn, tcphost.Options{HostNQN: hostA})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dev, err := initiator.Open(ctx, "iscsi://"+portal(t, n, config.ISCSI)+"/"+diskA+"/0", initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()

	p := make([]byte, 64<<10)
	rand.Read(p)
	if err := c.Write(ctx, 1, 512, 100, p, true); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(p))
	if _, err := dev.ReadAtContext(ctx, got, 100*512); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("iSCSI read of what NVMe wrote: %v, equal %v", err, bytes.Equal(got, p))
	}
	rand.Read(p)
	if _, err := dev.WriteAtContext(ctx, p, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Read(ctx, 1, 512, 0, got); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("NVMe read of what iSCSI wrote: %v, equal %v", err, bytes.Equal(got, p))
	}
	// The LUN's counters hold both fabrics' I/O (a SCSI command counts
	// once its answer is taken: a moment after the initiator has it);
	// the controller's, its own.
	lus := n.Devices()[0].LU(0).Stats()
	waitfor.True(t, 5*time.Second, func() bool {
		return lus.Bytes[scsitarget.ClassWrite].Load() >= 2*64<<10 && lus.Bytes[scsitarget.ClassRead].Load() >= 2*64<<10
	}, func() string {
		return fmt.Sprintf("the LUN counted %d bytes written, %d read; want both fabrics' 64 KiB each way",
			lus.Bytes[scsitarget.ClassWrite].Load(), lus.Bytes[scsitarget.ClassRead].Load())
	})
	for _, si := range n.Sessions() {
		if si.Fabric != "nvme-tcp" || si.Initiator != hostA {
			continue
		}
		if si.Stats == nil {
			t.Fatal("the NVMe controller's session has no counters")
		}
		s := si.Stats
		if s.Commands[scsitarget.ClassWrite].Load() != 1 || s.Bytes[scsitarget.ClassWrite].Load() != 64<<10 ||
			s.Commands[scsitarget.ClassRead].Load() != 1 || s.Bytes[scsitarget.ClassRead].Load() != 64<<10 {
			t.Errorf("the controller counted %d writes (%d bytes), %d reads (%d bytes); want one of 64 KiB each",
				s.Commands[scsitarget.ClassWrite].Load(), s.Bytes[scsitarget.ClassWrite].Load(), s.Commands[scsitarget.ClassRead].Load(), s.Bytes[scsitarget.ClassRead].Load())
		}
	}
	// The metrics carry them: the controller as a session of fabric
	// nvme-tcp, and NVMe's per-source bounds.
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.New(n))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := func(name string, labels map[string]string) (float64, bool) {
		for _, f := range fams {
			if f.GetName() != name {
				continue
			}
		next:
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
						continue next
					}
				}
				return m.GetCounter().GetValue(), true
			}
		}
		return 0, false
	}
	if v, ok := series("blockwire_session_commands_total", map[string]string{"fabric": "nvme-tcp", "class": "write", "initiator": hostA}); !ok || v != 1 {
		t.Errorf("metrics: the NVMe controller's writes %v (found %v), want 1", v, ok)
	}
	for _, b := range []string{"setups_per_source", "controllers_per_source"} {
		if _, ok := series("blockwire_bounds_hit_total", map[string]string{"fabric": "nvme", "bound": b}); !ok {
			t.Errorf("metrics: no blockwire_bounds_hit_total{fabric=\"nvme\",bound=%q}", b)
		}
	}

	// The operator adds LUN 3 and resizes LUN 0.
	next := n.Config()
	next.Targets[0].LUNs = []config.LUN{{ID: 0, Size: "16MiB"}, {ID: 3, Size: "4MiB"}}
	if _, err := n.Apply(next, node.Consent{}); err != nil {
		t.Fatal(err)
	}
	ids, err := c.Namespaces(ctx)
	if err != nil || !slices.Equal(ids, []uint32{1, 4}) {
		t.Fatalf("namespaces %v, %v; want [1 4] after LUN 3 was added", ids, err)
	}
	ns, err := c.Namespace(ctx, 1)
	if err != nil || ns.Blocks != 16<<20/512 {
		t.Fatalf("namespace 1 %+v, %v; want %d blocks after the resize", ns, err, 16<<20/512)
	}
	// The changed namespace list says which.
	log, err := c.LogPage(ctx, 0x04, 0, 0, 4096)
	if err != nil || !bytes.Contains(log[:16], []byte{1, 0, 0, 0}) || !bytes.Contains(log[:16], []byte{4, 0, 0, 0}) {
		t.Fatalf("changed namespace list %x, %v", log[:16], err)
	}

	// Sessions show the controller; drop ends it.
	var id string
	for _, s := range n.Sessions() {
		if s.Fabric == "nvme-tcp" && s.Initiator == hostA {
			id = s.ID
		}
	}
	if id == "" {
		t.Fatalf("sessions %+v show no NVMe controller", n.Sessions())
	}
	c2, err := tcphost.Connect(ctx, nv, nqn, tcphost.Options{HostNQN: hostB})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if !n.DropSession(id) {
		t.Fatalf("DropSession(%s) found nothing", id)
	}
	if err := c.Read(ctx, 1, 512, 0, got); err == nil {
		t.Fatal("a dropped controller still reads")
	}
	// hostB is no longer admitted: its live controller ends at once, a
	// new Connect is refused.
	next = n.Config()
	next.Targets[0].Hosts = []string{hostA}
	if _, err := n.Apply(next, node.Consent{}); err != nil {
		t.Fatal(err)
	}
	if err := c2.Read(ctx, 1, 512, 0, got); err == nil {
		t.Fatal("a revoked host still reads")
	}
	if _, err := tcphost.Connect(ctx, nv, nqn, tcphost.Options{HostNQN: hostB}); err == nil {
		t.Fatal("a revoked host connected again")
	}
	var se *tcphost.StatusError
	c3, err := tcphost.Connect(ctx, nv, nqn, tcphost.Options{HostNQN: hostA})
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if err := c3.Read(ctx, 2, 512, 0, got[:512]); !errors.As(err, &se) || se.Status != nvme.StatusInvalidNamespace {
		t.Fatalf("read of an inactive namespace: %v", err)
	}
}

// TestNVMeHostMasking: an ACL entry with a host and luns shows that host
// only those namespaces; a protected target without hosts is refused by
// validation when an nvme-tcp portal serves it.
func TestNVMeHostMasking(t *testing.T) {
	cfg := &config.Config{NVMeListen: []string{"127.0.0.1:0"},
		Targets: []config.Target{{Name: diskA, ACL: []config.ACL{{Host: hostA, LUNs: []string{"1"}}},
			LUNs: []config.LUN{{ID: 0, Size: "1MiB"}, {ID: 1, Size: "1MiB"}}}}}
	n := startNode(t, cfg, node.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := tcphost.Connect(ctx, portal(t, n, config.NVMeTCP), config.NQNPrefix+diskA, tcphost.Options{HostNQN: hostA})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ids, err := c.Namespaces(ctx); err != nil || !slices.Equal(ids, []uint32{2}) {
		t.Fatalf("namespaces %v, %v; want [2]", ids, err)
	}
	if _, err := tcphost.Connect(ctx, portal(t, n, config.NVMeTCP), config.NQNPrefix+diskA, tcphost.Options{HostNQN: hostB}); err == nil {
		t.Fatal("a host outside the ACL connected")
	}
	bad := &config.Config{NVMeListen: []string{"127.0.0.1:0"},
		Targets: []config.Target{{Name: diskA, Initiators: []string{"iqn.2026-11.org.example:i"}, LUNs: []config.LUN{{ID: 0, Size: "1MiB"}}}}}
	if err := bad.Validate(); err == nil {
		t.Fatal("a target with an ACL and no NVMe hosts passed validation while served over NVMe")
	}
}

// TestNVMeAdminACL: an operator admits an NVMe host through the admin
// API (acl-add --nvme), with the namespaces it sees; the tree shows the
// subsystem and the entry; removing the entry disconnects the host at
// once.
func TestNVMeAdminACL(t *testing.T) {
	cfg := &config.Config{NVMeListen: []string{"127.0.0.1:0"},
		Targets: []config.Target{{Name: diskA, Hosts: []string{hostA}, LUNs: []config.LUN{{ID: 0, Size: "1MiB"}, {ID: 1, Size: "1MiB"}}}}}
	n := startNode(t, cfg, node.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr, nqn := portal(t, n, config.NVMeTCP), config.NQNPrefix+diskA
	if _, err := tcphost.Connect(ctx, addr, nqn, tcphost.Options{HostNQN: hostB}); err == nil {
		t.Fatal("a host not listed connected")
	}
	adm := n.Admin()
	if err := adm.ChangeACL(admin.ACLChange{Target: diskA, Initiator: hostB, NVMe: true, Add: true, Map: []string{"1"}}); err != nil {
		t.Fatal(err)
	}
	c, err := tcphost.Connect(ctx, addr, nqn, tcphost.Options{HostNQN: hostB})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ids, err := c.Namespaces(ctx); err != nil || !slices.Equal(ids, []uint32{2}) {
		t.Fatalf("namespaces %v, %v; want [2]", ids, err)
	}
	tr := adm.Tree()
	if tr.Targets[0].NQN != nqn || !slices.ContainsFunc(tr.Targets[0].ACL, func(e admin.TreeACL) bool { return e.NVMe && e.Initiator == hostB }) {
		t.Fatalf("tree %+v", tr.Targets[0])
	}
	if err := adm.ChangeACL(admin.ACLChange{Target: diskA, Initiator: hostB, NVMe: true, Remove: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.Read(ctx, 2, 512, 0, make([]byte, 512)); err == nil {
		t.Fatal("a host whose entry was removed still reads")
	}
}

// TestNVMeANAFollowsALUA: with ALUA on, NVMe reports ANA with the same
// state as this gateway's target port group; SET TARGET PORT GROUPS
// through iSCSI putting it in standby makes the NVMe path inaccessible at
// once — I/O refused with a path status the host retries elsewhere, the
// ANA log changed, an ANA change notice to a host that asked for them —
// and back to optimized, I/O works again.
func TestNVMeANAFollowsALUA(t *testing.T) {
	iser := false
	cfg := &config.Config{Listen: []string{"127.0.0.1:0"}, ISER: &iser, NVMeListen: []string{"127.0.0.1:0"},
		Targets: []config.Target{{Name: diskA, TPGT: 1, PortGroups: []string{"1=ao", "2=ano"}, LUNs: []config.LUN{{ID: 0, Size: "1MiB"}}}}}
	n := startNode(t, cfg, node.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := tcphost.Connect(ctx, portal(t, n, config.NVMeTCP), config.NQNPrefix+diskA, tcphost.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	id := c.IdentifyController()
	if id[76]&(1<<3) == 0 || binary.LittleEndian.Uint32(id[540:]) == 0 {
		t.Fatalf("CMIC %#x, MNAN %d: no ANA reporting", id[76], binary.LittleEndian.Uint32(id[540:]))
	}
	anaState := func() (state byte, chg uint64) {
		t.Helper()
		b, err := c.LogPage(ctx, 0x0c, 0, 0, 64)
		if err != nil {
			t.Fatal(err)
		}
		if binary.LittleEndian.Uint16(b[8:]) != 1 || binary.LittleEndian.Uint32(b[16:]) != 1 || binary.LittleEndian.Uint32(b[20:]) != 1 || binary.LittleEndian.Uint32(b[48:]) != 1 {
			t.Fatalf("ANA log % x: want one group (1) of one namespace (1)", b[:52])
		}
		return b[32] & 0x0f, binary.LittleEndian.Uint64(b[0:])
	}
	if st, _ := anaState(); st != 0x01 {
		t.Fatalf("ANA state %#x, want optimized", st)
	}
	// An Asynchronous Event Request waiting, ANA change notices on.
	if _, err := c.Admin(ctx, &nvme.Command{Opcode: nvme.AdminSetFeatures, CDW: [6]uint32{0x0b, 1 << 11}}, nil, tcphost.NoData); err != nil {
		t.Fatal(err)
	}
	aer := make(chan nvme.Completion, 1)
	go func() {
		cqe, _ := c.Admin(ctx, &nvme.Command{Opcode: nvme.AdminAsyncEventReq}, nil, tcphost.NoData)
		aer <- cqe
	}()
	dev, err := initiator.Open(ctx, "iscsi://"+portal(t, n, config.ISCSI)+"/"+diskA+"/0", initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	stpg := func(state scsi.ALUAState) {
		t.Helper()
		p := []byte{0, 0, 0, 0, byte(state), 0, 0, 1}
		if _, err := dev.Do(ctx, []byte{scsi.OpMaintenanceOut, scsi.SASetTargetPortGroups, 0, 0, 0, 0, 0, 0, 0, byte(len(p)), 0, 0}, p, nil); err != nil {
			t.Fatalf("SET TARGET PORT GROUPS: %v", err)
		}
	}
	time.Sleep(50 * time.Millisecond) // the AER is in
	stpg(scsi.Standby)
	select {
	case cqe := <-aer:
		if cqe.DW0 != 0x000c0302 {
			t.Fatalf("AER completed with %#x, want an ANA change notice (0x000c0302)", cqe.DW0)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no ANA change notice")
	}
	if st, chg := anaState(); st != 0x03 || chg == 0 {
		t.Fatalf("ANA state %#x (change count %d), want inaccessible", st, chg)
	}
	var se *tcphost.StatusError
	if err := c.Read(ctx, 1, 512, 0, make([]byte, 512)); !errors.As(err, &se) || se.Status.SCT() != nvme.SCTPath || se.Status.DNR() {
		t.Fatalf("a read on an inaccessible path: %v, want a path status to retry elsewhere", err)
	}
	stpg(scsi.ActiveOptimized)
	if err := c.Read(ctx, 1, 512, 0, make([]byte, 512)); err != nil {
		t.Fatalf("a read once optimized again: %v", err)
	}
}
