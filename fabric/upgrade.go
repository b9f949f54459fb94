package fabric

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/blockwire/blockwire/datamover/iser"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/datamover/tcp"
	"github.com/blockwire/blockwire/internal/prefixconn"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/rdma"
)

// IWARP starts an RDMA stream on a connection that already exists (the
// rdma/siw Fabric does): Connect as the MPA initiator, Respond as the
// responder.
type IWARP interface {
	Connect(ctx context.Context, c net.Conn, p rdma.ConnParams) (rdma.QP, []byte, error)
	Respond(ctx context.Context, c net.Conn) (rdma.ConnRequest, error)
}

// Upgrade is the datamover of a connection in the RFC 5046 profile (RFC
// 5046 §5.1): the login runs in byte-stream mode on TCP; when it ends with
// RDMAExtensions=Yes, the target sends its final Login Response on the
// byte stream and the same connection turns into an RDMA stream (MPA),
// the iSER datamover takes over and the Hello exchange opens it. Without
// RDMAExtensions the connection stays traditional iSCSI/TCP.
//
// The iSER resources are allocated only at that switch, after the
// security stage (the anti-denial-of-service rule of RFC 5046 §5.1).
type Upgrade struct {
	tcp   *tcp.Conn
	iw    IWARP
	pd    *rdma.PD
	opt   iser.Options
	stamp datamover.Stamper

	mu        sync.Mutex
	iser      *iser.Conn
	want      bool
	params    datamover.Params
	switching bool
	ready     chan struct{} // closed when the switch ended (iser set, or failed)
	failed    bool
}

// NewUpgrade wraps the iSCSI/TCP datamover of an accepted or dialed
// connection (made with the same stamp).
func NewUpgrade(c *tcp.Conn, iw IWARP, pd *rdma.PD, opt iser.Options, stamp datamover.Stamper) *Upgrade {
	opt.Profile = iser.ProfileRFC5046
	return &Upgrade{tcp: c, iw: iw, pd: pd, opt: opt, stamp: stamp, ready: make(chan struct{})}
}

// cur is the datamover in charge, waiting out a switch in progress.
func (u *Upgrade) cur() datamover.Conn {
	u.mu.Lock()
	switching := u.switching
	u.mu.Unlock()
	if switching {
		<-u.ready
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.iser != nil {
		return u.iser
	}
	return u.tcp
}

// ISER reports whether the connection runs iSER (after the switch).
func (u *Upgrade) ISER() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.iser != nil
}

// Pending reports whether the TCP stream has received bytes not yet read.
func (u *Upgrade) Pending() bool { return u.tcp.Pending() }

// RecvDataSize is the data a receive buffer holds once iSER runs.
func (u *Upgrade) RecvDataSize() int {
	return u.opt.WithDefaults().RecvDataSize
}

// MaxOutstandingUnexpectedPDUs implements datamover.ReceiveBudget.
func (u *Upgrade) MaxOutstandingUnexpectedPDUs() int { return u.opt.MaxUnexpected() }

// RemoteAddr implements datamover.Conn.
func (u *Upgrade) RemoteAddr() string { return u.tcp.RemoteAddr() }

// Gone implements datamover.Liveness while the connection is on TCP;
// switching or switched to iSER it tells nothing (false). It never waits.
func (u *Upgrade) Gone() bool {
	u.mu.Lock()
	onTCP := !u.switching && u.iser == nil
	u.mu.Unlock()
	return onTCP && u.tcp.Gone()
}

// LocalAddr implements datamover.Conn.
func (u *Upgrade) LocalAddr() string { return u.tcp.LocalAddr() }

// AllocateConnectionResources implements datamover.Conn.
func (u *Upgrade) AllocateConnectionResources(p datamover.Params) error {
	return u.tcp.AllocateConnectionResources(p)
}

// DeallocateConnectionResources implements datamover.Conn.
func (u *Upgrade) DeallocateConnectionResources() { u.cur().DeallocateConnectionResources() }

// NoticeKeyValues implements datamover.Conn: RDMAExtensions=Yes arms the
// switch at EnableDatamover.
func (u *Upgrade) NoticeKeyValues(p datamover.Params) {
	u.mu.Lock()
	if u.iser == nil && p.RDMAExtensions {
		u.want, u.params = true, p
	}
	u.mu.Unlock()
	u.cur().NoticeKeyValues(p)
}

// MaxSendDataSegmentLength implements datamover.Conn.
func (u *Upgrade) MaxSendDataSegmentLength() int {
	u.mu.Lock()
	if u.want && u.iser == nil && u.params.RDMAExtensions {
		// After the switch the iSER length applies; before it, the
		// login's own limit.
		defer u.mu.Unlock()
		return 8192
	}
	u.mu.Unlock()
	return u.cur().MaxSendDataSegmentLength()
}

// EnableDatamover implements datamover.Conn. With RDMAExtensions=Yes the
// target's final Login Response goes out in byte-stream mode and the
// receive loop stops reading the byte stream right after the PDU being
// handled; Serve then starts MPA on the same connection (RFC 5046 §5.1,
// draft-ietf-ips-iwarp-da Figures 2 and 3).
func (u *Upgrade) EnableDatamover(final *datamover.PDU) error {
	u.mu.Lock()
	want := u.want
	u.mu.Unlock()
	if !want {
		return u.tcp.EnableDatamover(final)
	}
	if final != nil {
		if err := u.tcp.SendControl(final, true); err != nil {
			return err
		}
	}
	u.mu.Lock()
	u.switching = true
	u.mu.Unlock()
	u.tcp.RequestHandoff()
	return nil
}

// errSwitchFailed: the switch to iSER failed, and with it the connection
// (the byte stream was handed over; nothing may be written to it).
var errSwitchFailed = errors.New("iser: the connection ended in its switch to an RDMA stream (RFC 5046 §5.1)")

// live is the datamover in charge, or errSwitchFailed.
func (u *Upgrade) live() (datamover.Conn, error) {
	c := u.cur()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.failed {
		return nil, errSwitchFailed
	}
	return c, nil
}

// SendControl implements datamover.Conn.
func (u *Upgrade) SendControl(p *datamover.PDU, advance bool) error {
	c, err := u.live()
	if err != nil {
		return err
	}
	return c.SendControl(p, advance)
}

// PutData implements datamover.Conn.
func (u *Upgrade) PutData(d *datamover.DataIn) error {
	c, err := u.live()
	if err != nil {
		return err
	}
	return c.PutData(d)
}

// GetData implements datamover.Conn.
func (u *Upgrade) GetData(r2t *pdu.R2T, buf []byte) error {
	c, err := u.live()
	if err != nil {
		return err
	}
	return c.GetData(r2t, buf)
}

// DeallocateTaskResources implements datamover.Conn.
func (u *Upgrade) DeallocateTaskResources(itt uint32) { u.cur().DeallocateTaskResources(itt) }

// ConnectionTerminate implements datamover.Conn.
func (u *Upgrade) ConnectionTerminate() {
	u.mu.Lock()
	ic := u.iser
	u.mu.Unlock()
	if ic != nil {
		ic.ConnectionTerminate()
		return
	}
	u.tcp.ConnectionTerminate()
}

// Serve implements datamover.Conn.
func (u *Upgrade) Serve(up datamover.Upcalls) {
	u.tcp.Serve(up)
	u.mu.Lock()
	switching := u.switching
	u.mu.Unlock()
	if !switching {
		return // the byte-stream connection ended (and said so)
	}
	ic, err := u.rdmaStream()
	u.mu.Lock()
	u.iser, u.switching, u.failed = ic, false, err != nil
	close(u.ready)
	u.mu.Unlock()
	if err != nil {
		up.ConnectionTerminateNotify(err)
		return
	}
	ic.Serve(up)
}

// rdmaStream runs MPA on the connection and builds the iSER datamover.
func (u *Upgrade) rdmaStream() (*iser.Conn, error) {
	nc, pre := u.tcp.Handoff()
	conn := prefixconn.New(nc, pre)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res := iser.Prepare(u.pd, u.opt)
	var qp rdma.QP
	var err error
	if u.opt.Initiator {
		qp, _, err = u.iw.Connect(ctx, conn, res.ConnParams(nil))
	} else {
		var req rdma.ConnRequest
		if req, err = u.iw.Respond(ctx, conn); err == nil {
			qp, err = req.Accept(res.ConnParams(nil))
		}
	}
	if err != nil {
		nc.Close()
		return nil, errors.Join(errors.New("iser: starting the RDMA stream after login (RFC 5046 §5.1)"), err)
	}
	// RFC 5046 peers accept Send with Invalidate (RFC 5046 §9.5).
	ic := res.Attach(qp, iser.CMHeader{}, u.stamp)
	ic.NoticeKeyValues(u.params)
	ic.EnableDatamover(nil)
	return ic, nil
}

var (
	_ datamover.Conn          = (*Upgrade)(nil)
	_ datamover.ReceiveBudget = (*Upgrade)(nil)
)
