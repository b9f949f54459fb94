package iscsitarget

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/internal/persource"
	"github.com/blockwire/blockwire/internal/servetest"
)

// TestLoginsPerSourceIPv6Network: with Sources.V6Bits 64 one source is
// the peer's /64, so a host that takes a fresh address of its network for
// each connection still meets the per-source bound; another network is
// not held back; by default each address counts alone. Real sockets, on
// the loopback of a network namespace holding the addresses.
func TestLoginsPerSourceIPv6Network(t *testing.T) {
	ns := servetest.Netns(t, "fd00:b::100", "fd00:b::1", "fd00:b::2", "fd00:b::3", "fd00:b::4", "fd00:b::5", "fd00:c::1")
	for _, c := range []struct {
		bits        int
		fifthClosed bool
	}{{64, true}, {0, false}} {
		t.Run(fmt.Sprintf("V6Bits=%d", c.bits), func(t *testing.T) {
			var l net.Listener
			servetest.InNetns(t, ns, func() (err error) { l, err = net.Listen("tcp", "[fd00:b::100]:0"); return err })
			ts := startServerOn(t, Options{MaxLoginsPerSource: 4, LoginTimeout: 5 * time.Second, Sources: persource.Sources{V6Bits: c.bits}}, nil, os.Stderr,
				func(lo net.Listener) datamover.Acceptor { lo.Close(); return fabric.TCP(l) })
			addr := l.Addr().String()
			dial := func(from string) net.Conn {
				t.Helper()
				var nc net.Conn
				servetest.InNetns(t, ns, func() (err error) {
					d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
					nc, err = d.Dial("tcp", addr)
					return err
				})
				t.Cleanup(func() { nc.Close() })
				return nc
			}
			// Four connections that never log in, each from its own
			// address of fd00:b::/64.
			for i := 1; i <= 4; i++ {
				dial(fmt.Sprintf("fd00:b::%d", i))
			}
			time.Sleep(100 * time.Millisecond)
			fifth := dial("fd00:b::5")
			fifth.SetReadDeadline(time.Now().Add(time.Second))
			_, err := fifth.Read(make([]byte, 1))
			timedOut := err != nil && os.IsTimeout(err)
			if c.fifthClosed && timedOut {
				t.Fatal("a fifth connection from the same /64, another address, was kept past the bound of 4")
			}
			if !c.fifthClosed && !timedOut {
				t.Fatalf("a fifth address counted against the others' by default: %v", err)
			}
			want := uint64(0)
			if c.fifthClosed {
				want = 1
			}
			if got := ts.srv.BoundsHit()["logins_per_source"]; got != want {
				t.Fatalf("logins_per_source hit %d times, want %d", got, want)
			}
			// Another network logs in meanwhile.
			nc := dial("fd00:c::1")
			other := &tclient{t: t, nc: nc, r: bufio.NewReader(nc), isid: [6]byte{0x80, 0, 0, 0, 0, 7}, keys: map[string]string{}}
			other.mustLogin(normalKeys(ini)...)
		})
	}
}
