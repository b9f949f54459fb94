package servetest

import (
	"errors"
	"net"
	"testing"
	"time"
)

// HoldIdle opens n connections to addr that send nothing (a client that
// takes a server's places and leaves them idle) and closes them when t
// ends; it gives the server a moment to accept them all.
func HoldIdle(t testing.TB, addr string, n int) []net.Conn {
	t.Helper()
	var cs []net.Conn
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	time.Sleep(100 * time.Millisecond)
	return cs
}

// ClosedAtOnce fails t, saying what, unless the server closes a new
// connection to addr within 2 s without sending anything.
func ClosedAtOnce(t testing.TB, addr, what string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	switch {
	case err == nil:
		t.Fatalf("%s: the server sent data", what)
	case errors.As(err, &ne) && ne.Timeout():
		t.Fatalf("%s: still open after 2 s", what)
	}
}

// Eventually retries try every 20 ms until it succeeds; t fails, saying
// what and try's last error, unless it does within d — for a place a
// closing connection frees a moment later.
func Eventually(t testing.TB, d time.Duration, what string, try func() error) {
	t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		err := try()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
	}
}

// TCPPair returns both ends of a loopback TCP connection, closed when the
// test ends.
func TCPPair(t testing.TB) (server, client net.Conn) {
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
