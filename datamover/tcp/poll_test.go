package tcp

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/internal/prefixconn"
	"github.com/blockwire/blockwire/internal/spin"
	"github.com/blockwire/blockwire/iscsi/pdu"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

// A poller reads what arrives while it polls without sleeping, sleeps
// once its polling time has passed and still gets what comes later, and
// passes a portal's look-ahead bytes (prefixconn) on first.
func TestPollerReads(t *testing.T) {
	server, client := tcpPair(t)
	r := newPoller(prefixconn.New(server, []byte("L")), 2*time.Second)
	if r == nil {
		t.Fatal("no poller for a TCP connection behind prefixconn")
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

// A connection that polls delivers each PDU, whether it lands while the
// reader polls or after it slept, and ends with the peer's close.
func TestPollingConnServes(t *testing.T) {
	server, client := tcpPair(t)
	c := New(server, nil)
	const spin = 100 * time.Millisecond
	c.SetPoll(spin)
	if c.poll == nil {
		t.Fatal("SetPoll put no poller under the reader")
	}
	c.NoticeKeyValues(datamover.Params{MaxRecvDataSegmentLength: 8192, MaxXmitDataSegmentLength: 8192})
	c.EnableDatamover(nil)
	u := &upcalls{ended: make(chan error, 1)}
	go c.Serve(u)
	send := func(i int) {
		var h pdu.BHS
		(&pdu.NopOut{ITT: uint32(i), TTT: pdu.ReservedTTT}).Encode(&h)
		if _, err := client.Write(h[:]); err != nil {
			t.Fatal(err)
		}
	}
	// Well within the polling time: read while polling (unless the
	// reader was descheduled for all of it).
	for i := range 10 {
		send(i)
		time.Sleep(spin / 10)
	}
	// Past it: read after a sleep.
	time.Sleep(spin * 3 / 2)
	send(10)
	time.Sleep(10 * time.Millisecond)
	client.Close()
	select {
	case err := <-u.ended:
		if err != nil {
			t.Fatalf("ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the connection did not end after the peer closed it")
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.ctrl) != 11 {
		t.Fatalf("%d PDUs delivered, want 11", len(u.ctrl))
	}
	if p := c.poll; p.polled == 0 || p.slept == 0 {
		t.Fatalf("polled %d, slept %d: want reads of both kinds", p.polled, p.slept)
	}
}

// A reset connection is reported as net.Conn's Read reports it.
func TestPollerReportsAReset(t *testing.T) {
	server, client := tcpPair(t)
	r := newPoller(server, time.Second)
	client.(*net.TCPConn).SetLinger(0) // close with a RST
	client.Close()
	_, err := r.Read(make([]byte, 8))
	var oe *net.OpError
	if !errors.As(err, &oe) || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after a reset: %v (%T)", err, err)
	}
}
