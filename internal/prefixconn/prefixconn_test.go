package prefixconn

import (
	"io"
	"net"
	"testing"
)

func TestPrefixFirst(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err == nil {
			c.Write([]byte("world"))
			c.Close()
		}
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	pc := New(c, []byte("hello "))
	if _, ok := pc.(*tcpConn); !ok {
		t.Fatalf("TCP connection wrapped as %T", pc)
	}
	b, err := io.ReadAll(pc)
	if err != nil || string(b) != "hello world" {
		t.Fatalf("%q %v", b, err)
	}
	a, z := net.Pipe()
	go func() { z.Write([]byte("!")); z.Close() }()
	b, _ = io.ReadAll(New(a, []byte("x")))
	if string(b) != "x!" {
		t.Fatalf("%q", b)
	}
}
