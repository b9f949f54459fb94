package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/blockwire/blockwire/admin"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/initiator"
	"github.com/blockwire/blockwire/node"
	"github.com/blockwire/blockwire/node/nodetest"
	"github.com/blockwire/blockwire/rdma/siw"
	"github.com/blockwire/blockwire/srp"
	"github.com/blockwire/blockwire/srp/srpinitiator"
)

const (
	diskA = "iqn.2026-11.org.example:a"
	diskB = "iqn.2026-11.org.example:b"
	diskC = "iqn.2026-11.org.example:c"
)

func startNode(t *testing.T, cfg *config.Config, opts node.Options) *node.Node {
	return nodetest.Start(t, cfg, opts)
}

func portal(t *testing.T, n *node.Node, transport string) string {
	return nodetest.Portal(t, n, transport)
}

// srpURL is a target's SRP URL on the node's SRP portal: the port ID is
// derived from the name (config.SRPPortID).
func srpURL(t *testing.T, cfg *config.Config, addr string, i, lun int) string {
	hi, lo, err := cfg.SRPPortID(i)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("srp://%s/%016x:%016x/%d", addr, hi, lo, lun)
}

// TestSessionsOnEveryFabric: one node serves an iSCSI/TCP, an iSER and an
// SRP session at once; the administration API and the metrics show each
// with its fabric; SRP reaches the second target's LUNs (not only the
// first target's), and a target added by Apply is served over SRP too.
func TestSessionsOnEveryFabric(t *testing.T) {
	dir := t.TempDir()
	cfg := &config.Config{
		Listen: []string{"127.0.0.1:0"}, SRPListen: []string{"127.0.0.1:0"},
		Metrics: "127.0.0.1:0", AdminSocket: filepath.Join(dir, "admin.sock"),
		Targets: []config.Target{
			{Name: diskA, LUNs: []config.LUN{{ID: 0, Size: "8MiB"}}},
			{Name: diskB, LUNs: []config.LUN{{ID: 0, Size: "4MiB"}, {ID: 1, Size: "2MiB"}}},
		}}
	n := startNode(t, cfg, node.Options{})
	ctx := context.Background()
	tcpAddr, srpAddr := portal(t, n, config.ISCSI), portal(t, n, config.SRP)

	tcpDev, err := initiator.Open(ctx, "iscsi://"+tcpAddr+"/"+diskA+"/0", initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer tcpDev.Close()
	iserDev, err := initiator.Open(ctx, "iser://"+tcpAddr+"/"+diskA+"/0", initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer iserDev.Close()
	srpDev, err := srpinitiator.Open(ctx, srpURL(t, cfg, srpAddr, 1, 1), srpinitiator.Options{Fabric: siw.New(siw.Options{})})
	if err != nil {
		t.Fatal("SRP to the second target:", err)
	}
	defer srpDev.Close()
	if srpDev.Size() != 2<<20 {
		t.Fatalf("SRP reached a LUN of %d bytes, want target B's LUN 1 (2 MiB)", srpDev.Size())
	}
	// Data written over SRP to B's LUN 1 is B's, not A's.
	want := bytes.Repeat([]byte("srp->b"), 512/6+1)[:512]
	if _, err := srpDev.WriteAt(want, 4096); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 512)
	if _, err := tcpDev.ReadAt(got, 4096); err != nil || bytes.Equal(got, want) {
		t.Fatalf("target A's LUN 0 has what went to B's LUN 1 (err %v)", err)
	}

	// The administration API (over its socket) lists all three.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", cfg.AdminSocket)
	}}}
	var ss []admin.Session
	fabrics := map[string]admin.Session{}
	// A command is counted once its response is out, so the initiator
	// may hear of the write before the count moves: ask again briefly.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := hc.Get("http://blockwire/sessions")
		if err != nil {
			t.Fatal(err)
		}
		ss = nil
		err = json.NewDecoder(resp.Body).Decode(&ss)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range ss {
			fabrics[s.Fabric] = s
		}
		if fabrics["srp"].Commands["write"] > 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, f := range []string{"iscsi", "iser", "srp"} {
		if _, ok := fabrics[f]; !ok {
			t.Errorf("admin sessions: no %s session in %+v", f, ss)
		}
	}
	if s := fabrics["srp"]; s.Target != diskB || len(s.Connections) != 1 || s.Commands["write"] == 0 {
		t.Errorf("SRP session %+v: want target %s, one channel, a write", s, diskB)
	}

	// The metrics carry a series per fabric.
	mresp, err := http.Get("http://" + portal(t, n, "metrics") + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	for _, f := range []string{"iscsi", "iser", "srp"} {
		if !strings.Contains(string(body), `blockwire_sessions{fabric="`+f+`",type="normal"} 1`) {
			t.Errorf("metrics: no blockwire_sessions of fabric %s at 1", f)
		}
		if !strings.Contains(string(body), `blockwire_session_commands_total{class="read",fabric="`+f+`"`) {
			t.Errorf("metrics: no per-session series of fabric %s", f)
		}
	}

	// A target added live is served over SRP as well; one removed ends
	// its SRP session.
	ncfg := n.Config()
	ncfg.Targets = append(ncfg.Targets, config.Target{Name: diskC, LUNs: []config.LUN{{ID: 0, Size: "1MiB"}}})
	ncfg.Targets = slices.DeleteFunc(ncfg.Targets, func(t config.Target) bool { return t.Name == diskB })
	ch, err := n.Apply(ncfg, node.Consent{Force: true}) // diskB has an SRP session
	if err != nil {
		t.Fatal(err)
	}
	if len(ch.Applied) != 2 || len(ch.Restart) != 0 {
		t.Errorf("Apply: %+v, want a target added and one removed, nothing waiting for a restart", ch)
	}
	cIdx := slices.IndexFunc(ncfg.Targets, func(t config.Target) bool { return t.Name == diskC })
	srpC, err := srpinitiator.Open(ctx, srpURL(t, ncfg, srpAddr, cIdx, 0), srpinitiator.Options{Fabric: siw.New(siw.Options{})})
	if err != nil {
		t.Fatal("SRP to a target added by Apply:", err)
	}
	defer srpC.Close()
	if srpC.Size() != 1<<20 {
		t.Errorf("SRP reached %d bytes, want target C's 1 MiB", srpC.Size())
	}
	if _, err := srpDev.ReadAt(got, 0); err == nil {
		t.Error("a read on the SRP session of a removed target succeeded")
	}
	for _, s := range n.Sessions() {
		if s.Target == diskB {
			t.Errorf("session of removed target %s still listed: %+v", diskB, s)
		}
	}
	// The portal change waits for a restart, and says so.
	ncfg = n.Config()
	ncfg.Listen = append(ncfg.Listen, "127.0.0.1:0")
	if ch, err = n.Apply(ncfg, node.Consent{}); err != nil || !slices.Contains(ch.Restart, "listen") {
		t.Errorf("Apply of a new portal: %+v, %v; want listen among the restart fields", ch, err)
	}
}

// TestPortalServesOnlyItsTargets: a [[portal]] naming its targets serves
// those and no other — a target no iSCSI portal serves is neither listed
// by SendTargets nor reachable by a login.
func TestPortalServesOnlyItsTargets(t *testing.T) {
	cfg := &config.Config{
		Portals: []config.Portal{{Transport: config.ISCSI, Address: "127.0.0.1:0", Targets: []string{diskA}}},
		Targets: []config.Target{
			{Name: diskA, LUNs: []config.LUN{{ID: 0, Size: "1MiB"}}},
			{Name: diskB, LUNs: []config.LUN{{ID: 0, Size: "1MiB"}}},
		}}
	n := startNode(t, cfg, node.Options{})
	addr := portal(t, n, config.ISCSI)
	ctx := context.Background()
	found, err := initiator.Discover(ctx, addr, initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 1 || found[0].Name != diskA {
		t.Errorf("SendTargets lists %+v, want %s alone", found, diskA)
	}
	if d, err := initiator.Open(ctx, "iscsi://"+addr+"/"+diskB+"/0", initiator.Options{Dialer: &fabric.Dialer{}}); err == nil {
		d.Close()
		t.Fatalf("logged in to %s through a portal that does not serve it", diskB)
	}
	d, err := initiator.Open(ctx, "iscsi://"+addr+"/"+diskA+"/0", initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
}

// An RDMA device that is not there stops the node at start with a clear
// error (not a portal that silently never serves); "soft" and "auto" on
// an address without a kernel RDMA device use the software RoCEv2 device.
func TestRDMADeviceChoice(t *testing.T) {
	cfg := &config.Config{
		Listen: []string{"127.0.0.1:0"}, ROCEListen: []string{"127.0.0.1:3260"}, RDMADevice: "nosuch0", ROCEUDPPort: 47910,
		Targets: []config.Target{{Name: diskA, LUNs: []config.LUN{{ID: 0, Size: "1MiB"}}}}}
	if _, err := node.New(cfg, node.Options{}); err == nil || !strings.Contains(err.Error(), "RDMA device") {
		t.Fatalf("a missing RDMA device: %v", err)
	}
	for _, choice := range []string{"soft", "auto", ""} {
		cfg.RDMADevice = choice
		n := startNode(t, cfg, node.Options{})
		if a := portal(t, n, config.ISERRoCE); a == "" {
			t.Fatalf("rdma_device %q: no iSER RDMA/CM portal", choice)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		n.Shutdown(ctx)
		cancel()
	}
}

// TestBoundsHitNamesEveryBound: a node with only an iSCSI portal shows
// every fabric's bounds at 0 (the metrics series exist before a peer
// meets one), under the names a node that has each fabric's server,
// device and control listener reports.
func TestBoundsHitNamesEveryBound(t *testing.T) {
	target := []config.Target{{Name: diskA, LUNs: []config.LUN{{Size: "1MiB"}}}}
	bare := startNode(t, &config.Config{Listen: []string{"127.0.0.1:0"}, Targets: target}, node.Options{})
	pc, err := net.ListenPacket("udp4", "127.0.0.3:0")
	if err != nil {
		t.Fatal(err)
	}
	udp := pc.LocalAddr().(*net.UDPAddr).Port
	pc.Close()
	full := startNode(t, &config.Config{Listen: []string{"127.0.0.1:0"}, SRPListen: []string{"127.0.0.1:0"},
		ROCEListen: []string{"127.0.0.3:3260"}, ROCEUDPPort: udp, Metrics: "127.0.0.1:0", AdminSocket: filepath.Join(t.TempDir(), "admin.sock"),
		Targets: target}, node.Options{})
	got, want := bare.BoundsHit(), full.BoundsHit()
	for _, fabric := range []string{"iscsi", "srp", "iwarp", "roce", "control"} {
		g, w := slices.Sorted(maps.Keys(got[fabric])), slices.Sorted(maps.Keys(want[fabric]))
		if len(w) == 0 || !slices.Equal(g, w) {
			t.Errorf("%s: a bare node names %v, a node serving it %v", fabric, g, w)
		}
		for b, v := range got[fabric] {
			if v != 0 {
				t.Errorf("%s %s: %d on a node nobody reached", fabric, b, v)
			}
		}
	}
}

// TestRevocationReachesLiveSessions: an ACL change applies to sessions
// already logged in, on every fabric: the iSCSI initiator and the SRP port
// the new rules no longer admit lose their sessions at once (their reads
// fail), while an iSCSI initiator still admitted keeps reading.
func TestRevocationReachesLiveSessions(t *testing.T) {
	const kept, revoked = "iqn.2026-11.org.example:kept", "iqn.2026-11.org.example:revoked"
	cfg := &config.Config{Listen: []string{"127.0.0.1:0"}, SRPListen: []string{"127.0.0.1:0"},
		Targets: []config.Target{{Name: diskA, LUNs: []config.LUN{{ID: 0, Size: "1MiB"}}}}}
	n := startNode(t, cfg, node.Options{})
	ctx := context.Background()
	tcpAddr, srpAddr := portal(t, n, config.ISCSI), portal(t, n, config.SRP)
	open := func(name string) *initiator.Device {
		d, err := initiator.Open(ctx, "iscsi://"+tcpAddr+"/"+diskA+"/0", initiator.Options{Dialer: &fabric.Dialer{}, InitiatorName: name})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	k, r := open(kept), open(revoked)
	srpDev, err := srpinitiator.Open(ctx, srpURL(t, cfg, srpAddr, 0, 0), srpinitiator.Options{Fabric: siw.New(siw.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	defer srpDev.Close()
	buf := make([]byte, 512)
	for _, rd := range []func() error{
		func() error { _, err := k.ReadAt(buf, 0); return err },
		func() error { _, err := r.ReadAt(buf, 0); return err },
		func() error { _, err := srpDev.ReadAt(buf, 0); return err },
	} {
		if err := rd(); err != nil {
			t.Fatal(err)
		}
	}
	// Only kept, over iSCSI; an SRP port that is not ours over SRP.
	ncfg := n.Config()
	ncfg.Targets[0].Initiators = []string{kept}
	ncfg.Targets[0].SRPInitiators = []string{"0x0000000000000001:0x00000000000000aa"}
	if _, err := n.Apply(ncfg, node.Consent{}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.ReadAt(buf, 0); err != nil {
		t.Errorf("the initiator still admitted: %v", err)
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := r.ReadAtContext(rctx, buf, 0); err == nil {
		t.Error("the revoked iSCSI initiator still reads")
	}
	if _, err := srpDev.ReadAt(buf, 0); err == nil {
		t.Error("the revoked SRP port still reads")
	}
}

// TestLUNMapChangeReachesLiveSessions: a new LUN map in an ACL entry
// holds at once for sessions already logged in, on iSCSI and SRP alike,
// without ending them: each initiator's LUN 0 reaches the device's LUN 1
// after the change (the unit attention that tells it is taken in stride),
// and an initiator whose entry did not change still reads its own LUN 0.
func TestLUNMapChangeReachesLiveSessions(t *testing.T) {
	const (
		iqn   = "iqn.2026-11.org.example:mapped"
		other = "iqn.2026-11.org.example:other"
	)
	port := srp.MakePortID(0x1, 0xab)
	cfg := &config.Config{Listen: []string{"127.0.0.1:0"}, SRPListen: []string{"127.0.0.1:0"},
		Targets: []config.Target{{Name: diskA, LUNs: []config.LUN{{ID: 0, Size: "1MiB"}, {ID: 1, Size: "1MiB"}},
			ACL: []config.ACL{{Initiator: iqn, LUNs: []string{"0"}}, {Initiator: other}, {SRPInitiator: port.String(), LUNs: []string{"0"}}}}}}
	n := startNode(t, cfg, node.Options{})
	ctx := context.Background()
	tcpAddr, srpAddr := portal(t, n, config.ISCSI), portal(t, n, config.SRP)
	open := func(name string, lun int) *initiator.Device {
		d, err := initiator.Open(ctx, fmt.Sprintf("iscsi://%s/%s/%d", tcpAddr, diskA, lun), initiator.Options{Dialer: &fabric.Dialer{}, InitiatorName: name})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	// Device LUN 1 holds a marker, written by the initiator that sees all.
	marker := bytes.Repeat([]byte("lun-one!"), 64)
	if _, err := open(other, 1).WriteAt(marker, 0); err != nil {
		t.Fatal(err)
	}
	o, m := open(other, 0), open(iqn, 0)
	srpDev, err := srpinitiator.Open(ctx, srpURL(t, cfg, srpAddr, 0, 0), srpinitiator.Options{Fabric: siw.New(siw.Options{}), Initiator: port})
	if err != nil {
		t.Fatal(err)
	}
	defer srpDev.Close()
	buf := make([]byte, 512)
	reads := map[string]func() ([]byte, error){
		"iSCSI": func() ([]byte, error) { _, err := m.ReadAt(buf, 0); return buf, err },
		"SRP":   func() ([]byte, error) { _, err := srpDev.ReadAt(buf, 0); return buf, err },
	}
	for what, rd := range reads {
		if b, err := rd(); err != nil || bytes.Equal(b, marker) {
			t.Fatalf("%s before the change: %v (LUN 1's marker: %v)", what, err, bytes.Equal(b, marker))
		}
	}
	ncfg := n.Config()
	ncfg.Targets[0].ACL[0].LUNs = []string{"0=1"}
	ncfg.Targets[0].ACL[2].LUNs = []string{"0=1"}
	if _, err := n.Apply(ncfg, node.Consent{}); err != nil {
		t.Fatal(err)
	}
	for what, rd := range reads {
		if b, err := rd(); err != nil || !bytes.Equal(b, marker) {
			t.Errorf("%s after its LUN 0 was mapped to LUN 1: %v (LUN 1's marker: %v)", what, err, bytes.Equal(b, marker))
		}
	}
	if _, err := o.ReadAt(buf, 0); err != nil || bytes.Equal(buf, marker) {
		t.Errorf("the initiator whose view did not change: %v (LUN 1's marker: %v)", err, bytes.Equal(buf, marker))
	}
}
