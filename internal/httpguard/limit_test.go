package httpguard

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/blockwire/blockwire/internal/persource"
	"github.com/blockwire/blockwire/internal/servetest"
)

// TestLimitedListener: a control surface (the metrics, reachable from the
// network) holds a socket and a goroutine for every connection a client
// opens and leaves idle. One address may hold only a few: more are closed
// as they arrive, while another address is still served, and a
// connection that closes frees its place.
func TestLimitedListener(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ll := Limit(l, persource.Sources{}, 2, 16)
	srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	go srv.Serve(ll)
	defer srv.Close()
	addr := l.Addr().String()

	idle := servetest.HoldIdle(t, addr, 2)
	servetest.ClosedAtOnce(t, addr, "a third connection from one address")
	if h := ll.BoundsHit(); h["connections_per_source"] != 1 || h["connections"] != 0 {
		t.Fatalf("bounds hit %v, want one connection closed for connections_per_source", h)
	}

	get := func(from string) error {
		tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}).DialContext, DisableKeepAlives: true}
		resp, err := (&http.Client{Transport: tr, Timeout: 2 * time.Second}).Get("http://" + addr + "/")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	if err := get("127.0.0.2"); err != nil {
		t.Fatalf("another address: %v", err)
	}
	idle[0].Close()
	servetest.Eventually(t, 2*time.Second, "after an idle connection closed", func() error { return get("127.0.0.1") })
}
