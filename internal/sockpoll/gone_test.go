package sockpoll

import (
	"net"
	"testing"
	"time"
)

// TestGone: a live connection, also one with unread bytes, is not gone;
// once the peer closes (FIN) or resets it, or it is closed here, it is —
// and its unread bytes are still there to read.
func TestGone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pair := func() (net.Conn, net.Conn) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return c, s
	}
	until := func(what string, f func() bool) {
		t.Helper()
		for end := time.Now().Add(5 * time.Second); !f(); time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: not seen", what)
			}
		}
	}

	c, s := pair()
	if Gone(s) {
		t.Fatal("a live connection is gone")
	}
	c.Write([]byte("left"))
	time.Sleep(20 * time.Millisecond)
	if Gone(s) {
		t.Fatal("a live connection with bytes to read is gone")
	}
	c.Close()
	until("the peer's close", func() bool { return Gone(s) })
	buf := make([]byte, 8)
	if n, _ := s.Read(buf); string(buf[:n]) != "left" {
		t.Fatalf("read %q after Gone: the bytes before the close are lost", buf[:n])
	}
	s.Close()
	if !Gone(s) {
		t.Fatal("a connection closed here is not gone")
	}

	c, s = pair()
	c.(*net.TCPConn).SetLinger(0)
	c.Close() // a reset
	until("the peer's reset", func() bool { return Gone(s) })
	s.Close()

	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if Gone(a) {
		t.Fatal("a connection that is no socket is gone")
	}
}
