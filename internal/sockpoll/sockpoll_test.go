package sockpoll

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/blockwire/blockwire/internal/servetest"

	"github.com/blockwire/blockwire/internal/prefixconn"
	"github.com/blockwire/blockwire/internal/spin"
)

// A Reader reads what arrives while it polls without sleeping, sleeps
// once its polling time has passed and still gets what comes later, and
// passes a portal's look-ahead bytes (prefixconn) on first.
func TestPollerReads(t *testing.T) {
	server, client := servetest.TCPPair(t)
	r := New(prefixconn.New(server, []byte("L")), NewGroup(2*time.Second))
	if r == nil {
		t.Fatal("no Reader for a TCP connection behind prefixconn")
	}
	buf := make([]byte, 16)
	if n, err := r.Read(buf); err != nil || string(buf[:n]) != "L" {
		t.Fatalf("first read %q, %v; want the look-ahead byte", buf[:n], err)
	}
	// Arrives while the reader polls.
	time.AfterFunc(20*time.Millisecond, func() { client.Write([]byte("while polling")) })
	if n, err := r.Read(buf); err != nil || string(buf[:n]) != "while polling" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	if r.polled != 1 || r.slept != 0 {
		t.Fatalf("polled %d, slept %d; want the read found by polling", r.polled, r.slept)
	}
	// Arrives after the polling time: the reader sleeps, then reads it.
	r.spin = spin.New(time.Millisecond)
	time.AfterFunc(100*time.Millisecond, func() { client.Write([]byte("after a sleep")) })
	if n, err := r.Read(buf); err != nil || string(buf[:n]) != "after a sleep" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	if r.slept != 1 {
		t.Fatalf("slept %d times, want 1", r.slept)
	}
	// That wait, 100 ms, was idleness: the polling time is halved.
	if got := r.spin.Current(); got != 500*time.Microsecond {
		t.Fatalf("polling after an idle wait: %v, want 500µs", got)
	}
	// A read deadline still holds.
	r.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	start := time.Now()
	if _, err := r.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v", err)
	}
	if took := time.Since(start); took < 40*time.Millisecond {
		t.Fatalf("the deadline's error came after %v, want 50ms", took)
	}
	r.SetReadDeadline(time.Time{})
	// The peer's close is an EOF.
	r.spin = spin.New(300 * time.Millisecond)
	client.Write([]byte("last"))
	client.Close()
	got, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(got, []byte("last")) {
		t.Fatalf("read to the end: %q, %v", got, err)
	}
}

// A reset connection is reported as net.Conn's Read reports it.
func TestPollerReportsAReset(t *testing.T) {
	server, client := servetest.TCPPair(t)
	r := New(server, NewGroup(time.Second))
	client.(*net.TCPConn).SetLinger(0) // close with a RST
	client.Close()
	_, err := r.Read(make([]byte, 8))
	var oe *net.OpError
	if !errors.As(err, &oe) || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after a reset: %v (%T)", err, err)
	}
}

// TestGroupHoldsPollingWhileAnotherSleepsYoung: a reader polls only while
// no other reader of its group has just gone to sleep; a reader asleep
// for youngFor stops counting, sleeps on, and still reads what comes.
func TestGroupHoldsPollingWhileAnotherSleepsYoung(t *testing.T) {
	g := NewGroup(time.Second)
	as, ac := servetest.TCPPair(t)
	a := New(as, g)
	buf := make([]byte, 16)
	readAfter := func(d time.Duration, what string) {
		t.Helper()
		time.AfterFunc(d, func() { ac.Write([]byte(what)) })
		if n, err := a.Read(buf); err != nil || string(buf[:n]) != what {
			t.Fatalf("read %q, %v; want %q", buf[:n], err, what)
		}
	}
	readAfter(20*time.Millisecond, "alone")
	if a.polled != 1 || a.slept != 0 {
		t.Fatalf("alone: polled %d, slept %d; want it found by polling", a.polled, a.slept)
	}

	// Another reader goes to sleep (its polling time spent at once) and
	// counts as young for 300 ms (a millisecond in serve).
	g.youngFor = 300 * time.Millisecond
	bs, bc := servetest.TCPPair(t)
	b := New(bs, g)
	b.spin = spin.New(0)
	got := make(chan string, 1)
	go func() {
		p := make([]byte, 16)
		n, err := b.Read(p)
		if err != nil {
			got <- err.Error()
		}
		got <- string(p[:n])
	}()
	waitUntil(t, "the other reader's young sleep", func() bool { return g.young.Load() == 1 })
	readAfter(20*time.Millisecond, "held back")
	if a.polled != 1 || a.slept != 1 {
		t.Fatalf("beside a young sleeper: polled %d, slept %d; want it asleep", a.polled, a.slept)
	}
	// The other reader, asleep past youngFor, no longer counts; it still
	// reads what comes, without an error.
	waitUntil(t, "the other reader's sleep to age", func() bool { return g.young.Load() == 0 })
	readAfter(20*time.Millisecond, "idle beside")
	if a.polled != 2 {
		t.Fatalf("beside an idle sleeper: polled %d; want it polling again", a.polled)
	}
	bc.Write([]byte("late"))
	select {
	case s := <-got:
		if s != "late" {
			t.Fatalf("the idle reader read %q", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the idle reader never read")
	}
	if n := g.young.Load(); n != 0 {
		t.Fatalf("%d young sleepers counted with none asleep", n)
	}
}

func waitUntil(t *testing.T, what string, f func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !f(); time.Sleep(100 * time.Microsecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not seen", what)
		}
	}
}

// TestGroupBoundsItsPollers: with its places taken, a reader sleeps
// rather than polls; it polls again once one is free, and gives it back.
func TestGroupBoundsItsPollers(t *testing.T) {
	g := NewGroup(time.Second)
	g.spinners.Store(g.spinMax) // every place taken
	s, c := servetest.TCPPair(t)
	r := New(s, g)
	buf := make([]byte, 8)
	time.AfterFunc(20*time.Millisecond, func() { c.Write([]byte("a")) })
	if _, err := r.Read(buf); err != nil {
		t.Fatal(err)
	}
	if r.polled != 0 || r.slept != 1 {
		t.Fatalf("with no place free: polled %d, slept %d; want it asleep", r.polled, r.slept)
	}
	g.spinners.Add(-1)
	time.AfterFunc(20*time.Millisecond, func() { c.Write([]byte("b")) })
	if _, err := r.Read(buf); err != nil {
		t.Fatal(err)
	}
	if r.polled != 1 {
		t.Fatalf("with a place free: polled %d; want it found by polling", r.polled)
	}
	if n := g.spinners.Load(); n != g.spinMax-1 {
		t.Fatalf("%d places taken after the read, want %d (its own given back)", n, g.spinMax-1)
	}
}
