package iscsitarget

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/datamover/tcp"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/internal/servetest"
	"github.com/blockwire/blockwire/internal/waitfor"
	"github.com/blockwire/blockwire/iscsi/initiator"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/iscsi/text"
	"github.com/blockwire/blockwire/scsi"
	"github.com/blockwire/blockwire/scsitarget"
)

// sendCmd sends a SCSI Command without waiting for anything.
func (c *tclient) sendCmd(cdb []byte, read bool, edtl uint32, immediate bool, data []byte) uint32 {
	c.t.Helper()
	itt := c.itt
	c.itt++
	cmd := pdu.SCSICommand{Final: true, Read: read, Write: !read && edtl > 0, Attr: pdu.AttrSimple, ITT: itt, EDTL: edtl,
		CmdSN: c.cmdSN, ExpStatSN: c.expStatSN, Immediate: immediate}
	if !immediate {
		c.cmdSN++
	}
	copy(cmd.CDB[:], cdb)
	var h pdu.BHS
	cmd.Encode(&h)
	c.sendRaw(&h, nil, data)
	return itt
}

func (ts *testServer) tasks() int {
	n := 0
	ts.srv.mu.Lock()
	conns := make([]*conn, 0, len(ts.srv.conns))
	for c := range ts.srv.conns {
		conns = append(conns, c)
	}
	ts.srv.mu.Unlock()
	for _, c := range conns {
		c.mu.Lock()
		n += len(c.tasks)
		c.mu.Unlock()
	}
	return n
}

// TestImmediateCommandsCountAgainstTheWindow: commands with the immediate
// bit skip CmdSN ordering but not the window — beyond it they get a
// Reject "immediate command reject" (RFC 7143 §11.17.1, reason 0x06), and
// the target never holds more tasks than the window (2000
// immediate WRITEs held 2000 tasks).
func TestImmediateCommandsCountAgainstTheWindow(t *testing.T) {
	const window = 8
	ts := startServer(t, Options{CmdWindow: window}, nil)
	c := dial(t, ts.addr)
	c.mustLogin(normalKeys(ini)...)
	const n = 40
	for range n {
		c.sendCmd(write10(0, 1024), false, 512<<10, true, nil) // waits for R2Ts it never gets
	}
	rejects, r2ts := 0, 0
	for rejects+r2ts < n {
		h, _, ok := c.recv(5 * time.Second)
		if !ok {
			t.Fatalf("after %d rejects and %d R2Ts: no more answers", rejects, r2ts)
		}
		switch h.Opcode() {
		case pdu.OpReject:
			if h[2] != byte(pdu.RejectImmediateCmd) {
				t.Fatalf("Reject reason %#x, want %#x", h[2], pdu.RejectImmediateCmd)
			}
			rejects++
		case pdu.OpR2T:
			r2ts++
		}
	}
	if r2ts > window || rejects < n-window {
		t.Fatalf("%d immediate commands accepted, %d rejected, window %d", r2ts, rejects, window)
	}
	if got := ts.tasks(); got > window {
		t.Fatalf("the target holds %d tasks, window %d", got, window)
	}
}

// TestMaxCmdSNFollowsCompletions: MaxCmdSN opens the window only as
// commands finish, so tasks held by the target never exceed it; a command
// past it is ignored (MaxCmdSN moved with ExpCmdSN, so an
// initiator that never sent data could pile up any number of tasks).
func TestMaxCmdSNFollowsCompletions(t *testing.T) {
	const window = 4
	ts := startServer(t, Options{CmdWindow: window}, nil)
	c := dial(t, ts.addr)
	c.mustLogin(normalKeys(ini)...)
	first := c.cmdSN
	var maxSN uint32
	for i := range window {
		c.sendCmd(write10(uint32(i), 8), false, 4096, false, nil)
		h := c.nextNonNop(t)
		if h.Opcode() != pdu.OpR2T {
			t.Fatalf("got %s, want R2T", h.Opcode())
		}
		maxSN = binary.BigEndian.Uint32(h[32:])
	}
	if maxSN != first+window-1 {
		t.Fatalf("with %d commands waiting for data MaxCmdSN is %d, want %d (ExpCmdSN %d)", window, maxSN, first+window-1, c.cmdSN)
	}
	// One past MaxCmdSN: ignored, no task.
	c.sendCmd(tur(), false, 0, false, nil)
	if h, _, ok := c.recv(300 * time.Millisecond); ok && h.Opcode() != pdu.OpNopIn {
		t.Fatalf("a command beyond MaxCmdSN was answered: %s", h.Opcode())
	}
	if got := ts.tasks(); got != window {
		t.Fatalf("%d tasks held, want %d", got, window)
	}
}

// TestWindowOfOneKeepsMoving: with a window of one the response itself
// must reopen the window (the slot is free before it is sent), or the
// initiator would wait for a NOP-In.
func TestWindowOfOneKeepsMoving(t *testing.T) {
	ts := startServer(t, Options{CmdWindow: 1}, nil)
	d, err := initiator.Open(context.Background(), fmt.Sprintf("iscsi://%s/%s/0", ts.addr, testIQN), initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	buf := make([]byte, 4096)
	start := time.Now()
	for i := range 200 {
		if _, err := d.WriteAt(buf, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("200 writes at window 1 took %v", el)
	}
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestFloodStaysWithinTheIOBudget: sessions that ask for large reads and
// never read the answers, or start large writes and never send the data,
// hold at most their session's share of the I/O buffer budget — further
// commands get TASK SET FULL — and the whole target stays under the
// budget, while a well-behaved session keeps reading and writing (once,
// 60 immediate 16 MiB READs left unread took RSS from 0.54 to 1.30 GB).
// The readers' answers wait for writes that never end: each connection
// holds at most maxWorking of the LU's workers meanwhile (more than 64 of
// them otherwise), or the writer's answers would find none — on a memory
// LU, whose commands a receiver runs itself past that, and on one whose
// commands may block, where the commands beyond it wait for a worker
// (conn.toWorker).
func TestFloodStaysWithinTheIOBudget(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testFlood(t, nil) })
	t.Run("blocking", func(t *testing.T) {
		testFlood(t, func(tg *Target) {
			dev := scsitarget.NewDevice(testIQN, slog.New(slog.DiscardHandler))
			be, _ := mem.New(16 << 20)
			// The memory backend without its NonBlocking method.
			lu, err := scsitarget.NewLU(testIQN, scsitarget.LUConfig{Backend: struct{ backend.Backend }{be}})
			if err != nil {
				t.Fatal(err)
			}
			if lu.NonBlocking() {
				t.Fatal("the wrapped backend still says it never blocks")
			}
			dev.AddLU(lu)
			tg.Device = dev
		})
	})
}

func testFlood(t *testing.T, mod func(*Target)) {
	// Four floods from one host may hold at most half the budget (its
	// source's part), each its session's share.
	const budget, share = 64 << 20, 12 << 20
	ts := startServer(t, Options{CmdWindow: 128, Budget: blockcore.NewIOBudget(budget, share)}, mod)
	before := heapInUse()
	type flood struct {
		c           *tclient
		full, other int
	}
	var floods []*flood
	for i := range 4 {
		c := dialAt(t, ts.addr, net.IPv4(127, 0, 0, 3)) // the flooding host
		c.isid[5] = byte(i + 1)
		c.mustLogin(normalKeys(fmt.Sprintf("%s-%d", ini, i))...)
		floods = append(floods, &flood{c: c})
	}
	const cmds = 60
	for i, f := range floods {
		for range cmds {
			if i%2 == 0 {
				f.c.sendCmd(read10(0, 8192), true, 4<<20, false, nil) // 4 MiB read, never read back
			} else {
				f.c.sendCmd(write10(0, 8192), false, 4<<20, false, nil) // 4 MiB write, data never sent
			}
		}
	}
	// The writers' answers: R2Ts for those admitted, TASK SET FULL for the rest.
	for _, f := range floods[1:2] {
		for f.full+f.other < cmds {
			h, _, ok := f.c.recv(5 * time.Second)
			if !ok {
				t.Fatalf("writer: %d TASK SET FULL, %d others, then nothing", f.full, f.other)
			}
			switch h.Opcode() {
			case pdu.OpSCSIResponse:
				if h[3] != scsi.StatusTaskSetFull {
					t.Fatalf("writer: status %#x", h[3])
				}
				f.full++
			case pdu.OpR2T:
				f.other++
			}
		}
		if f.other*4<<20 > share || f.full == 0 {
			t.Fatalf("writer: %d commands admitted (%d MiB), %d TASK SET FULL; share %d MiB", f.other, f.other*4, f.full, share>>20)
		}
	}
	if src := ts.srv.opts.Budget.Used(); src > ts.srv.opts.Budget.SourceLimit() {
		t.Fatalf("the flooding host holds %d MiB, over its part %d MiB", src>>20, ts.srv.opts.Budget.SourceLimit()>>20)
	}
	// A well-behaved session of another host still works, at full speed.
	d, err := initiator.Open(context.Background(), fmt.Sprintf("iscsi://%s/%s/0", ts.addr, testIQN), initiator.Options{Dialer: &fabric.Dialer{}, InitiatorName: ini + "-good"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	buf := make([]byte, 256<<10)
	start := time.Now()
	for i := range 64 {
		if _, err := d.WriteAt(buf, int64(i%32)*int64(len(buf))); err != nil {
			t.Fatalf("good session write: %v", err)
		}
		if _, err := d.ReadAt(buf, int64(i%32)*int64(len(buf))); err != nil {
			t.Fatalf("good session read: %v", err)
		}
	}
	el := time.Since(start)
	used := ts.srv.opts.Budget.Used()
	grown := int64(heapInUse()) - int64(before)
	t.Logf("I/O budget %d MiB (session share %d MiB): %d MiB held by the floods; heap grew %d MiB; the good session did 64 writes and reads of 256 KiB in %v",
		budget>>20, share>>20, used>>20, grown>>20, el)
	if used > budget {
		t.Fatalf("I/O buffers %d bytes, over the budget %d", used, budget)
	}
	if grown > budget+16<<20 {
		t.Fatalf("heap grew by %d MiB under a %d MiB budget", grown>>20, budget>>20)
	}
	if el > 10*time.Second {
		t.Fatalf("the good session slowed to %v", el)
	}
}

func discoveryKeys(initiator string) []text.KV {
	return []text.KV{{Key: "InitiatorName", Value: initiator}, {Key: "SessionType", Value: "Discovery"}}
}

// TestDiscoverySessionsHaveTheirOwnLimit: discovery sessions (which need
// no target and, without discovery CHAP, no secret) have a small limit of
// their own and do not count against the sessions that carry data (once,
// 16 discovery sessions locked a correct login out at max_sessions 16).
func TestDiscoverySessionsHaveTheirOwnLimit(t *testing.T) {
	ts := startServer(t, Options{MaxSessions: 2, MaxDiscoverySessions: 3}, nil)
	ts.sessions(t, 3, discoveryKeys(ini))
	ts.refused(t, 9, discoveryKeys(ini), "fourth discovery session")
	for i := range 2 {
		c := dial(t, ts.addr)
		c.isid[5] = byte(20 + i)
		c.mustLogin(normalKeys(ini)...) // not locked out by the discovery sessions
	}
	ts.refused(t, 30, normalKeys(ini), "third normal session")
	ts.hit(t, "discovery_sessions", 1)
	ts.hit(t, "sessions", 1)
}

// hit fails t unless the server counts n hits of bound (BoundsHit, the
// metric blockwire_iscsi_bounds_hit_total).
func (ts *testServer) hit(t *testing.T, bound string, n uint64) {
	t.Helper()
	if got, ok := ts.srv.BoundsHit()[bound]; !ok || got != n {
		t.Fatalf("bound %s hit %d times (counted: %v), want %d", bound, got, ok, n)
	}
}

// TestLoginsInProgressPerSource: one address may hold only a few
// connections that have not finished logging in; more are closed at once,
// and another address still logs in.
func TestLoginsInProgressPerSource(t *testing.T) {
	ts := startServer(t, Options{MaxLoginsPerSource: 4, LoginTimeout: 5 * time.Second}, nil)
	idle := servetest.HoldIdle(t, ts.addr, 4)
	for i := range 3 {
		servetest.ClosedAtOnce(t, ts.addr, fmt.Sprintf("connection %d beyond the per-source limit", i))
	}
	ts.hit(t, "logins_per_source", 3)
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	nc, err := d.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	other := &tclient{t: t, nc: nc, r: bufio.NewReader(nc), isid: [6]byte{0x80, 0, 0, 0, 0, 7}, keys: map[string]string{}}
	defer nc.Close()
	other.mustLogin(normalKeys(ini)...)
	// A finished login frees its slot: close the idle ones, and the
	// first address logs in again.
	for _, c := range idle {
		c.Close()
	}
	time.Sleep(100 * time.Millisecond)
	c := dial(t, ts.addr)
	c.isid[5] = 40
	c.mustLogin(normalKeys(ini)...)
}

// TestPeerThatStopsReadingIsDropped: a session that asks for data and
// never reads it is dropped once a write has blocked for the NOP timeout;
// its tasks end and its share of the I/O budget comes back, while another
// session works throughout.
// It holds on the plain iSCSI/TCP acceptor and on the shared portal that
// serve opens by default.
func TestPeerThatStopsReadingIsDropped(t *testing.T) {
	t.Run("iSCSI/TCP", func(t *testing.T) { testPeerThatStopsReading(t, fabric.TCP) })
	t.Run("shared portal", func(t *testing.T) { testPeerThatStopsReading(t, sharedPortal) })
}

func testPeerThatStopsReading[A datamover.Acceptor](t *testing.T, accept func(net.Listener) A) {
	budget := blockcore.NewIOBudget(64<<20, 32<<20)
	var logs servetest.LogBuffer
	ts := startServerOn(t, Options{Budget: budget, NopInterval: -1, NopTimeout: 500 * time.Millisecond}, nil, &logs, accept)
	c := dial(t, ts.addr)
	c.nc.(*net.TCPConn).SetReadBuffer(4096)
	c.mustLogin(normalKeys(ini)...)
	for range 16 {
		c.sendCmd(read10(0, 2048), true, 1<<20, false, nil) // 16 MiB asked for, never read
	}
	deadline := time.Now().Add(5 * time.Second)
	waitfor.True(t, 5*time.Second, func() bool { return budget.Used() != 0 }, func() string { return "the reads never held a buffer" })
	good, err := initiator.Open(context.Background(), fmt.Sprintf("iscsi://%s/%s/0", ts.addr, testIQN), initiator.Options{Dialer: &fabric.Dialer{}, InitiatorName: ini + "-good"})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	buf := make([]byte, 64<<10)
	for budget.Used() != 0 && time.Now().Before(deadline) {
		if _, err := good.ReadAt(buf, 0); err != nil {
			t.Fatalf("the other session: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if used := budget.Used(); used != 0 {
		t.Fatalf("5 s after the peer stopped reading, the budget still holds %d bytes", used)
	}
	if ts.tasks() != 0 {
		t.Fatalf("%d tasks left", ts.tasks())
	}
	if _, err := good.ReadAt(buf, 0); err != nil {
		t.Fatalf("the other session after the drop: %v", err)
	}
}

// TestPeerThatStopsReadingLeavesTheLUToOthers: a peer that asks for more
// data than the sockets hold and never reads it makes the workers
// answering it wait in their writes; those workers are counted out of
// the LU's (scsitarget.LU.Detach), so an LU with 4 workers goes on
// serving another initiator at once rather than after the send timeout;
// and the connection holds at most maxWorking of them, its further
// commands waiting for one of those (conn.toWorker).
func TestPeerThatStopsReadingLeavesTheLUToOthers(t *testing.T) {
	ts, lu := startServerBlockingLU(t, 4)
	c := dial(t, ts.addr)
	c.mustLogin(normalKeys(ini)...)
	for range 48 {
		c.sendCmd(read10(0, 4096), true, 2<<20, false, nil) // 2 MiB, never read
	}
	time.Sleep(500 * time.Millisecond) // the sockets fill
	if n := lu.Detached(); n < 4 || n > maxWorking+1 {
		t.Fatalf("%d answers wait for the peer that stopped reading, want 4 to %d", n, maxWorking+1)
	}
	servetest.ReadsWithin(t, 5*time.Second, 32, func() (servetest.Disk, error) {
		return initiator.Open(context.Background(), fmt.Sprintf("iscsi://%s/%s/0", ts.addr, testIQN), initiator.Options{Dialer: &fabric.Dialer{}, InitiatorName: ini + "-good"})
	}, "another initiator waits behind the workers of a peer that stopped reading")
}

// startServerBlockingLU starts a server whose LU has the workers given
// and may block (not NonBlocking), so that every command goes to a
// worker.
func startServerBlockingLU(t *testing.T, workers int) (*testServer, *scsitarget.LU) {
	t.Helper()
	var lu *scsitarget.LU
	ts := startServer(t, Options{}, func(tg *Target) {
		dev := scsitarget.NewDevice(testIQN, slog.New(slog.DiscardHandler))
		be, _ := mem.New(16 << 20)
		var err error
		lu, err = scsitarget.NewLU(testIQN, scsitarget.LUConfig{Backend: struct{ backend.Backend }{be}, Workers: workers})
		if err != nil {
			t.Fatal(err)
		}
		dev.AddLU(lu)
		tg.Device = dev
	})
	return ts, lu
}

// sessions logs n sessions in, the ISIDs ending in 1 to n.
func (ts *testServer) sessions(t *testing.T, n int, keys []text.KV) []*tclient {
	t.Helper()
	var cs []*tclient
	for i := range n {
		c := ts.dial(t)
		c.isid[5] = byte(i + 1)
		c.mustLogin(keys...)
		cs = append(cs, c)
	}
	return cs
}

// refused fails t unless a login with an ISID ending in isid gets "out of
// resources" (RFC 7143 §11.13.5).
func (ts *testServer) refused(t *testing.T, isid byte, keys []text.KV, what string) {
	t.Helper()
	c := dial(t, ts.addr)
	c.isid[5] = isid
	if st, _ := c.login(keys...); st != pdu.LoginStatusOutOfResources {
		t.Fatalf("%s: login status %04x, want 0302", what, st)
	}
}

// TestSessionsPerSource: one address (one initiator host) may hold only
// so many normal sessions, so a single peer cannot take all of the node's
// and lock every other initiator out. Beyond it a login fails with "out of
// resources" naming the limit; another address still logs in;
// reinstating a session is allowed at the limit; a logout frees a place.
func TestSessionsPerSource(t *testing.T) {
	ts := startServer(t, Options{MaxSessions: 16, MaxSessionsPerSource: 2}, nil)
	cs := ts.sessions(t, 2, normalKeys(ini))
	ts.refused(t, 9, normalKeys(ini), "third session from one address")
	ts.hit(t, "sessions_per_source", 1)
	// Discovery sessions have their own limit.
	disc := dial(t, ts.addr)
	disc.isid[5] = 10
	disc.mustLogin(discoveryKeys(ini)...)
	// Another address is not held back.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	nc, err := d.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	other := &tclient{t: t, nc: nc, r: bufio.NewReader(nc), isid: [6]byte{0x80, 0, 0, 0, 0, 11}, keys: map[string]string{}}
	other.mustLogin(normalKeys(ini)...)
	// Reinstatement replaces a session: allowed at the limit.
	again := dial(t, ts.addr)
	again.isid[5] = 1
	again.mustLogin(normalKeys(ini)...)
	// A logout frees a place once the session is gone.
	lo := pdu.LogoutReq{Immediate: true, Reason: pdu.LogoutCloseSession, ITT: cs[1].itt, CmdSN: cs[1].cmdSN}
	var h pdu.BHS
	lo.Encode(&h)
	cs[1].sendRaw(&h, nil, nil)
	if rh, _ := cs[1].must(2 * time.Second); rh.Opcode() != pdu.OpLogoutResp || rh[2] != 0 {
		t.Fatalf("logout: got %s response %d", rh.Opcode(), rh[2])
	}
	servetest.Eventually(t, 2*time.Second, "a login after a logout", func() error {
		next := dial(t, ts.addr)
		next.isid[5] = 12
		if st, _ := next.login(normalKeys(ini)...); st != 0 {
			next.nc.Close()
			return fmt.Errorf("login status %04x", st)
		}
		return nil
	})
}

// TestUnfinishedLoginsDoNotFloodTheLog: anyone who can reach a portal can
// open connections and never log in; each is dropped at the login timeout,
// and its warning must not give such a client a line of the log each. The
// first 16 are logged, then one in 1024, with the count.
func TestUnfinishedLoginsDoNotFloodTheLog(t *testing.T) {
	var log servetest.LogBuffer
	ts := startServerLog(t, Options{LoginTimeout: 100 * time.Millisecond, MaxLoginsPerSource: 64}, nil, &log)
	idle := servetest.HoldIdle(t, ts.addr, 40)
	for _, c := range idle {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("the target sent something to a connection that never logged in")
		}
	}
	if n := strings.Count(log.String(), "login not complete"); n != 16 {
		t.Fatalf("%d warnings for 40 unfinished logins, want the first 16:\n%s", n, log.String())
	}
	ts.hit(t, "login_timeout", 40)
}

// TestPeerThatStopsReadingOnManyConnections: one host that stops taking
// its answers on many sessions holds at most MaxWorkingPerSource of the
// LU's workers and answers (each connection alone holds maxWorking+1):
// past it, all its connections stop being read. An LU with 4 workers
// keeps serving another host at once — before the bound, ten such
// sessions held 330 answers, past the LU's 64, and the rest took its
// workers until the send timeout.
func TestPeerThatStopsReadingOnManyConnections(t *testing.T) {
	ts, lu := startServerBlockingLU(t, 4)
	const sessions = 10
	for i := range sessions {
		c := dial(t, ts.addr)
		c.nc.(*net.TCPConn).SetReadBuffer(4096)
		c.isid[5] = byte(i + 1)
		c.mustLogin(normalKeys(ini)...)
		for range 48 {
			c.sendCmd(read10(0, 512), true, 256<<10, false, nil) // never read
		}
	}
	// The sockets fill and the answers wait, up to the bound.
	waitfor.True(t, 10*time.Second, func() bool { return lu.Detached() >= defaultMaxWorkingPerSource }, func() string {
		return fmt.Sprintf("only %d answers wait for the host that stopped reading: the test did not reach the bound", lu.Detached())
	})
	time.Sleep(200 * time.Millisecond) // time to go past it, were it not held
	if n, max := lu.Detached(), defaultMaxWorkingPerSource+sessions; n > max {
		t.Fatalf("%d answers wait for one host that stopped reading, want at most %d", n, max)
	}
	if ts.srv.BoundsHit()["working_per_source"] == 0 {
		t.Fatal("the host's connections were held back, yet bounds_hit{working_per_source} is 0")
	}
	servetest.ReadsWithin(t, 5*time.Second, 32, func() (servetest.Disk, error) {
		return initiator.Open(context.Background(), fmt.Sprintf("iscsi://%s/%s/0", ts.addr, testIQN),
			initiator.Options{Dialer: dialFrom("127.0.0.2"), InitiatorName: ini + "-good"})
	}, "another host waits behind the workers of one that stopped reading on many connections")
}

// dialFrom dials iSCSI/TCP from its address: another host, on loopback.
type dialFrom string

func (d dialFrom) Dial(ctx context.Context, portal string, _ datamover.DialParams) (*datamover.Established, error) {
	nd := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(string(d))}}
	nc, err := nd.DialContext(ctx, "tcp", portal)
	if err != nil {
		return nil, err
	}
	return &datamover.Established{Open: func(st datamover.Stamper) datamover.Conn { return tcp.New(nc, st) }, Close: func() { nc.Close() }}, nil
}

// stalledDisk holds every read until gate is closed, counting the reads
// inside it. Only backend.Backend: it may block, so every command goes to
// a worker.
type stalledDisk struct {
	backend.Backend
	gate         chan struct{}
	inside, peak atomic.Int32
}

func (s *stalledDisk) ReadAt(p []byte, off int64) (int, error) {
	n := s.inside.Add(1)
	for {
		if p := s.peak.Load(); n <= p || s.peak.CompareAndSwap(p, n) {
			break
		}
	}
	<-s.gate
	s.inside.Add(-1)
	return s.Backend.ReadAt(p, off)
}

// TestStalledStorageStillAnswersPings: with the storage stalled and more
// commands outstanding than a connection may have on workers
// (maxWorking), or its address (MaxWorkingPerSource), the connections
// still read: a NOP-Out ping is answered, which is what keeps Linux from
// dropping a connection after its noop_out_timeout (5 s), and an ABORT
// TASK of a command still waiting for a worker is answered at once. The
// commands beyond the bound wait without holding a worker, and all run
// once the storage is back.
func TestStalledStorageStillAnswersPings(t *testing.T) {
	t.Run("one connection", func(t *testing.T) { testStalledStorage(t, 1, maxWorking+8, Options{}, maxWorking) })
	// Two sessions from one address, sharing a bound of 8: the commands
	// parked for the address's share (conn.waitSource) run too.
	t.Run("the address's share", func(t *testing.T) { testStalledStorage(t, 2, 12, Options{MaxWorkingPerSource: 8}, 8) })
}

func testStalledStorage(t *testing.T, conns, perConn int, opts Options, bound int32) {
	d, _ := mem.New(1 << 20)
	s := &stalledDisk{Backend: d, gate: make(chan struct{})}
	opts.NopInterval = -1
	ts := startServer(t, opts, onLU(t, scsitarget.LUConfig{Backend: s}))
	var cs []*tclient
	var itts [][]uint32
	for i := range conns {
		c := dial(t, ts.addr)
		c.isid[5] = byte(i + 1)
		c.mustLogin(normalKeys(ini)...)
		c.command(tur(), false, 0, nil, 0) // the power-on unit attention
		cs = append(cs, c)
	}
	for _, c := range cs {
		var is []uint32
		for i := range perConn {
			is = append(is, c.sendCmd(read10(uint32(i), 1), true, 512, false, nil))
		}
		itts = append(itts, is)
	}
	waitfor.True(t, 5*time.Second, func() bool { return s.inside.Load() >= bound }, func() string { return fmt.Sprintf("only %d reads reached the storage", s.inside.Load()) })
	// Every read is in the LU's task set, those in the storage and those
	// waiting for a worker alike: what an operator sees as
	// blockwire_lun_commands_in_progress.
	lu := ts.srv.targets[testIQN].Device.LU(0)
	waitfor.True(t, 5*time.Second, func() bool { return lu.InProgress() == conns*perConn }, func() string {
		return fmt.Sprintf("%d commands in progress on the LU, want the %d sent", lu.InProgress(), conns*perConn)
	})
	released := false
	defer func() {
		if !released {
			close(s.gate)
		}
	}()
	for _, c := range cs {
		nop := pdu.NopOut{Immediate: true, ITT: 0x7777, TTT: pdu.ReservedTTT, CmdSN: c.cmdSN, ExpStatSN: c.expStatSN}
		var h pdu.BHS
		nop.Encode(&h)
		c.sendRaw(&h, nil, nil)
		if rh, _, ok := c.recv(2 * time.Second); !ok || rh.Opcode() != pdu.OpNopIn || rh.ITT() != 0x7777 {
			t.Fatalf("no answer to a ping within 2 s while the storage is stalled (got %v, ok %v)", rh.Opcode(), ok)
		}
	}
	c := cs[0]
	last := itts[0][perConn-1]
	tmf := pdu.TaskMgmtReq{Immediate: true, Function: pdu.TMFAbortTask, ITT: 0x8888, RTT: last, CmdSN: c.cmdSN, RefCmdSN: c.cmdSN - 1, ExpStatSN: c.expStatSN}
	var h pdu.BHS
	tmf.Encode(&h)
	c.sendRaw(&h, nil, nil)
	if rh, _, ok := c.recv(2 * time.Second); !ok || rh.Opcode() != pdu.OpTaskMgmtResp || rh[2] != pdu.TMFRespComplete {
		t.Fatalf("ABORT TASK of a command waiting for a worker: got %v (response %d), ok %v, within 2 s", rh.Opcode(), rh[2], ok)
	}
	// The address's bound is checked before a command goes to a worker,
	// by each connection: each may pass it by one.
	if p, max := s.peak.Load(), bound+int32(conns); p > max {
		t.Fatalf("%d reads in the storage at once, at most %d", p, max)
	}

	close(s.gate)
	released = true
	for k, c := range cs {
		want := perConn
		if k == 0 {
			want-- // the aborted one
		}
		answered := map[uint32]bool{}
		for len(answered) < want {
			rh, _, ok := c.recv(5 * time.Second)
			if !ok {
				t.Fatalf("connection %d: %d of %d reads answered once the storage was back", k, len(answered), want)
			}
			if rh.Opcode() == pdu.OpSCSIResponse || rh.Opcode() == pdu.OpDataIn {
				if k == 0 && rh.ITT() == last {
					t.Fatal("the aborted read was answered")
				}
				if rh.Opcode() == pdu.OpSCSIResponse || rh.DataInStatus() {
					answered[rh.ITT()] = true
				}
			}
		}
		c.stillServes(t)
	}
	// A task leaves the table just after its answer is written.
	waitfor.True(t, 2*time.Second, func() bool { return ts.tasks() == 0 && lu.InProgress() == 0 }, func() string {
		return fmt.Sprintf("%d tasks left, %d commands in progress on the LU", ts.tasks(), lu.InProgress())
	})
}

// slowDisk takes delay over every read.
type slowDisk struct {
	backend.Backend
	delay time.Duration
}

func (s *slowDisk) ReadAt(p []byte, off int64) (int, error) {
	time.Sleep(s.delay)
	return s.Backend.ReadAt(p, off)
}

// TestParkedCommandsUnderChurn: commands waiting for a worker (parked for
// their address's share) end with their connection whatever ends it — a
// dropped socket, ABORT TASK SET, a Logout — while workers finish and
// unpark others, over three rounds. Afterwards no task and no buffer is
// left, and the address's share is whole again: a new session from it
// reads 40 blocks at once without waiting on counts that leaked.
func TestParkedCommandsUnderChurn(t *testing.T) {
	d, _ := mem.New(1 << 20)
	budget := blockcore.NewIOBudget(64<<20, 16<<20)
	ts := startServer(t, Options{NopInterval: -1, MaxWorkingPerSource: 8, Budget: budget},
		onLU(t, scsitarget.LUConfig{Backend: &slowDisk{Backend: d, delay: 5 * time.Millisecond}}))
	const reads = 40
	// until reads PDUs from c until one with opcode op arrives.
	until := func(c *tclient, op pdu.Opcode, what string) pdu.BHS {
		t.Helper()
		for {
			rh, _, ok := c.recv(10 * time.Second)
			if !ok {
				t.Fatalf("no %s", what)
			}
			if rh.Opcode() == op {
				return rh
			}
		}
	}
	isid := byte(1)
	session := func() *tclient {
		c := dial(t, ts.addr)
		c.isid[5] = isid
		isid++
		c.mustLogin(normalKeys(ini)...)
		c.command(tur(), false, 0, nil, 0) // the power-on unit attention
		return c
	}
	for range 3 {
		var cs []*tclient
		for range 4 {
			cs = append(cs, session())
		}
		for _, c := range cs {
			for i := range reads {
				c.sendCmd(read10(uint32(i), 1), true, 512, false, nil)
			}
		}
		time.Sleep(20 * time.Millisecond)
		cs[0].nc.Close()
		tmf := pdu.TaskMgmtReq{Immediate: true, Function: pdu.TMFAbortTaskSet, ITT: 0x8888, RTT: pdu.ReservedITT, CmdSN: cs[1].cmdSN, ExpStatSN: cs[1].expStatSN}
		var h pdu.BHS
		tmf.Encode(&h)
		cs[1].sendRaw(&h, nil, nil)
		if rh := until(cs[1], pdu.OpTaskMgmtResp, "answer to ABORT TASK SET"); rh[2] != pdu.TMFRespComplete {
			t.Fatalf("ABORT TASK SET: response %d", rh[2])
		}
		lo := pdu.LogoutReq{Immediate: true, Reason: pdu.LogoutCloseSession, ITT: 0x9999, CmdSN: cs[2].cmdSN, ExpStatSN: cs[2].expStatSN}
		lo.Encode(&h)
		cs[2].sendRaw(&h, nil, nil)
		until(cs[2], pdu.OpLogoutResp, "Logout Response")
		for n := 0; n < reads; {
			if rh := until(cs[3], pdu.OpDataIn, "read answer"); rh.DataInStatus() {
				n++
			}
		}
		for _, c := range cs {
			c.nc.Close()
		}
	}
	waitfor.True(t, 5*time.Second, func() bool { return ts.tasks() == 0 && budget.Used() == 0 }, func() string {
		return fmt.Sprintf("%d tasks and %d bytes of I/O budget left after the churn", ts.tasks(), budget.Used())
	})
	c := session()
	start := time.Now()
	for i := range reads {
		c.sendCmd(read10(uint32(i), 1), true, 512, false, nil)
	}
	for n := 0; n < reads; {
		if rh := until(c, pdu.OpDataIn, "read answer after the churn"); rh.DataInStatus() {
			n++
		}
	}
	// 40 reads of 5 ms, 9 at a time: about 25 ms; a leaked count would
	// leave them parked.
	t.Logf("40 reads after the churn in %v", time.Since(start).Round(time.Millisecond))
}

// TestWriteDataThatNeverComes: a WRITE whose Data-Out never comes used to
// hold its buffer and its share of the I/O budget for as long as its
// connection answered pings. Now, after DataTimeout without the data it
// owes, it is answered CHECK CONDITION, ABORTED COMMAND / INITIATOR
// RESPONSE TIMEOUT, its budget is given back, data sent for it late is
// discarded (the connection goes on), and the second such WRITE ends the
// connection.
func TestWriteDataThatNeverComes(t *testing.T) {
	budget := blockcore.NewIOBudget(64<<20, 32<<20)
	ts := startServer(t, Options{Budget: budget, DataTimeout: 300 * time.Millisecond, NopInterval: -1}, nil)
	c := dial(t, ts.addr)
	c.mustLogin(normalKeys(ini, text.KV{Key: "InitialR2T", Value: "Yes"}, text.KV{Key: "ImmediateData", Value: "No"})...)
	c.command(tur(), false, 0, nil, 0) // the power-on unit attention
	stalled := func() (itt uint32, r2t pdu.R2T) {
		t.Helper()
		itt = c.sendCmd(write10(0, 16), false, 8192, false, nil)
		h, _, ok := c.recv(2 * time.Second)
		if !ok || h.Opcode() != pdu.OpR2T {
			t.Fatalf("no R2T for the WRITE: %v %s", ok, h.Opcode())
		}
		if err := r2t.Decode(&h); err != nil {
			t.Fatal(err)
		}
		if u := budget.Used(); u != 8192 {
			t.Fatalf("the WRITE holds %d bytes of the budget, want 8192", u)
		}
		return itt, r2t
	}
	itt, r2t := stalled()
	start := time.Now()
	h, data, ok := c.recv(5 * time.Second)
	if !ok || h.Opcode() != pdu.OpSCSIResponse || h.ITT() != itt {
		t.Fatalf("no answer to the WRITE whose data never came: %v %s", ok, h.Opcode())
	}
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Errorf("answered after %v, before the data timeout", waited)
	}
	c.expStatSN = h.StatSN() + 1
	if h[3] != scsi.StatusCheckCondition || len(data) < 2+14 || data[2+2]&0xf != scsi.SenseAbortedCommand || data[2+12] != 0x4b || data[2+13] != 0x06 {
		t.Fatalf("status %#x sense % x, want CHECK CONDITION, ABORTED COMMAND 4B/06", h[3], data)
	}
	if u := budget.Used(); u != 0 {
		t.Errorf("%d bytes of the budget held after the WRITE ended", u)
	}
	ts.hit(t, "data_timeout", 1)
	// Its data, sent late, is discarded; the connection goes on.
	do := pdu.DataOut{Final: true, ITT: itt, TTT: r2t.TTT, Offset: 0, ExpStatSN: c.expStatSN}
	var dh pdu.BHS
	do.Encode(&dh)
	c.sendRaw(&dh, nil, make([]byte, 8192))
	if r := c.command(tur(), false, 0, nil, 0); r.status != 0 {
		t.Fatalf("TEST UNIT READY after late data: status %#x", r.status)
	}
	// A second on the connection ends it.
	stalled()
	for {
		h, _, ok := c.recv(5 * time.Second)
		if !ok {
			break
		}
		if h.Opcode() != pdu.OpSCSIResponse {
			t.Fatalf("%s while the second stalled WRITE waited", h.Opcode())
		}
	}
	if isTimeout(c.rerr) {
		t.Fatal("the connection stayed open after a second WRITE's data stopped coming")
	}
	ts.hit(t, "data_timeout", 2)
	if u := budget.Used(); u != 0 {
		t.Errorf("%d bytes of the budget held after the connection ended", u)
	}
}

// TestWritesBeyondTheR2TBoundWaitWithoutBuffers: a connection solicits
// the data of Options.SolicitedWrites WRITEs at most at once. The others
// wait in arrival order holding nothing of the I/O budget beyond the
// immediate data they brought, and get their R2Ts as earlier ones finish;
// every WRITE completes with its data in place. (A WRITE used to take its
// whole transfer's buffer at arrival: six 256 KiB WRITEs without their
// data held 1.5 MiB.)
func TestWritesBeyondTheR2TBoundWaitWithoutBuffers(t *testing.T) {
	for _, imm := range []int{0, 4096} {
		t.Run(fmt.Sprintf("immediate=%d", imm), func(t *testing.T) {
			const writes, blocks, size = 6, 512, 512 * 512
			budget := blockcore.NewIOBudget(64<<20, 32<<20)
			ts := startServer(t, Options{Budget: budget, SolicitedWrites: 2, NopInterval: -1}, nil)
			c := dial(t, ts.addr)
			keys := []text.KV{{Key: "InitialR2T", Value: "Yes"}, {Key: "ImmediateData", Value: "No"}}
			if imm > 0 {
				keys = []text.KV{{Key: "InitialR2T", Value: "Yes"}, {Key: "ImmediateData", Value: "Yes"}, {Key: "FirstBurstLength", Value: strconv.Itoa(imm)}}
			}
			c.mustLogin(normalKeys(ini, keys...)...)
			c.command(tur(), false, 0, nil, 0) // the power-on unit attention
			data := make([][]byte, writes)
			itts := make([]uint32, writes)
			for i := range writes {
				data[i] = bytes.Repeat([]byte{byte(0x10 + i)}, size)
				itts[i] = c.sendCmd(write10(uint32(i*blocks), blocks), false, size, false, data[i][:imm])
			}
			r2ts := map[uint32][]pdu.R2T{}
			status := map[uint32]byte{}
			// read takes the PDUs the target sends until done holds, or
			// for d when done is nil.
			read := func(d time.Duration, done func() bool) {
				t.Helper()
				for done == nil || !done() {
					h, _, ok := c.recv(d)
					if !ok {
						if done == nil && isTimeout(c.rerr) {
							return
						}
						t.Fatalf("waiting for the target: %v (R2Ts for %d WRITEs)", c.rerr, len(r2ts))
					}
					switch h.Opcode() {
					case pdu.OpR2T:
						var r pdu.R2T
						r.Decode(&h)
						r2ts[r.ITT] = append(r2ts[r.ITT], r)
					case pdu.OpSCSIResponse:
						status[h.ITT()] = h[3]
					default:
						t.Fatalf("unexpected %s", h.Opcode())
					}
				}
			}
			read(300*time.Millisecond, nil)
			if len(r2ts) != 2 || r2ts[itts[0]] == nil || r2ts[itts[1]] == nil {
				t.Fatalf("R2Ts for %d WRITEs (ITTs %v), want the first two", len(r2ts), slices.Collect(maps.Keys(r2ts)))
			}
			if u, want := budget.Used(), int64(2*size+(writes-2)*imm); u != want {
				t.Fatalf("the six WRITEs hold %d bytes of the budget, want %d (two whole, the rest their immediate data)", u, want)
			}
			for i, itt := range itts {
				// Its turn came when the one two before it finished.
				read(5*time.Second, func() bool { return len(r2ts[itt]) > 0 })
				if len(r2ts) > 2 {
					t.Fatalf("%d WRITEs solicited at once, bound 2", len(r2ts))
				}
				for _, r := range r2ts[itt] {
					for sent := uint32(0); sent < r.Desired; {
						n := min(r.Desired-sent, 8192)
						do := pdu.DataOut{Final: sent+n == r.Desired, ITT: itt, TTT: r.TTT, DataSN: sent / 8192, Offset: r.Offset + sent, ExpStatSN: c.expStatSN}
						var dh pdu.BHS
						do.Encode(&dh)
						c.sendRaw(&dh, nil, data[i][r.Offset+sent:r.Offset+sent+n])
						sent += n
					}
				}
				delete(r2ts, itt)
				read(5*time.Second, func() bool { _, ok := status[itt]; return ok })
				if status[itt] != scsi.StatusGood {
					t.Fatalf("WRITE %d: status %#x", i, status[itt])
				}
			}
			for i := range writes {
				r := c.command(read10(uint32(i*blocks), blocks), true, size, nil, 0)
				if r.status != scsi.StatusGood || !bytes.Equal(r.data, data[i]) {
					t.Fatalf("WRITE %d: read back status %#x, data equal %v", i, r.status, bytes.Equal(r.data, data[i]))
				}
			}
			if ts.srv.BoundsHit()["writes_waited"] != writes-2 {
				t.Errorf("writes_waited %d, want %d", ts.srv.BoundsHit()["writes_waited"], writes-2)
			}
			deadline := time.Now().Add(2 * time.Second)
			for budget.Used() != 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if u := budget.Used(); u != 0 {
				t.Errorf("%d bytes of the budget held after every WRITE ended", u)
			}
		})
	}
}

// TestWaitingWriteGetsThePlaceOfOneThatTimedOut: a WRITE in line for its
// R2Ts gets them when the one ahead of it ends without its data
// (DataTimeout), not only when one completes.
func TestWaitingWriteGetsThePlaceOfOneThatTimedOut(t *testing.T) {
	budget := blockcore.NewIOBudget(64<<20, 32<<20)
	ts := startServer(t, Options{Budget: budget, SolicitedWrites: 1, DataTimeout: 300 * time.Millisecond, NopInterval: -1}, nil)
	c := dial(t, ts.addr)
	c.mustLogin(normalKeys(ini, text.KV{Key: "InitialR2T", Value: "Yes"}, text.KV{Key: "ImmediateData", Value: "No"})...)
	c.command(tur(), false, 0, nil, 0) // the power-on unit attention
	first := c.sendCmd(write10(0, 16), false, 8192, false, nil)
	second := c.sendCmd(write10(16, 16), false, 8192, false, nil)
	h := c.nextNonNop(t)
	if h.Opcode() != pdu.OpR2T || h.ITT() != first {
		t.Fatalf("%s for ITT %#x, want the first WRITE's R2T", h.Opcode(), h.ITT())
	}
	if u := budget.Used(); u != 8192 {
		t.Fatalf("%d bytes of the budget held, want the first WRITE's 8192", u)
	}
	// The first ends (CHECK CONDITION) and the second gets its R2T, in
	// either order.
	var ended, solicited bool
	for range 2 {
		switch h = c.nextNonNop(t); {
		case h.Opcode() == pdu.OpSCSIResponse && h.ITT() == first && h[3] == scsi.StatusCheckCondition:
			ended = true
		case h.Opcode() == pdu.OpR2T && h.ITT() == second:
			solicited = true
		default:
			t.Fatalf("%s for ITT %#x status %#x, want the first WRITE ended and the second's R2T", h.Opcode(), h.ITT(), h[3])
		}
	}
	if !ended || !solicited {
		t.Fatalf("first ended %v, second solicited %v", ended, solicited)
	}
	if u := budget.Used(); u != 8192 {
		t.Fatalf("%d bytes of the budget held, want the second WRITE's 8192", u)
	}
	ts.hit(t, "writes_waited", 1)
}
