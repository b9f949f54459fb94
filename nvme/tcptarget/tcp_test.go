package tcptarget

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/internal/sockpoll"
	"github.com/blockwire/blockwire/internal/waitfor"
	"github.com/blockwire/blockwire/nvme"
	"github.com/blockwire/blockwire/nvme/nvmetarget"
	"github.com/blockwire/blockwire/nvme/tcphost"
)

const testNQN = "nqn.2026-11.io.blockwire:test"

type fixture struct {
	t    testing.TB
	tgt  *nvmetarget.Target
	srv  *Server
	sub  *nvmetarget.Subsystem
	unit *blockcore.Unit
	addr string
}

// start serves one subsystem with a 16 MiB memory namespace (NSID 1) on
// a loopback port.
func start(t testing.TB, o Options, allow func(string, net.Addr) bool) *fixture {
	t.Helper()
	return startWith(t, o, nvmetarget.SubsystemConfig{NQN: testNQN, Allow: allow})
}

// startWith is start with the subsystem configured by sc.
func startWith(t testing.TB, o Options, sc nvmetarget.SubsystemConfig) *fixture {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, addr: l.Addr().String()}
	ap := l.Addr().(*net.TCPAddr).AddrPort()
	f.tgt = nvmetarget.New(nvmetarget.Options{Portals: func() []nvmetarget.Portal { return []nvmetarget.Portal{{ID: 1, Addr: ap}} }})
	f.sub, err = f.tgt.AddSubsystem(sc)
	if err != nil {
		t.Fatal(err)
	}
	be, err := mem.New(16 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if f.unit, err = blockcore.NewUnit(blockcore.UnitConfig{Backend: be, Identity: "test"}); err != nil {
		t.Fatal(err)
	}
	if err := f.sub.SetNamespace(1, f.unit); err != nil {
		t.Fatal(err)
	}
	o.Target = f.tgt
	f.srv = New(o)
	go f.srv.Serve(l)
	t.Cleanup(func() {
		f.srv.Close()
		f.unit.Close()
	})
	return f
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func (f *fixture) connect(o tcphost.Options) *tcphost.Controller {
	f.t.Helper()
	c, err := tcphost.Connect(ctx(f.t), f.addr, testNQN, o)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// TestReadWrite connects as a host does, with and without digests,
// writes in the capsule and through R2T (several H2CData PDUs), reads
// back, and checks the namespace's identity, compare, write zeroes,
// deallocate and flush; closing leaves no controller and no connection
// behind.
func TestReadWrite(t *testing.T) {
	for _, dg := range []bool{false, true} {
		t.Run(fmt.Sprintf("digests=%v", dg), func(t *testing.T) {
			// MAXH2CDATA 16 KiB: a 1 MiB write comes in 64 H2CData PDUs.
			f := start(t, Options{MaxH2CData: 16 << 10}, nil)
			c := f.connect(tcphost.Options{HeaderDigest: dg, DataDigest: dg, IOQueues: 2})
			cx := ctx(t)
			ids, err := c.Namespaces(cx)
			if err != nil || len(ids) != 1 || ids[0] != 1 {
				t.Fatalf("namespaces %v, %v; want [1]", ids, err)
			}
			ns, err := c.Namespace(cx, 1)
			if err != nil {
				t.Fatal(err)
			}
			if ns.Blocks != 16<<20/512 || ns.BlockSize != 512 || ns.NGUID != f.unit.ID() {
				t.Fatalf("namespace %+v; want %d blocks of 512, NGUID %x", ns, 16<<20/512, f.unit.ID())
			}
			if id := c.IdentifyController(); string(bytes.TrimRight(id[768:1024], "\x00")) != testNQN || id[111] != 1 {
				t.Fatalf("Identify Controller: SUBNQN %q, CNTRLTYPE %d", bytes.TrimRight(id[768:1024], "\x00"), id[111])
			}
			for _, size := range []int{512, 4096, 8192, 64 << 10, 1 << 20} {
				p := make([]byte, size)
				rand.Read(p)
				lba := uint64(size / 512)
				if err := c.Write(cx, 1, 512, lba, p, size == 4096); err != nil {
					t.Fatalf("write %d: %v", size, err)
				}
				got := make([]byte, size)
				if err := c.Read(cx, 1, 512, lba, got); err != nil {
					t.Fatalf("read %d: %v", size, err)
				}
				if !bytes.Equal(got, p) {
					t.Fatalf("read %d bytes back different", size)
				}
				if err := c.Compare(cx, 1, 512, lba, p); err != nil {
					t.Fatalf("compare %d: %v", size, err)
				}
				p[0] ^= 1
				var se *tcphost.StatusError
				if err := c.Compare(cx, 1, 512, lba, p); !errors.As(err, &se) || se.Status != nvme.StatusCompareFailure {
					t.Fatalf("compare of different data: %v, want compare failure", err)
				}
			}
			if err := c.WriteZeroes(cx, 1, 8, 8, false); err != nil {
				t.Fatal(err)
			}
			if err := c.Deallocate(cx, 1, 128, 128); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 4096)
			for _, lba := range []uint64{8, 128} {
				if err := c.Read(cx, 1, 512, lba, got); err != nil || !bytes.Equal(got, make([]byte, 4096)) {
					t.Fatalf("LBA %d after write zeroes / deallocate: %v, zeroes %v", lba, err, bytes.Equal(got, make([]byte, 4096)))
				}
			}
			if err := c.Flush(cx, 1); err != nil {
				t.Fatal(err)
			}
			if err := c.Flush(cx, 0xffffffff); err != nil {
				t.Fatal(err)
			}
			var se *tcphost.StatusError
			if err := c.Read(cx, 1, 512, 16<<20/512-1, make([]byte, 1024)); !errors.As(err, &se) || se.Status != nvme.StatusLBAOutOfRange {
				t.Fatalf("read past the end: %v, want LBA out of range", err)
			}
			if err := c.Read(cx, 2, 512, 0, got); !errors.As(err, &se) || se.Status != nvme.StatusInvalidNamespace {
				t.Fatalf("read of namespace 2: %v, want invalid namespace", err)
			}
			if n := f.tgt.Controllers(); n != 1 {
				t.Fatalf("%d controllers, want 1", n)
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			waitfor.True(t, 5*time.Second, func() bool { return f.tgt.Controllers() == 0 && f.srv.Conns() == 0 },
				func() string {
					return fmt.Sprintf("%d controllers, %d connections", f.tgt.Controllers(), f.srv.Conns())
				})
		})
	}
}

// TestFullQueue keeps a queue full for a while: the host sends a new
// command as soon as it sees an answer, which the target must take (its
// entry is free once answered, before the answer's write has returned).
func TestFullQueue(t *testing.T) {
	f := start(t, Options{}, nil)
	c := f.connect(tcphost.Options{QueueSize: 8})
	defer c.Close()
	cx := ctx(t)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := make([]byte, 4096)
			for i := range 200 {
				if err := c.Read(cx, 1, 512, uint64((g*200+i)%4096)*8, p); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if f.srv.Stats().Terminated.Load() != 0 {
		t.Fatal("a connection was terminated")
	}
}

// TestDiscovery reads the discovery log: the subsystem and the
// discovery subsystem on the portal.
func TestDiscovery(t *testing.T) {
	f := start(t, Options{}, nil)
	es, err := tcphost.Discover(ctx(t), f.addr, tcphost.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 || es[0].SubNQN != testNQN || es[0].Addr != f.addr || es[0].TrType != 3 || es[0].SubType != 2 ||
		es[1].SubNQN != nvmetarget.DiscoveryNQN || es[1].SubType != 3 {
		t.Fatalf("discovery log %+v", es)
	}
	waitfor.True(t, 5*time.Second, func() bool { return f.tgt.Controllers() == 0 }, func() string { return fmt.Sprint(f.tgt.Controllers(), " controllers") })
}

// TestAccess: a host not allowed is refused at Connect; Revoke ends a
// connected one at once.
func TestAccess(t *testing.T) {
	var aAllowed atomic.Bool // the socket orders nothing the race detector sees
	aAllowed.Store(true)
	allowed := func(h string, _ net.Addr) bool { return h == "nqn.2026-11.io.blockwire:host-a" && aAllowed.Load() }
	f := start(t, Options{}, allowed)
	if _, err := tcphost.Connect(ctx(t), f.addr, testNQN, tcphost.Options{HostNQN: "nqn.2026-11.io.blockwire:host-b"}); err == nil {
		t.Fatal("a host not allowed connected")
	}
	c := f.connect(tcphost.Options{HostNQN: "nqn.2026-11.io.blockwire:host-a"})
	defer c.Close()
	if err := c.Read(ctx(t), 1, 512, 0, make([]byte, 512)); err != nil {
		t.Fatal(err)
	}
	aAllowed.Store(false)
	if n := f.sub.Revoke(allowed); n != 1 {
		t.Fatalf("Revoke ended %d controllers, want 1", n)
	}
	if err := c.Read(ctx(t), 1, 512, 0, make([]byte, 512)); err == nil {
		t.Fatal("a revoked host still reads")
	}
	if r := f.tgt.Refusals()["host not allowed"]; r != 1 {
		t.Fatalf("refusals %v", f.tgt.Refusals())
	}
}

// TestKeepAliveEnforced: a controller whose host sends no Keep Alive
// within KATO is ended.
func TestKeepAliveEnforced(t *testing.T) {
	f := start(t, Options{}, nil)
	c := f.connect(tcphost.Options{KATO: time.Hour}) // the host's timer never fires
	defer c.Close()
	// The controller's: set to 200 ms through Set Features.
	if _, err := c.Admin(ctx(t), &nvme.Command{Opcode: nvme.AdminSetFeatures, CDW: [6]uint32{0x0f, 200}}, nil, tcphost.NoData); err != nil {
		t.Fatal(err)
	}
	waitfor.True(t, 5*time.Second, func() bool { return f.tgt.Controllers() == 0 && f.srv.Conns() == 0 },
		func() string {
			return fmt.Sprintf("%d controllers, %d connections", f.tgt.Controllers(), f.srv.Conns())
		})
}

// TestFusedCompareAndWrite: a fused Compare and Write writes only when
// the blocks match — in the capsule and through R2T — and answers both
// halves; a mismatch leaves the blocks as they were (Compare Failure,
// and the Write aborted as its fused partner failed).
func TestFusedCompareAndWrite(t *testing.T) {
	f := start(t, Options{}, nil)
	c := f.connect(tcphost.Options{})
	defer c.Close()
	cx := ctx(t)
	for _, size := range []int{512, 4096, 256 << 10} {
		old, neu := make([]byte, size), make([]byte, size)
		rand.Read(old)
		rand.Read(neu)
		if err := c.Write(cx, 1, 512, 0, old, false); err != nil {
			t.Fatal(err)
		}
		if err := c.CompareAndWrite(cx, 1, 512, 0, old, neu, false); err != nil {
			t.Fatalf("%d bytes, matching: %v", size, err)
		}
		got := make([]byte, size)
		if err := c.Read(cx, 1, 512, 0, got); err != nil || !bytes.Equal(got, neu) {
			t.Fatalf("%d bytes: the write did not happen (%v)", size, err)
		}
		var se *tcphost.StatusError
		if err := c.CompareAndWrite(cx, 1, 512, 0, old, old, true); !errors.As(err, &se) || se.Status != nvme.StatusCompareFailure {
			t.Fatalf("%d bytes, not matching: %v, want a compare failure", size, err)
		}
		if err := c.Read(cx, 1, 512, 0, got); err != nil || !bytes.Equal(got, neu) {
			t.Fatalf("%d bytes: a failed compare wrote (%v)", size, err)
		}
	}
}

// TestFusedHalfAlone: a fused first half followed by an ordinary command
// fails with Missing Fused Command and the ordinary one runs; a second
// half alone fails the same way.
func TestFusedHalfAlone(t *testing.T) {
	f := start(t, Options{}, nil)
	r := dialRaw(t, f.addr, false)
	r.connectAdmin(4)
	// An I/O queue of the controller, by hand.
	k := nvme.Connect{QID: 1, SQSize: 7, Data: nvme.ConnectData{CNTLID: 1, SubNQN: testNQN, HostNQN: "nqn.2026-11.io.blockwire:hostile"}}
	setq := nvme.Command{Opcode: nvme.AdminSetFeatures, CID: 5, CDW: [6]uint32{0x07, 0}}
	r.capsule(setq, nil)
	if c := r.response(); c.Status != 0 {
		t.Fatalf("Set Features: %v", c.Status)
	}
	io := dialRaw(t, f.addr, false)
	var cmd nvme.Command
	data := make([]byte, nvme.ConnectDataLen)
	k.Encode(&cmd, data)
	io.capsule(cmd, data)
	if c := io.response(); c.Status != 0 {
		t.Fatalf("I/O queue Connect: %v", c.Status)
	}
	block := make([]byte, 512)
	io.capsule(nvme.Command{Opcode: nvme.OpCompare, Fuse: nvme.FuseFirst, CID: 1, NSID: 1}, block)
	io.capsule(nvme.Command{Opcode: nvme.OpRead, CID: 2, NSID: 1, DPTR: nvme.SGL{Length: 512, ID: nvme.SGLTransportDataBlock}}, nil)
	got := map[uint16]nvme.Status{}
	for range 2 {
		c := io.response()
		got[c.CID] = c.Status
	}
	if got[1] != nvme.StatusFusedMissing || got[2] != 0 {
		t.Fatalf("answers %v: want the first half missing its partner, the read done", got)
	}
	io.capsule(nvme.Command{Opcode: nvme.OpWrite, Fuse: nvme.FuseSecond, CID: 3, NSID: 1}, block)
	if c := io.response(); c.CID != 3 || c.Status != nvme.StatusFusedMissing {
		t.Fatalf("a second half alone: %+v", c)
	}
}

// TestPolling: with Options.Poll the connections read through a polling
// reader; commands flow as without it, and an idle connection's reader
// sleeps (the read deadline-free wait of a quiet host still ends with
// its close).
func TestPolling(t *testing.T) {
	f := start(t, Options{Poll: sockpoll.NewGroup(500 * time.Microsecond)}, nil)
	c := f.connect(tcphost.Options{IOQueues: 2, QueueSize: 16})
	p := make([]byte, 64<<10)
	for i := range p {
		p[i] = byte(i * 13)
	}
	got := make([]byte, len(p))
	for i := range 50 {
		lba := uint64(i * 128)
		if err := c.Write(ctx(t), 1, 512, lba, p, false); err != nil {
			t.Fatal(err)
		}
		if err := c.Read(ctx(t), 1, 512, lba, got); err != nil || !bytes.Equal(got, p) {
			t.Fatalf("read back at %d: %v", lba, err)
		}
		if i == 25 {
			time.Sleep(20 * time.Millisecond) // past the polling time: the readers sleep, then wake
		}
	}
	c.Close()
	waitfor.True(t, 5*time.Second, func() bool { return f.tgt.Controllers() == 0 && f.srv.Conns() == 0 },
		func() string { return "controllers or connections left" })
}

// TestReaderAnswersAlone: a command that arrives alone (queue depth 1)
// on a unit that never blocks is answered by the reader itself, as it
// goes back to the socket — no hand-off to the writer; commands that
// arrive together, as many as a deep queue sends, are answered too,
// through the writer or the reader, each once.
func TestReaderAnswersAlone(t *testing.T) {
	f := start(t, Options{}, nil)
	h := f.connect(tcphost.Options{IOQueues: 1, QueueSize: 64})
	var c *conn
	f.srv.mu.Lock()
	for k := range f.srv.conns {
		if k.q != nil && k.q.ID() == 1 {
			c = k
		}
	}
	f.srv.mu.Unlock()
	if c == nil {
		t.Fatal("no I/O queue's connection")
	}
	p := make([]byte, 4096)
	const alone = 200
	for i := range alone {
		if err := h.Read(ctx(t), 1, 512, uint64(i*8), p); err != nil {
			t.Fatal(err)
		}
	}
	// A deep queue: 32 at a time, many times.
	const deep = 32 * 50
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := make([]byte, 4096)
			for i := range deep / 32 {
				if err := h.Read(ctx(t), 1, 512, uint64((w*64+i)*8), q); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	h.Close()
	<-c.writerDone
	waitfor.True(t, 5*time.Second, func() bool { return f.srv.Conns() == 0 }, func() string { return "connections left" })
	// Keep-alives and the like go through the writer: a few.
	if c.ownWritten < alone {
		t.Fatalf("the reader wrote %d answers, the writer %d; want the %d alone ones by the reader", c.ownWritten, c.writerWritten, alone)
	}
	if got := c.ownWritten + c.writerWritten; got < alone+deep || got > alone+deep+8 {
		t.Fatalf("%d answers written (reader %d, writer %d), want %d", got, c.ownWritten, c.writerWritten, alone+deep)
	}
	t.Logf("answers: %d by the reader, %d by the writer", c.ownWritten, c.writerWritten)
}
