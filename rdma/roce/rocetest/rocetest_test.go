package rocetest_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/blockwire/blockwire/rdma/ib"
	"github.com/blockwire/blockwire/rdma/roce"
	"github.com/blockwire/blockwire/rdma/roce/rocetest"
)

// TestClaimedAddressIsNotTaken: a connection request whose RDMA/CM header
// claims another source address reaches the software RoCEv2 device's
// listener under the address it came from — the one the device answers —
// so a peer cannot pass for an address inside an ACL's from; and the
// answer (here a REJ) comes back to the peer.
func TestClaimedAddressIsNotTaken(t *testing.T) {
	const port = 24798
	d, err := roce.Open("127.0.0.2", roce.Options{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ln, err := d.Listen("127.0.0.2:3260")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p, err := rocetest.Dial(netip.MustParseAddr("127.0.5.1"), netip.MustParseAddrPort("127.0.0.2:24798"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	req, err := p.REQ(3260, netip.MustParseAddr("127.0.9.9"), []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SendREQ(req); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cr, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := cr.RemoteAddr().(*net.UDPAddr).AddrPort().Addr(); got != netip.MustParseAddr("127.0.5.1") {
		t.Errorf("the request is from %v, want 127.0.5.1 (it claimed 127.0.9.9)", got)
	}
	if string(cr.PrivateData()[:5]) != "hello" {
		t.Errorf("private data % x", cr.PrivateData()[:5])
	}
	cr.Reject([]byte("no"))
	m, err := p.Recv(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if m.AttrID != ib.AttrREJ {
		t.Fatalf("answer %#x, want a REJ", m.AttrID)
	}
	if rej := ib.DecodeREJ(&m.Data); rej.RemoteCommID != req.LocalCommID {
		t.Errorf("REJ for communication ID %#x, want %#x", rej.RemoteCommID, req.LocalCommID)
	}
}
