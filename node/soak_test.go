package node_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/initiator"
	"github.com/blockwire/blockwire/node"
	"github.com/blockwire/blockwire/nvme/tcphost"
	"github.com/blockwire/blockwire/rdma/roce"
	"github.com/blockwire/blockwire/rdma/siw"
	"github.com/blockwire/blockwire/srp/srpinitiator"
)

// TestLoginCyclesLeakNothing: sessions opened and ended over and over on
// every fabric a node serves — iSCSI/TCP, iSER on the software iWARP and
// RoCEv2 devices, SRP on both, NVMe/TCP controllers — each writing and reading a block, ended
// in turn by a logout and by the target dropping it (as an administrator
// does, or a revocation). Afterwards the node holds what it held before
// the cycles: goroutines, file descriptors and live memory are back at
// their baseline, and no session is left. (Each iSER connection and SRP
// channel used to leave its memory regions registered, each holding the
// buffer it last mapped: +34 MiB over 5000 sessions.) BLOCKWIRE_SOAK_CYCLES
// sets the cycles per fabric (default 100; .ci/run's soak asks for 1000);
// BLOCKWIRE_SOAK_HEAP names a file for a heap profile taken after them.
func TestLoginCyclesLeakNothing(t *testing.T) {
	cycles := 100
	if v := os.Getenv("BLOCKWIRE_SOAK_CYCLES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("BLOCKWIRE_SOAK_CYCLES=%q", v)
		}
		cycles = n
	}
	pc, err := net.ListenPacket("udp4", "127.0.0.6:0")
	if err != nil {
		t.Fatal(err)
	}
	udp := pc.LocalAddr().(*net.UDPAddr).Port
	pc.Close()
	cfg := &config.Config{Listen: []string{"127.0.0.1:0"}, SRPListen: []string{"127.0.0.1:0"},
		ROCEListen: []string{"127.0.0.6:3260"}, SRPROCEListen: []string{"127.0.0.6:5555"}, ROCEUDPPort: udp, RDMADevice: "soft",
		NVMeListen: []string{"127.0.0.1:0"},
		Targets:    []config.Target{{Name: diskA, LUNs: []config.LUN{{ID: 0, Size: "4MiB"}}}}}
	n := startNode(t, cfg, node.Options{})
	tcpAddr, srpAddr, nvmeAddr := portal(t, n, config.ISCSI), portal(t, n, config.SRP), portal(t, n, config.NVMeTCP)
	ini, err := roce.Open("127.0.0.7", roce.Options{Port: udp})
	if err != nil {
		t.Fatal(err)
	}
	defer ini.Close()
	ctx := context.Background()
	type blockDev interface {
		WriteAt([]byte, int64) (int, error)
		ReadAt([]byte, int64) (int, error)
		Close() error
	}
	fabrics := []struct {
		name string
		open func() (blockDev, error)
	}{
		{"iSCSI/TCP", func() (blockDev, error) {
			return initiator.Open(ctx, "iscsi://"+tcpAddr+"/"+diskA+"/0", initiator.Options{Dialer: &fabric.Dialer{}})
		}},
		{"iSER/iWARP", func() (blockDev, error) {
			return initiator.Open(ctx, "iser://"+tcpAddr+"/"+diskA+"/0", initiator.Options{Dialer: &fabric.Dialer{}})
		}},
		{"iSER/RoCE", func() (blockDev, error) {
			return initiator.Open(ctx, "iser://127.0.0.6:3260/"+diskA+"/0", initiator.Options{Dialer: &fabric.Dialer{RDMA: ini}})
		}},
		{"SRP/iWARP", func() (blockDev, error) {
			return srpinitiator.Open(ctx, srpURL(t, cfg, srpAddr, 0, 0), srpinitiator.Options{Fabric: siw.New(siw.Options{})})
		}},
		{"SRP/RoCE", func() (blockDev, error) {
			return srpinitiator.Open(ctx, srpURL(t, cfg, "127.0.0.6:5555", 0, 0), srpinitiator.Options{Fabric: ini, PD: ini.RDMA().AllocPD()})
		}},
		{"NVMe/TCP", func() (blockDev, error) {
			return tcphost.Open(ctx, "nvme+tcp://"+nvmeAddr+"/"+config.NQNPrefix+diskA+"/1", tcphost.Options{IOQueues: 2})
		}},
	}
	block := bytes.Repeat([]byte("soak"), 1024)
	cycle := func(i int, f int) {
		t.Helper()
		d, err := fabrics[f].open()
		if err != nil {
			t.Fatalf("%s, cycle %d: %v", fabrics[f].name, i, err)
		}
		off := int64(f) * 8192
		if _, err := d.WriteAt(block, off); err != nil {
			t.Fatalf("%s, cycle %d: write: %v", fabrics[f].name, i, err)
		}
		back := make([]byte, len(block))
		if _, err := d.ReadAt(back, off); err != nil || !bytes.Equal(back, block) {
			t.Fatalf("%s, cycle %d: read: %v (same data: %v)", fabrics[f].name, i, err, bytes.Equal(back, block))
		}
		if i%2 == 1 {
			// The target ends it: every session there is this one.
			for _, s := range n.Sessions() {
				n.DropSession(s.ID)
			}
		}
		d.Close()
	}
	settle := func() (goroutines, fds int, heap uint64) {
		for deadline := time.Now().Add(5 * time.Second); len(n.Sessions()) > 0 && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond)
		runtime.GC()
		runtime.GC() // what sync.Pools still cached is gone too
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		ents, _ := os.ReadDir("/proc/self/fd")
		return runtime.NumGoroutine(), len(ents), ms.HeapInuse
	}
	// A first cycle on each fabric starts what stays (LU workers, pools).
	for f := range fabrics {
		cycle(0, f)
		cycle(1, f)
	}
	g0, fd0, h0 := settle()
	start := time.Now()
	for i := range cycles {
		for f := range fabrics {
			cycle(i, f)
		}
	}
	took := time.Since(start)
	g1, fd1, h1 := settle()
	if p := os.Getenv("BLOCKWIRE_SOAK_HEAP"); p != "" {
		f, _ := os.Create(p)
		pprof.WriteHeapProfile(f)
		f.Close()
	}
	t.Logf("%d cycles on each of %d fabrics in %v: goroutines %d -> %d, descriptors %d -> %d, heap in use %d KiB -> %d KiB",
		cycles, len(fabrics), took.Round(time.Millisecond), g0, g1, fd0, fd1, h0>>10, h1>>10)
	if left := n.Sessions(); len(left) > 0 {
		t.Errorf("%d sessions left: %+v", len(left), left)
	}
	if g1 > g0+2 {
		t.Errorf("goroutines %d after the cycles, %d before", g1, g0)
	}
	if fd1 > fd0 {
		t.Errorf("file descriptors %d after the cycles, %d before", fd1, fd0)
	}
	if h1 > h0+1<<20 {
		t.Errorf("heap in use %d KiB after the cycles, %d KiB before", h1>>10, h0>>10)
	}
	if t.Failed() {
		buf := make([]byte, 1<<20)
		fmt.Fprintf(os.Stderr, "%s\n", buf[:runtime.Stack(buf, true)])
	}
}
