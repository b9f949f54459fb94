//go:build linux

package siw

import (
	"bytes"
	"net"
	"testing"

	"github.com/blockwire/blockwire/internal/prefixconn"
)

// A portal hands the software iWARP device a connection with the bytes it
// looked at put back in front (internal/prefixconn). The receiver must
// read those through the wrapper, then switch to readv(2) on the socket —
// a target's RDMA Read Responses used to go through plain reads all the
// time, twice the system calls per FPDU.
func TestVectoredAfterPrefix(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	payload := bytes.Repeat([]byte("0123456789abcdef"), 4096)
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte("M"))
		c.Write(payload)
		c.Write([]byte("next"))
	}()
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var first [1]byte
	if _, err := nc.Read(first[:]); err != nil {
		t.Fatal(err)
	}
	var x reader
	x.c = prefixconn.New(nc, first[:])
	x.vec.init(x.c)
	if x.vec.ok() {
		t.Fatal("vectored reads before the prefix byte was read")
	}
	if err := x.need(1, 1); err != nil || x.buf[0] != 'M' {
		t.Fatalf("prefix: %q %v", x.buf[:x.w], err)
	}
	x.r = 1
	if !x.vec.ok() {
		t.Fatal("prefix read, but the socket is not read with readv")
	}
	got := make([]byte, len(payload))
	x.ahead = 0
	if err := x.fill(got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("payload differs")
	}
	if err := x.need(4, 4); err != nil || string(x.buf[x.r:x.r+4]) != "next" {
		t.Fatalf("after the payload: %q %v", x.buf[x.r:x.w], err)
	}
}
