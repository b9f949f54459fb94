package fabric_test

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/datamover/dmtest"
	"github.com/blockwire/blockwire/datamover/iser"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/roce"
	"github.com/blockwire/blockwire/rdma/siw"
	"github.com/blockwire/blockwire/rdma/verbs"
)

// connect dials addr with d while a accepts, and returns both sides as
// their fabric established them (the target's once accepted).
func connect(t *testing.T, a datamover.Acceptor, d datamover.Dialer, addr string, p datamover.DialParams) (*datamover.Established, func() *datamover.Established) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	type result struct {
		est *datamover.Established
		err error
	}
	accepted := make(chan result, 1)
	go func() {
		in, err := a.Accept(ctx)
		if err != nil {
			accepted <- result{nil, err}
			return
		}
		est, err := in.Establish(ctx, datamover.AcceptParams{Window: 64})
		accepted <- result{est, err}
	}()
	ini, err := d.Dial(ctx, addr, p)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	return ini, func() *datamover.Established {
		r := <-accepted
		if r.err != nil {
			t.Fatalf("accept: %v", r.err)
		}
		return r.est
	}
}

// tcpPortal is a shared portal (iSCSI/TCP and iSER over software iWARP on
// one port) on a loopback port, closed when the test ends.
func tcpPortal(t *testing.T, iwarp bool) (datamover.Acceptor, string) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if !iwarp {
		return fabric.TCP(l), l.Addr().String()
	}
	return fabric.Portal(l, fabric.ISERPortal{IWARP: siw.New(siw.Options{}), PD: rdma.NewDevice("dmtest-target").AllocPD()}), l.Addr().String()
}

// TestDatamoversConform runs the Datamover Interface's conformance suite
// (datamover/dmtest) on every datamover the fabrics build: iSCSI/TCP,
// iSER over software iWARP in both forms (connection first; the RFC 5046
// profile, which turns a TCP connection into iSER after its login), and
// iSER over the software RoCEv2 device, and — in the verbs build, where
// BLOCKWIRE_DMTEST_VERBS names kernel RDMA devices and an address of each
// (the guest lab's verbs-conformance scenario: rxe and siw) — iSER over
// the kernel's devices through rdma-core, target and initiator on one
// device.
func TestDatamoversConform(t *testing.T) {
	t.Run("TCP", func(t *testing.T) {
		dmtest.TestConn(t, func(t *testing.T) (*datamover.Established, func() *datamover.Established) {
			a, addr := tcpPortal(t, false)
			return connect(t, a, &fabric.Dialer{}, addr, datamover.DialParams{})
		})
	})
	t.Run("ISERoverIWARP", func(t *testing.T) {
		dmtest.TestConn(t, func(t *testing.T) (*datamover.Established, func() *datamover.Established) {
			a, addr := tcpPortal(t, true)
			return connect(t, a, &fabric.Dialer{}, addr, datamover.DialParams{ISER: true})
		})
	})
	t.Run("ISERoverIWARP-RFC5046", func(t *testing.T) {
		dmtest.TestConn(t, func(t *testing.T) (*datamover.Established, func() *datamover.Established) {
			a, addr := tcpPortal(t, true)
			return connect(t, a, &fabric.Dialer{Profile: iser.ProfileRFC5046}, addr, datamover.DialParams{ISER: true})
		})
	})
	t.Run("ISERoverRoCE", func(t *testing.T) {
		const port = 14798 // UDP, apart from the other packages' RoCE tests
		dmtest.TestConn(t, func(t *testing.T) (*datamover.Established, func() *datamover.Established) {
			tdev, err := roce.Open("127.0.0.21", roce.Options{Port: port})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tdev.Close() })
			idev, err := roce.Open("127.0.0.22", roce.Options{Port: port})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { idev.Close() })
			ln, err := tdev.Listen("127.0.0.21:3260")
			if err != nil {
				t.Fatal(err)
			}
			a := fabric.ISER(ln, tdev.RDMA().AllocPD(), iser.Options{})
			t.Cleanup(func() { a.Close() })
			return connect(t, a, &fabric.Dialer{RDMA: idev}, "127.0.0.21:3260", datamover.DialParams{ISER: true})
		})
	})
	t.Run("ISERoverVerbs", func(t *testing.T) {
		spec := os.Getenv("BLOCKWIRE_DMTEST_VERBS")
		if spec == "" {
			t.Skip("kernel RDMA devices (rxe, siw) through rdma-core: the guest lab runs this (BLOCKWIRE_DMTEST_VERBS=\"device=address:port ...\", a verbs build)")
		}
		for _, f := range strings.Fields(spec) {
			name, addr, ok := strings.Cut(f, "=")
			if !ok {
				t.Fatalf("BLOCKWIRE_DMTEST_VERBS: %q is not device=address:port", f)
			}
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				t.Fatalf("BLOCKWIRE_DMTEST_VERBS: %v", err)
			}
			next, _ := strconv.Atoi(port)
			t.Run(name, func(t *testing.T) {
				// Two handles on the device: the target's memory is
				// registered for local access only, the initiator's for
				// the peer's RDMA Reads and Writes (verbs.Options.Remote).
				tdev, err := verbs.Open(name, verbs.Options{MaxMemory: 64 << 20})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { tdev.Close() })
				idev, err := verbs.Open(name, verbs.Options{Remote: true, MaxMemory: 64 << 20})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { idev.Close() })
				dmtest.TestConn(t, func(t *testing.T) (*datamover.Established, func() *datamover.Established) {
					// A port of its own for each pair: a failed case's
					// connections may hold theirs until the device closes.
					at := net.JoinHostPort(host, strconv.Itoa(next))
					next++
					ln, err := tdev.Listen(at)
					if err != nil {
						t.Fatal(err)
					}
					a := fabric.ISER(ln, tdev.PD(), iser.Options{})
					t.Cleanup(func() { a.Close() })
					return connect(t, a, &fabric.Dialer{RDMA: idev}, at, datamover.DialParams{ISER: true})
				})
			})
		}
	})
}
