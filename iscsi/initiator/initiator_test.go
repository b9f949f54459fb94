package initiator

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/auth"
	"github.com/blockwire/blockwire/iscsi/iscsitarget"
	"github.com/blockwire/blockwire/scsitarget"
)

const tIQN = "iqn.2026-11.org.blockwire:init-test"

// startTarget runs our target in-process (the tests against software
// nobody here wrote — tgt, and qemu-img reading what we wrote — are in
// test/interop).
func startTarget(t testing.TB, be scsitarget.LUConfig, mod func(*iscsitarget.Target)) string {
	t.Helper()
	return startTargetOpts(t, be, mod, iscsitarget.Options{})
}

// startTargetOpts serves on a TCP port; with an iSER portal, the port
// takes iSER over software iWARP too (fabric.Portal).
func startTargetOpts(t testing.TB, be scsitarget.LUConfig, mod func(*iscsitarget.Target), opts iscsitarget.Options, iserPortal ...fabric.ISERPortal) string {
	t.Helper()
	srv := newTargetServer(t, be, mod, opts)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := fabric.TCP(l)
	if len(iserPortal) > 0 {
		a = fabric.Portal(l, iserPortal[0])
	}
	go srv.Serve(a)
	return l.Addr().String()
}

// newTargetServer is a server with tIQN on a memory LUN (unless be has a
// backend), shut down when the test ends; the caller serves its portals.
func newTargetServer(t testing.TB, be scsitarget.LUConfig, mod func(*iscsitarget.Target), opts iscsitarget.Options) *iscsitarget.Server {
	t.Helper()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dev := scsitarget.NewDevice(tIQN, log)
	if be.Backend == nil {
		m, _ := mem.New(64 << 20)
		be.Backend = m
	}
	lu, err := scsitarget.NewLU(tIQN, be)
	if err != nil {
		t.Fatal(err)
	}
	dev.AddLU(lu)
	srv := iscsitarget.NewServer(log, opts)
	tg := &iscsitarget.Target{Name: tIQN, Device: dev}
	if mod != nil {
		mod(tg)
	}
	srv.AddTarget(tg)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return srv
}

func TestDiscoverOpenReadWrite(t *testing.T) {
	addr := startTarget(t, scsitarget.LUConfig{}, nil)
	ctx := context.Background()
	found, err := Discover(ctx, addr, Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 1 || found[0].Name != tIQN || len(found[0].Addresses) != 1 || found[0].Addresses[0] != addr+",1" {
		t.Fatalf("discovered %+v", found)
	}
	d, err := Open(ctx, fmt.Sprintf("iscsi://%s/%s/0", addr, tIQN), Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Size() != 64<<20 || d.BlockSize() != 512 {
		t.Fatalf("size %d block %d", d.Size(), d.BlockSize())
	}
	data := make([]byte, 3<<20) // above the 1 MiB per-command split and FirstBurstLength
	rand.Read(data)
	if _, err := d.WriteAt(data, 1<<20); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(data))
	if _, err := d.ReadAt(back, 1<<20); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, data) {
		t.Fatal("read back differs")
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := d.Unmap(1<<20, 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ReadAt(back[:4096], 1<<20); err != nil || !bytes.Equal(back[:4096], make([]byte, 4096)) {
		t.Fatalf("unmapped range not zero: %v", err)
	}
	// Errors: unaligned, out of range, and a SCSI error decoded from sense.
	if _, err := d.ReadAt(back[:100], 0); err == nil {
		t.Fatal("unaligned read accepted")
	}
	if _, err := d.ReadAt(back[:512], d.Size()); err == nil {
		t.Fatal("read past the end accepted")
	}
	_, err = d.Do(ctx, []byte{0xc7, 0, 0, 0, 0, 0}, nil, nil)
	var se *SCSIError
	if !errors.As(err, &se) || se.Sense == nil || se.Sense.ASC != 0x20 {
		t.Fatalf("unknown opcode: %v", err)
	}
}

func TestPipelinedCommands(t *testing.T) {
	addr := startTarget(t, scsitarget.LUConfig{}, nil)
	d, err := Open(context.Background(), fmt.Sprintf("iscsi://%s/%s/0", addr, tIQN), Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64<<10)
			back := make([]byte, len(buf))
			for i := range 20 {
				rand.Read(buf)
				// Each worker its own 16 of the 512 slots: two workers
				// on one slot could read each other's data (20 slots per
				// worker overlapped from worker 25 on).
				off := int64(w*16+i%16) * int64(len(buf))
				if _, err := d.WriteAt(buf, off); err != nil {
					errs <- err
					return
				}
				if _, err := d.ReadAt(back, off); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(buf, back) {
					errs <- fmt.Errorf("worker %d: mismatch at %d", w, off)
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
}

func TestCHAP(t *testing.T) {
	addr := startTarget(t, scsitarget.LUConfig{}, func(tg *iscsitarget.Target) {
		tg.CHAP = &auth.Credentials{User: "alice", Secret: "alice-secret-1"}
		tg.MutualCHAP = &auth.Credentials{User: "tgt", Secret: "target-secret-2"}
	})
	ctx := context.Background()
	ok := Options{Dialer: &fabric.Dialer{}, CHAP: &auth.Credentials{User: "alice", Secret: "alice-secret-1"}, TargetCHAP: &auth.Credentials{User: "tgt", Secret: "target-secret-2"}}
	s, err := Login(ctx, addr, tIQN, ok)
	if err != nil {
		t.Fatalf("mutual CHAP: %v", err)
	}
	s.Close()
	bad := ok
	bad.TargetCHAP = &auth.Credentials{User: "tgt", Secret: "not-the-target"}
	if _, err := Login(ctx, addr, tIQN, bad); !errors.Is(err, ErrTargetAuth) {
		t.Fatalf("wrong target secret: %v", err)
	}
	bad = Options{Dialer: &fabric.Dialer{}, CHAP: &auth.Credentials{User: "alice", Secret: "wrong-secret-1"}}
	var le *LoginError
	if _, err := Login(ctx, addr, tIQN, bad); !errors.As(err, &le) || le.Class != 2 || le.Detail != 1 {
		t.Fatalf("wrong secret: %v", err)
	}
	if _, err := Login(ctx, addr, "iqn.2026-11.org.blockwire:nope", Options{Dialer: &fabric.Dialer{}}); !errors.As(err, &le) || le.Detail != 3 {
		t.Fatalf("unknown target: %v", err)
	}
}

// slowBackend blocks reads until released.
type slowBackend struct {
	*mem.Disk
	gate chan struct{}
}

func (b *slowBackend) ReadAt(p []byte, off int64) (int, error) {
	<-b.gate
	return b.Disk.ReadAt(p, off)
}

func TestCancelAbortsTask(t *testing.T) {
	m, _ := mem.New(8 << 20)
	be := &slowBackend{Disk: m, gate: make(chan struct{})}
	addr := startTarget(t, scsitarget.LUConfig{Backend: be}, nil)
	s, err := Login(context.Background(), addr, tIQN, Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Do(context.Background(), 0, []byte{0, 0, 0, 0, 0, 0}, nil, nil) // the power-on unit attention
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	go func() { time.Sleep(400 * time.Millisecond); close(be.gate) }()
	buf := make([]byte, 4096)
	_, err = s.Do(ctx, 0, rw16(0x88, 0, 8), nil, buf)
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled read returned %v", err)
	}
	// The session still works.
	if _, err := s.Do(context.Background(), 0, []byte{0, 0, 0, 0, 0, 0}, nil, nil); err != nil {
		var se *SCSIError
		if !errors.As(err, &se) { // a unit attention is fine
			t.Fatalf("after abort: %v", err)
		}
	}
}

// cutter is a TCP proxy whose connections can be cut.
type cutter struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newCutter(t *testing.T, target string) *cutter {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cutter{l: l}
	go func() {
		for {
			a, err := l.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", target)
			if err != nil {
				a.Close()
				continue
			}
			c.mu.Lock()
			c.conns = append(c.conns, a, b)
			c.mu.Unlock()
			go func() { io.Copy(a, b); a.Close(); b.Close() }()
			go func() { io.Copy(b, a); a.Close(); b.Close() }()
		}
	}()
	t.Cleanup(func() { l.Close(); c.cut() })
	return c
}

func (c *cutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, x := range c.conns {
		x.Close()
	}
	c.conns = nil
}

func TestReconnectReinstatesSession(t *testing.T) {
	addr := startTarget(t, scsitarget.LUConfig{}, nil)
	px := newCutter(t, addr)
	d, err := Open(context.Background(), fmt.Sprintf("iscsi://%s/%s/0", px.l.Addr(), tIQN), Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	data := make([]byte, 1<<20)
	rand.Read(data)
	if _, err := d.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	before := d.Session().TSIH()
	px.cut()
	back := make([]byte, len(data))
	if _, err := d.ReadAt(back, 0); err != nil {
		t.Fatalf("read after the connection was cut: %v", err)
	}
	if !bytes.Equal(back, data) {
		t.Fatal("data differs after recovery")
	}
	if d.Session().TSIH() == before {
		t.Fatal("no new session after the cut")
	}
}

func TestParseURL(t *testing.T) {
	u, err := ParseURL("iscsi://alice%secret@127.0.0.1:3261/iqn.2026-11.org.blockwire:default/3")
	if err != nil || u.User != "alice" || u.Password != "secret" || u.Portal != "127.0.0.1:3261" || u.Target != "iqn.2026-11.org.blockwire:default" || u.LUN != 3 {
		t.Fatalf("%+v %v", u, err)
	}
	u, err = ParseURL("iscsi://[::1]/iqn.x:y/0")
	if err != nil || u.Portal != "[::1]:3260" {
		t.Fatalf("%+v %v", u, err)
	}
	for _, bad := range []string{"http://x/y/0", "iscsi:///iqn/0", "iscsi://h/iqn/lun", "iscsi://@h/iqn/0"} {
		if _, err := ParseURL(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestMultipleConnections runs a session over two connections (MC/S) with
// pipelined, verified I/O, then cuts them and checks the reinstated session
// has both again.
func TestMultipleConnections(t *testing.T) {
	addr := startTarget(t, scsitarget.LUConfig{}, nil)
	px := newCutter(t, addr)
	d, err := Open(context.Background(), fmt.Sprintf("iscsi://%s/%s/0", px.l.Addr(), tIQN), Options{Dialer: &fabric.Dialer{}, Connections: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if n := d.Session().Connections(); n != 2 {
		t.Fatalf("session has %d connections, want 2", n)
	}
	run := func() {
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 256<<10)
				back := make([]byte, len(buf))
				for i := range 8 {
					rand.Read(buf)
					off := int64(w*8+i) * int64(len(buf))
					if _, err := d.WriteAt(buf, off); err != nil {
						errs <- err
						return
					}
					if _, err := d.ReadAt(back, off); err != nil {
						errs <- err
						return
					}
					if !bytes.Equal(buf, back) {
						errs <- fmt.Errorf("mismatch at %d", off)
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
	}
	run()
	px.cut()
	run()
	if n := d.Session().Connections(); n != 2 {
		t.Fatalf("after reinstatement the session has %d connections, want 2", n)
	}
}

// gatedBackend holds reads until released and says when one arrives.
type gatedBackend struct {
	*mem.Disk
	entered chan struct{}
	gate    chan struct{}
	once    sync.Once
}

func (b *gatedBackend) ReadAt(p []byte, off int64) (int, error) {
	b.once.Do(func() { close(b.entered) })
	<-b.gate
	return b.Disk.ReadAt(p, off)
}

// TestReplayAfterCutMidCommand cuts the connection while a read is in the
// target, and checks the read completes, correctly, through reinstatement
// and replay.
func TestReplayAfterCutMidCommand(t *testing.T) {
	m, _ := mem.New(8 << 20)
	want := make([]byte, 64<<10)
	rand.Read(want)
	m.WriteAt(want, 1<<20)
	be := &gatedBackend{Disk: m, entered: make(chan struct{}), gate: make(chan struct{})}
	addr := startTarget(t, scsitarget.LUConfig{Backend: be}, nil)
	px := newCutter(t, addr)
	s, err := Login(context.Background(), px.l.Addr().String(), tIQN, Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Do(context.Background(), 0, []byte{0, 0, 0, 0, 0, 0}, nil, nil) // unit attention
	got := make([]byte, len(want))
	done := make(chan error, 1)
	go func() {
		_, err := s.Do(context.Background(), 0, rw16(0x88, (1<<20)/512, uint32(len(want)/512)), nil, got)
		done <- err
	}()
	<-be.entered
	tsih := s.TSIH()
	px.cut()
	time.Sleep(100 * time.Millisecond)
	close(be.gate)
	select {
	case err := <-done:
		if err != nil {
			var se *SCSIError
			if !errors.As(err, &se) {
				t.Fatalf("replayed read: %v", err)
			}
			// A unit attention on the new nexus: the command was replayed
			// and reached the target; read again to check the data.
			if _, err := s.Do(context.Background(), 0, rw16(0x88, (1<<20)/512, uint32(len(want)/512)), nil, got); err != nil {
				t.Fatal(err)
			}
		}
	case <-time.After(20 * time.Second):
		t.Fatal("read did not complete after the cut")
	}
	if !bytes.Equal(got, want) {
		t.Fatal("replayed read returned wrong data")
	}
	if s.TSIH() == tsih {
		t.Fatal("session was not reinstated")
	}
}

func FuzzParseURL(f *testing.F) {
	f.Add("iscsi://alice%secret@127.0.0.1:3261/iqn.2026-11.org.blockwire:default/3")
	f.Add("iscsi://[::1]/iqn.x:y/0")
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseURL(s)
		if err != nil {
			return
		}
		if u.Portal == "" || (u.HasLUN && u.LUN > 65535) {
			t.Fatalf("%q parsed to %+v", s, u)
		}
		// The portal is what Login dials: a host, and a port.
		if h, _, err := net.SplitHostPort(withPort(u.Portal)); err != nil || h == "" {
			t.Fatalf("%q parsed to portal %q: %v", s, u.Portal, err)
		}
	})
}

func rw16(op byte, lba uint64, blocks uint32) []byte {
	cdb := make([]byte, 16)
	cdb[0] = op
	binary.BigEndian.PutUint64(cdb[2:], lba)
	binary.BigEndian.PutUint32(cdb[10:], blocks)
	return cdb
}

// A session given up and logged in again with its ISID is reinstated: the
// target ends the old one (its next command fails; it does not recover,
// recovery being off) and the new one works. Portals lists where each
// session logged in.
func TestLoginWithTheISIDOfAnEarlierSessionReinstatesIt(t *testing.T) {
	addr := startTarget(t, scsitarget.LUConfig{}, nil)
	isid := [6]byte{0x80, 0, 0, 0, 0, 7}
	opts := Options{Dialer: &fabric.Dialer{}, ISID: isid, RecoveryTimeout: -1, NopInterval: -1}
	ctx := context.Background()
	old, err := Login(ctx, addr, tIQN, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	tur := make([]byte, 6)
	// A session's first command may meet a unit attention (power on, or
	// the loss of an earlier nexus).
	do := func(s *Session) (err error) {
		for try := 0; try < 3; try++ {
			if _, err = s.Do(ctx, 0, tur, nil, nil); err == nil {
				return nil
			}
		}
		return err
	}
	if err := do(old); err != nil {
		t.Fatal(err)
	}
	s, err := Login(ctx, addr, tIQN, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.TSIH() == old.TSIH() {
		t.Fatalf("TSIH %d again: not a new session", s.TSIH())
	}
	if err := do(s); err != nil {
		t.Fatalf("the new session: %v", err)
	}
	// Its connection was closed by the target before the new login
	// completed; the initiator may take a moment to see the close.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := old.Do(ctx, 0, tur, nil, nil); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the old session still works after a login with its ISID")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := s.Portals(); len(got) != 1 || got[0] != withPort(addr) {
		t.Fatalf("Portals() = %q, want [%s]", got, addr)
	}
}
