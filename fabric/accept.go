// Package fabric holds the concrete fabrics behind the Datamover
// Interface's Acceptor and Dialer (package datamover): iSCSI over TCP, the
// shared portal that takes iSCSI/TCP and iSER over iWARP on one port, and
// iSER on any RDMA/CM device (software RoCEv2, a verbs device). The iSCSI
// target and initiator see only datamover.Acceptor, datamover.Dialer and
// datamover.Conn; what is a TCP socket, an MPA exchange or an InfiniBand
// CM request stays here.
package fabric

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/datamover/iser"
	"github.com/blockwire/blockwire/datamover/tcp"
	"github.com/blockwire/blockwire/internal/prefixconn"
	"github.com/blockwire/blockwire/internal/sockpoll"
	"github.com/blockwire/blockwire/rdma"
)

// ISERPortal is the iSER side of a shared portal: the iWARP device that
// starts MPA on an accepted TCP connection (rdma/siw.Fabric), the
// protection domain its connections use, and their options.
type ISERPortal struct {
	IWARP   IWARP
	PD      *rdma.PD
	Options iser.Options
}

// TCP returns an acceptor for iSCSI over TCP on l.
func TCP(l net.Listener) *TCPAcceptor { return &TCPAcceptor{l: l} }

// Portal returns an acceptor that serves iSCSI/TCP and iSER on one port:
// the first byte tells them apart. A connection that opens with an MPA
// Request is iSER in the connection-first form (the iSER-on-InfiniBand draft, RFC 7145, Linux
// ib_iser over siw); one that opens with a Login PDU is iSCSI/TCP, which may
// turn into iSER after a login negotiating RDMAExtensions (RFC 5046 §5.1).
// LIO cannot serve both on one iWARP port.
func Portal(l net.Listener, p ISERPortal) *TCPAcceptor {
	return &TCPAcceptor{l: l, iser: &p}
}

// TCPAcceptor takes iSCSI/TCP connections on a listener (and iSER ones,
// when made by Portal).
type TCPAcceptor struct {
	l    net.Listener
	iser *ISERPortal
	// Poll makes each iSCSI/TCP connection's reader poll its socket
	// after finding it empty before it sleeps, as the group says
	// (datamover/tcp Conn.SetPoll): a command that arrives meanwhile is
	// read without a wake-up. nil: readers sleep at once. Set it before
	// the acceptor is served.
	Poll *sockpoll.Group
}

func (a *TCPAcceptor) Accept(context.Context) (datamover.Incoming, error) {
	nc, err := a.l.Accept()
	if err != nil {
		return nil, err
	}
	return &tcpIncoming{nc: nc, a: a}, nil
}

func (a *TCPAcceptor) Addr() string { return a.l.Addr().String() }
func (a *TCPAcceptor) Close() error { return a.l.Close() }

// conn is iSCSI/TCP on nc, set up as every connection of the acceptor.
func (a *TCPAcceptor) conn(nc net.Conn, st datamover.Stamper, p datamover.AcceptParams) *tcp.Conn {
	c := tcp.New(nc, st)
	// A peer that stops reading is dropped after this long, releasing
	// its tasks and their share of the I/O budget.
	c.SetSendTimeout(p.SendTimeout)
	c.SetPoll(a.Poll)
	return c
}

type tcpIncoming struct {
	nc net.Conn
	a  *TCPAcceptor
}

func (in *tcpIncoming) RemoteAddr() net.Addr { return in.nc.RemoteAddr() }
func (in *tcpIncoming) Close() error         { return in.nc.Close() }

func (in *tcpIncoming) Establish(ctx context.Context, p datamover.AcceptParams) (*datamover.Established, error) {
	if in.a.iser == nil {
		return &datamover.Established{
			Open:  func(st datamover.Stamper) datamover.Conn { return in.a.conn(in.nc, st, p) },
			Close: func() { in.nc.Close() },
		}, nil
	}
	// An MPA Request starts with "M" (0x4D), which as an iSCSI opcode
	// byte would be opcode 0x0D with the I bit: no initiator PDU.
	var first [1]byte
	if dl, ok := ctx.Deadline(); ok {
		_ = in.nc.SetReadDeadline(dl)
	}
	if _, err := io.ReadFull(in.nc, first[:]); err != nil {
		in.nc.Close()
		return nil, err
	}
	_ = in.nc.SetReadDeadline(time.Time{})
	pc := prefixconn.New(in.nc, first[:])
	ip := in.a.iser
	opt := ip.Options
	if opt.Logger == nil {
		opt.Logger = p.Logger
	}
	if first[0] != 'M' {
		// iSCSI/TCP, which may turn into iSER after the login.
		opt.Recvs, opt.Unexpected = receiveBudget(opt, p.Window)
		return &datamover.Established{
			Open: func(st datamover.Stamper) datamover.Conn {
				return NewUpgrade(in.a.conn(pc, st, p), ip.IWARP, ip.PD, opt, st)
			},
			Kind:  datamover.KindUpgradable,
			Close: func() { in.nc.Close() },
		}, nil
	}
	// iSER connection first: the MPA exchange, then the RDMA/CM-style
	// request with the iSER CM header.
	req, err := ip.IWARP.Respond(ctx, pc)
	if err != nil {
		in.nc.Close()
		return nil, fmt.Errorf("MPA: %w", err)
	}
	return acceptISER(ctx, req, ip.PD, opt, p)
}

// ISER returns an acceptor for iSER in the connection-first form (the
// iSER-on-InfiniBand draft, RFC 7145: what Linux ib_iser speaks) on an RDMA/CM listener, with
// memory registered in pd.
func ISER(l rdma.Listener, pd *rdma.PD, opt iser.Options) datamover.Acceptor {
	return &rdmaAcceptor{l: l, pd: pd, opt: opt}
}

type rdmaAcceptor struct {
	l   rdma.Listener
	pd  *rdma.PD
	opt iser.Options
}

func (a *rdmaAcceptor) Accept(ctx context.Context) (datamover.Incoming, error) {
	req, err := a.l.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return &rdmaIncoming{req: req, a: a}, nil
}

func (a *rdmaAcceptor) Addr() string { return a.l.Addr().String() }
func (a *rdmaAcceptor) Close() error { return a.l.Close() }

type rdmaIncoming struct {
	req rdma.ConnRequest
	a   *rdmaAcceptor
}

func (in *rdmaIncoming) RemoteAddr() net.Addr { return in.req.RemoteAddr() }
func (in *rdmaIncoming) Close() error         { return in.req.Reject(nil) }

func (in *rdmaIncoming) Establish(ctx context.Context, p datamover.AcceptParams) (*datamover.Established, error) {
	opt := in.a.opt
	if opt.Logger == nil {
		opt.Logger = p.Logger
	}
	return acceptISER(ctx, in.req, in.a.pd, opt, p)
}

// acceptISER accepts one RDMA connection request as an iSER connection:
// it reads the initiator's iSER CM header, answers with ours (tagged
// offsets are virtual addresses; Send with Invalidate is used unless the
// initiator declined it, wire-facts §2.2) and returns the connection.
// It gives up when ctx ends before the peer has completed the connection
// (where the fabric can: rdma.AcceptContext).
func acceptISER(ctx context.Context, req rdma.ConnRequest, pd *rdma.PD, opt iser.Options, p datamover.AcceptParams) (*datamover.Established, error) {
	peer := iser.DecodeCMHeader(req.PrivateData())
	if why := peer.Pref.Refusal(p.EndNode, p.Gateway); why != "" {
		// The iSER-on-InfiniBand draft: the node cannot meet the initiator's preference;
		// reject (InfiniBand: consumer reject, reason 28) with the reason
		// in the private data.
		req.Reject([]byte(why))
		return nil, fmt.Errorf("iSER preference %s: %s", peer.Pref, why)
	}
	if opt.Profile == iser.ProfileLinux && opt.CtrlDataLimit == 0 {
		// Linux ib_iser receives at most 128 data bytes per control PDU
		// in full feature phase (wire-facts §2.3).
		opt.CtrlDataLimit = 128
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	opt.Recvs, opt.Unexpected = receiveBudget(opt, p.Window)
	// Until the login completes the connection holds a few login-sized
	// buffers, not the ring a full window needs: whoever can send a
	// connection request (a spoofed source, before any handshake) makes
	// the node hold little.
	opt.LoginRecvs = loginRecvs
	opt.Memory = p.Memory
	res := iser.Prepare(pd, opt)
	reply := iser.CMHeader{ZBVANotSupported: true, SendInvNotSupported: peer.SendInvNotSupported}.Append(nil)
	qp, err := rdma.AcceptContext(ctx, req, res.ConnParams(reply))
	if err != nil {
		res.Release()
		return nil, fmt.Errorf("iSER accept: %w", err)
	}
	return &datamover.Established{
		Open:  func(st datamover.Stamper) datamover.Conn { return res.Attach(qp, peer, st) },
		Kind:  datamover.KindISER,
		Close: func() { qp.Close(); res.Release() },
	}, nil
}

// loginRecvs is the receive buffers and send slots an accepted iSER
// connection has until its login completes: one Login Request at a time
// comes in, one response goes out, and a buffer may wait a moment to be
// posted again.
const loginRecvs = 4

// receiveBudget sizes an iSER connection's receive buffers (RFC 5046 §8):
// the CmdSN window, then 64 more, of which up to 32 may hold unexpected
// PDUs (immediate NOP-Out, TMF, Text, Logout: what the target declares as
// MaxOutstandingUnexpectedPDUs) and the rest unsolicited Data-Out.
func receiveBudget(opt iser.Options, window uint32) (recvs, unexpected int) {
	recvs = max(opt.Recvs, int(window)+64)
	unexpected = opt.Unexpected
	if unexpected == 0 {
		unexpected = 32
	}
	return recvs, min(unexpected, recvs-int(window))
}
