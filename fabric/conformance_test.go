package fabric_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/datamover/dmtest"
	"github.com/blockwire/blockwire/datamover/iser"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/roce"
	"github.com/blockwire/blockwire/rdma/siw"
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
// iSER over the software RoCEv2 device. The verbs build's devices run the
// same datamover (datamover/iser) over rdma-core: the guest lab covers
// them against Linux.
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
}
