package iscsitarget

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/pdu"
)

// establishedWith is an acceptor whose connections f changes once they
// are established, before the iSCSI layer opens them (used by pointer:
// the server keys its acceptors, and a func is not comparable).
type establishedWith struct {
	datamover.Acceptor
	f func(*datamover.Established)
}

func (a establishedWith) Accept(ctx context.Context) (datamover.Incoming, error) {
	in, err := a.Acceptor.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return incomingWith{in, a.f}, nil
}

type incomingWith struct {
	datamover.Incoming
	f func(*datamover.Established)
}

func (i incomingWith) Establish(ctx context.Context, p datamover.AcceptParams) (*datamover.Established, error) {
	est, err := i.Incoming.Establish(ctx, p)
	if err == nil {
		i.f(est)
	}
	return est, err
}

// TestISERDiscoveryIsNotPinged: Linux's ib_iser posts a receive on a
// discovery session only when it sends a request, so a NOP-In there
// meets Receiver Not Ready until the connection dies (seen in the guest
// lab: linux-iser-rxe, an IPv6 discovery that idled 14 s). An iSER
// discovery session gets no ping; one left idle ends after the ping's
// interval and timeout — while an iSCSI/TCP discovery session is pinged.
func TestISERDiscoveryIsNotPinged(t *testing.T) {
	for _, iser := range []bool{true, false} {
		srv := NewServer(slog.New(slog.DiscardHandler), Options{NopInterval: 200 * time.Millisecond, NopTimeout: 300 * time.Millisecond})
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var a datamover.Acceptor = fabric.TCP(l)
		if iser {
			// Every connection iSER from its first PDU (connection
			// first), whatever carries it.
			a = &establishedWith{a, func(e *datamover.Established) { e.Kind = datamover.KindISER }}
		}
		go srv.Serve(a)
		c := dial(t, l.Addr().String())
		c.mustLogin(discoveryKeys(ini)...)
		start := time.Now()
		h, _, ok := c.recv(2 * time.Second)
		switch {
		case iser && ok:
			t.Fatalf("iSER discovery session: the target sent %s", h.Opcode())
		case iser && time.Since(start) > 1500*time.Millisecond:
			t.Fatalf("iSER discovery session idle for %v and not ended (want about 500 ms)", time.Since(start))
		case !iser && (!ok || h.Opcode() != pdu.OpNopIn):
			t.Fatalf("iSCSI/TCP discovery session: got %v (ok %v), want a NOP-In ping", h.Opcode(), ok)
		}
		srv.Shutdown(context.Background())
	}
}
