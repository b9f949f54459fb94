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
	r := New(prefixconn.New(server, []byte("L")), 2*time.Second)
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
	server.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := r.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v", err)
	}
	server.SetReadDeadline(time.Time{})
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
	r := New(server, time.Second)
	client.(*net.TCPConn).SetLinger(0) // close with a RST
	client.Close()
	_, err := r.Read(make([]byte, 8))
	var oe *net.OpError
	if !errors.As(err, &oe) || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after a reset: %v (%T)", err, err)
	}
}
