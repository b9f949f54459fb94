package siw

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/blockwire/blockwire/internal/servetest"
	"github.com/blockwire/blockwire/rdma"
)

// TestHandshakesInProgressPerSource: every TCP connection to a listener
// holds a goroutine and a socket until its MPA Request arrives or the
// handshake times out. One address may have only a few handshakes in
// progress: more are closed as they arrive, another address is still
// answered, and a finished handshake frees its place.
func TestHandshakesInProgressPerSource(t *testing.T) {
	f := New(Options{MaxHandshakesPerSource: 2, HandshakeTimeout: 10 * time.Second})
	ln, err := f.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			r, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			r.Reject([]byte("seen"))
		}
	}()
	addr := ln.Addr().String()
	idle := servetest.HoldIdle(t, addr, 2)
	servetest.ClosedAtOnce(t, addr, "a third handshake from one address")
	if h := f.BoundsHit(); h["handshakes_per_source"] != 1 || h["handshakes"] != 0 {
		t.Fatalf("bounds hit %v, want one connection closed for handshakes_per_source", h)
	}

	handshake := func(from string) error {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		nc, err := d.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _, err = f.Connect(ctx, nc, newEnd(0).params(nil))
		var re *rdma.RejectError
		if errors.As(err, &re) && string(re.PrivateData) == "seen" {
			return nil // answered by the listener's owner
		}
		return err
	}
	if err := handshake("127.0.0.2"); err != nil {
		t.Fatalf("a handshake from another address: %v", err)
	}
	for _, c := range idle {
		c.Close()
	}
	servetest.Eventually(t, 2*time.Second, "a handshake after the idle ones closed", func() error { return handshake("127.0.0.1") })
}
