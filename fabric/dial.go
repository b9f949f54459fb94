package fabric

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/datamover/iser"
	"github.com/blockwire/blockwire/datamover/tcp"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/siw"
)

// Dialer connects an iSCSI initiator to portals: over TCP, and with iSER
// when the initiator asks for it (an iser:// URL, the iSER-on-InfiniBand draft's preferences)
// over an RDMA fabric. The zero Dialer uses the software iWARP device for
// iSER. A Dialer may be shared by sessions.
type Dialer struct {
	// RDMA is the fabric iSER connects over (nil: rdma/siw, software
	// iWARP over TCP).
	RDMA rdma.Fabric
	// Profile is the iSER form: iser.ProfileLinux (the default;
	// connection first, RFC 7145) or iser.ProfileRFC5046 (login on TCP,
	// then the connection turns into an RDMA stream with Hello; RDMA must
	// then implement IWARP, as rdma/siw does).
	Profile iser.Profile

	mu sync.Mutex
	pd *rdma.PD // every iSER connection's protection domain
}

// Dial implements datamover.Dialer.
func (d *Dialer) Dial(ctx context.Context, portal string, p datamover.DialParams) (*datamover.Established, error) {
	log := p.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if !p.ISER {
		nc, err := dialTCP(ctx, portal)
		if err != nil {
			return nil, err
		}
		return &datamover.Established{Open: func(st datamover.Stamper) datamover.Conn { return tcp.New(nc, st) },
			Close: func() { nc.Close() }}, nil
	}
	f, pd := d.rdma(log)
	if d.Profile == iser.ProfileRFC5046 {
		// TCP, a byte-stream login asking for RDMAExtensions, then MPA
		// on the same connection and the Hello exchange (RFC 5046 §5.1).
		iw, ok := f.(IWARP)
		if !ok {
			return nil, fmt.Errorf("iscsi: the RFC 5046 iSER profile needs an iWARP fabric that can start MPA on a connection (%T cannot)", f)
		}
		nc, err := dialTCP(ctx, portal)
		if err != nil {
			return nil, err
		}
		opt := iser.Options{Initiator: true, Logger: log}
		return &datamover.Established{Open: func(st datamover.Stamper) datamover.Conn { return NewUpgrade(tcp.New(nc, st), iw, pd, opt, st) },
			Kind: datamover.KindUpgradable, Close: func() { nc.Close() }}, nil
	}
	// The connection-first profile (the iSER-on-InfiniBand draft part II, wire-facts §2.2):
	// the iSER CM header in the private data says tagged offsets are
	// virtual addresses; the target's answer says whether it will
	// invalidate our STags with Send with Invalidate.
	res := iser.Prepare(pd, iser.Options{Initiator: true, Logger: log})
	// On a hardware device the initiator invalidates its own keys (memory
	// windows, or none to invalidate: its registered memory): it does not
	// invite Send with Invalidate. rxe (Linux 6.1) reports a received
	// invalidation in a completion flag rdma-core reads as another, and
	// invalidating a window again crashes that kernel — so nobody but us
	// ends our windows.
	hdr := iser.CMHeader{ZBVANotSupported: true, SendInvNotSupported: pd.Memory() != nil}
	if p.HasPreference {
		// The iSER-on-InfiniBand draft: the longer header with the node preference and the
		// addresses (the destination is what a gateway forwards to).
		hdr.IBDraft, hdr.MajVer, hdr.Pref = true, 1, p.Preference
		if ap, err := netip.ParseAddrPort(portal); err == nil {
			hdr.SetAddrs(netip.IPv4Unspecified(), ap.Addr())
			if !ap.Addr().Unmap().Is4() {
				hdr.SetAddrs(netip.IPv6Unspecified(), ap.Addr())
			}
		}
	}
	cp := res.ConnParams(hdr.Append(nil))
	if hdr.IBDraft {
		// On an InfiniBand CM fabric, the iSER-on-InfiniBand draft's rules as a whole: its
		// iSER service ID base, its private data alone in the REQ.
		cp.ServiceIDBase = iser.ServiceIDBaseIBDraft
	}
	qp, reply, err := f.Dial(ctx, portal, cp)
	if err != nil {
		var rj *rdma.RejectError
		if errors.As(err, &rj) {
			for _, why := range [][]byte{rj.ARI, rj.PrivateData} {
				// InfiniBand pads the REJ's private data with zeros.
				if why = bytes.TrimRight(why, "\x00"); len(why) > 0 && printable(why) {
					return nil, fmt.Errorf("iscsi: iSER connect to %s: rejected: %s: %w", portal, why, err)
				}
			}
		}
		return nil, fmt.Errorf("iscsi: iSER connect to %s: %w", portal, err)
	}
	peer := iser.DecodeCMHeader(reply)
	return &datamover.Established{Open: func(st datamover.Stamper) datamover.Conn { return res.Attach(qp, peer, st) },
		Kind: datamover.KindISER, Close: func() { qp.Close() }}, nil
}

func dialTCP(ctx context.Context, portal string) (net.Conn, error) {
	var nd net.Dialer
	nc, err := nd.DialContext(ctx, "tcp", portal)
	if err != nil {
		return nil, fmt.Errorf("iscsi: connect to %s: %w", portal, err)
	}
	return nc, nil
}

// rdma is the dialer's RDMA fabric and protection domain.
func (d *Dialer) rdma(log *slog.Logger) (rdma.Fabric, *rdma.PD) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.RDMA == nil {
		d.RDMA = siw.New(siw.Options{Logger: log})
	}
	if d.pd == nil {
		d.pd = rdma.FabricPD(d.RDMA, "blockwire-initiator")
	}
	return d.RDMA, d.pd
}

// printable reports whether b is text worth showing (a reject's reason).
func printable(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}
