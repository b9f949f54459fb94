package siw

import (
	"bufio"
	"context"
	"net"
	"testing"

	"github.com/blockwire/blockwire/rdma"
)

// TestUpgradeInPlace is the RFC 5046 §5.1 case: a TCP connection first
// carries a byte-stream exchange (the iSCSI login), then both sides start
// MPA on the same connection and it carries RDMA traffic.
func TestUpgradeInPlace(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f := New(Options{PeerToPeer: true})
	a, b := newEnd(0), newEnd(0)
	ch := make(chan rdma.QP, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ch <- nil
			return
		}
		// Byte-stream phase: a line each way.
		line, _ := bufio.NewReader(c).ReadString('\n') // the client sends nothing more until our answer
		if line != "login\n" {
			c.Close()
			ch <- nil
			return
		}
		c.Write([]byte("final login response\n"))
		r, err := f.Respond(context.Background(), c)
		if err != nil {
			ch <- nil
			return
		}
		p := b.params(nil)
		p.Recvs = []rdma.RecvWR{{ID: 5, Buf: make([]byte, 100)}}
		qp, _ := r.Accept(p)
		ch <- qp
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("login\n"))
	resp := make([]byte, len("final login response\n"))
	if _, err := c.Read(resp); err != nil || string(resp) != "final login response\n" {
		t.Fatalf("%q %v", resp, err)
	}
	qa, _, err := f.Connect(context.Background(), c, a.params(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer qa.Close()
	qb := <-ch
	if qb == nil {
		t.Fatal("responder failed")
	}
	defer qb.Close()
	// The peer-to-peer RTR (a zero-length Write) went first and was
	// ignored; the Send lands.
	qa.PostSend(&rdma.SendWR{Op: rdma.OpSend, SG: [][]byte{[]byte("rdma mode")}})
	if c := wait(t, b.rcq); c.ID != 5 || c.Len != 9 {
		t.Fatalf("%+v (%v)", c, qb.Err())
	}
	if qa.Attr().IRD == 0 || qa.Attr().ORD == 0 {
		t.Fatalf("IRD/ORD not negotiated: %+v", qa.Attr())
	}
}
