// Package siw is blockwire's software iWARP device: RDMA over an ordinary
// TCP connection, speaking real MPA (RFC 5044 with the RFC 6581 enhanced
// connection setup), DDP (RFC 5041) and RDMAP (RFC 5040) on the wire — the
// protocol the Linux kernel's soft-iWARP driver (siw) speaks, with its
// defaults (facts §3.7): revision 2 with IRD/ORD, CRC off unless either
// side asks, no markers, MSNs from 1.
//
// A Fabric implements rdma.Fabric: Dial and Listen open new connections,
// Connect and Respond start MPA on a connection that already exists — the
// RFC 5046 §5.1 case where the iSCSI login ran in byte-stream mode and the
// same connection then turns into an RDMA stream (RFC 5046 §5.1). Pair
// connects two queue pairs in memory for tests.
//
// Received payload goes from the socket straight into the registered
// buffer (tagged) or the posted receive buffer (untagged); sends go out in
// vectored writes that gather the caller's buffers.
package siw

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blockwire/blockwire/internal/logsample"
	"github.com/blockwire/blockwire/internal/persource"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/iwarp/mpa"
)

// Options configure a Fabric.
type Options struct {
	// CRC asks for MPA CRC32C (the C bit). The peer may ask for it too;
	// either side's request turns it on (RFC 5044 §7.1).
	CRC bool
	// Revision is the MPA revision to offer: 2 (default, RFC 6581
	// enhanced with IRD/ORD, as Linux does) or 1 (RFC 5044).
	Revision int
	// MULPDU caps the ULPDU (DDP header + payload) of each FPDU we send;
	// default 65530, what fits a loopback TCP segment (RFC 5044 §4.1).
	MULPDU int
	// PeerToPeer asks the responder for the RFC 6581 ready-to-receive
	// exchange; we then send a zero-length RDMA Write as the RTR.
	PeerToPeer bool
	// HandshakeTimeout bounds the MPA exchange (default 10 s, siw's
	// active-side wait).
	HandshakeTimeout time.Duration
	// SendTimeout fails a queue pair whose stream takes less than
	// sendguard.MinProgress (64 KiB) in this long — a peer that stops
	// reading, or reads a trickle (what TCP's retransmission limit does
	// to a dead peer, sooner); its work requests complete in error,
	// releasing what they hold. Zero: no bound.
	SendTimeout time.Duration
	// MaxHandshakes bounds the connections of a listener whose MPA
	// Request has not arrived and been taken by Accept (256), and
	// MaxHandshakesPerSource those from one source (8; Sources says
	// what one is): each holds a goroutine and a socket for up to
	// HandshakeTimeout. Connections beyond are closed as they arrive.
	MaxHandshakes          int
	MaxHandshakesPerSource int
	Sources                persource.Sources
	// Logger gets connection-level events (default: discarded).
	Logger *slog.Logger
}

// maxReadDepth caps IRD/ORD (siw's limit per QP).
const maxReadDepth = 128

// Fabric is the software iWARP connection manager.
type Fabric struct {
	opt Options
	// Connections closed for the bounds on handshakes in progress
	// (BoundsHit).
	refused persource.Refusals
}

// New returns a Fabric.
func New(opt Options) *Fabric {
	if opt.Revision == 0 {
		opt.Revision = mpa.Rev2
	}
	if opt.MULPDU <= 0 || opt.MULPDU > mpa.MULPDU(65536) {
		opt.MULPDU = mpa.MULPDU(65536)
	}
	if opt.HandshakeTimeout <= 0 {
		opt.HandshakeTimeout = 10 * time.Second
	}
	if opt.MaxHandshakes <= 0 {
		opt.MaxHandshakes = 256
	}
	if opt.MaxHandshakesPerSource <= 0 {
		opt.MaxHandshakesPerSource = 8
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	return &Fabric{opt: opt}
}

var _ rdma.Fabric = (*Fabric)(nil)

// Dial implements rdma.Fabric.
func (f *Fabric) Dial(ctx context.Context, addr string, p rdma.ConnParams) (rdma.QP, []byte, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	setNoDelay(c)
	qp, pd, err := f.Connect(ctx, c, p)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return qp, pd, nil
}

func setNoDelay(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
}

func (f *Fabric) offer(p *rdma.ConnParams) mpa.Frame {
	cfg := p.QP
	cfg.Defaults()
	fr := mpa.Frame{CRC: f.opt.CRC, Rev: uint8(f.opt.Revision), PrivateData: p.PrivateData}
	if fr.Rev == mpa.Rev2 {
		fr.Enhanced = true
		fr.IRD, fr.ORD = uint16(min(cfg.IRD, maxReadDepth)), uint16(min(cfg.ORD, maxReadDepth))
		if f.opt.PeerToPeer {
			fr.PeerToPeer, fr.WriteRTR = true, true
		}
	}
	return fr
}

// Connect runs the MPA initiator over c (a fresh connection, or the
// connection an iSCSI login just completed on, RFC 5046 §5.1): it sends
// the MPA Request carrying p.PrivateData and waits for the Reply. On
// success the queue pair owns c.
func (f *Fabric) Connect(ctx context.Context, c net.Conn, p rdma.ConnParams) (rdma.QP, []byte, error) {
	if p.PD == nil {
		return nil, nil, errors.New("siw: connect needs a protection domain")
	}
	req := f.offer(&p)
	b, err := req.Append(nil)
	if err != nil {
		return nil, nil, err
	}
	stop := f.deadline(ctx, c)
	defer stop()
	if _, err := c.Write(b); err != nil {
		return nil, nil, fmt.Errorf("siw: sending MPA Request: %w", err)
	}
	rep, err := readFrame(c, true)
	if err != nil {
		return nil, nil, fmt.Errorf("siw: reading MPA Reply from %v: %w", c.RemoteAddr(), err)
	}
	pd := append([]byte(nil), rep.PrivateData...)
	if rep.Reject {
		return nil, nil, &rdma.RejectError{PrivateData: pd}
	}
	if rep.Markers {
		return nil, nil, errors.New("siw: MPA Reply turns markers on, which we did not offer (RFC 5044 §7.1)")
	}
	if req.Rev == mpa.Rev2 && (rep.Rev != mpa.Rev2 || !rep.Enhanced) {
		// RFC 6581 §5: an enhanced Request needs an enhanced Reply; a
		// Rev 1 responder (siw echoes the revision) gets no IRD/ORD.
		if rep.Rev != mpa.Rev1 {
			return nil, nil, fmt.Errorf("siw: MPA Reply revision %d without the enhanced bit (RFC 6581 §5)", rep.Rev)
		}
	}
	cfg := p.QP
	cfg.Defaults()
	ird, ord := min(cfg.IRD, maxReadDepth), min(cfg.ORD, maxReadDepth)
	if rep.Enhanced {
		// Our ORD may not exceed the responder's IRD; its ORD needs as
		// many of our inbound slots (RFC 6581 §3).
		ord = min(ord, int(rep.IRD))
		if int(rep.ORD) > maxReadDepth {
			return nil, nil, fmt.Errorf("siw: responder ORD %d above our maximum IRD %d (RFC 6581 §3)", rep.ORD, maxReadDepth)
		}
		ird = max(ird, int(rep.ORD))
		if req.PeerToPeer && rep.PeerToPeer && !rep.WriteRTR {
			return nil, nil, errors.New("siw: responder wants a ready-to-receive message other than a zero-length Write (RFC 6581 §4)")
		}
	}
	crc := req.CRC || rep.CRC
	q := newQP(c, p, crc, f.opt.MULPDU, ird, ord, f.detail(rep.Rev, crc), f.opt.Logger)
	q.sendTimeout = f.opt.SendTimeout
	stop()
	_ = c.SetDeadline(time.Time{})
	q.start()
	if req.PeerToPeer && rep.PeerToPeer {
		// RTR: a zero-length RDMA Write to STag 1, TO 0 (RFC 6581 §4;
		// siw uses STag 1 because some hardware treats 0 specially).
		if err := q.PostSend(&rdma.SendWR{Op: rdma.OpWrite, RemoteSTag: 1, Unsignaled: true}); err != nil {
			q.Close()
			return nil, nil, err
		}
	}
	return q, pd, nil
}

func (f *Fabric) detail(rev uint8, crc bool) string {
	c := "off"
	if crc {
		c = "on"
	}
	return fmt.Sprintf("MPA rev %d, CRC %s, MULPDU %d", rev, c, f.opt.MULPDU)
}

// deadline applies the handshake timeout and ctx cancellation to c until
// the returned stop is called.
func (f *Fabric) deadline(ctx context.Context, c net.Conn) (stop func()) {
	_ = c.SetDeadline(time.Now().Add(f.opt.HandshakeTimeout))
	// Once stop has returned, a later cancellation of ctx no longer
	// touches the connection.
	cancel := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	return func() { cancel() }
}

// readFrame reads one MPA Request or Reply, exactly (nothing after it).
func readFrame(c net.Conn, reply bool) (mpa.Frame, error) {
	buf := make([]byte, mpa.HeaderLen, mpa.HeaderLen+mpa.MaxPrivateData)
	if _, err := io.ReadFull(c, buf); err != nil {
		return mpa.Frame{}, err
	}
	n, err := mpa.PrivateDataLength(buf, reply)
	if err != nil {
		return mpa.Frame{}, err
	}
	buf = buf[:mpa.HeaderLen+n]
	if _, err := io.ReadFull(c, buf[mpa.HeaderLen:]); err != nil {
		return mpa.Frame{}, err
	}
	return mpa.Decode(buf, reply)
}

// Respond runs the MPA responder over c: it reads the MPA Request and
// returns it for the caller to accept or reject. A Request asking for
// markers is refused here (siw does the same).
func (f *Fabric) Respond(ctx context.Context, c net.Conn) (rdma.ConnRequest, error) {
	stop := f.deadline(ctx, c)
	req, err := readFrame(c, false)
	stop()
	if err != nil {
		return nil, fmt.Errorf("siw: reading MPA Request from %v: %w", c.RemoteAddr(), err)
	}
	if req.Markers {
		rep := mpa.Frame{Reply: true, Reject: true, Rev: req.Rev}
		b, _ := rep.Append(nil)
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write(b)
		return nil, errors.New("siw: MPA Request asks for markers, which we do not support (RFC 5044 §7.1); rejected")
	}
	_ = c.SetDeadline(time.Time{})
	return &connRequest{f: f, c: c, req: req, pd: append([]byte(nil), req.PrivateData...)}, nil
}

type connRequest struct {
	f    *Fabric
	c    net.Conn
	req  mpa.Frame
	pd   []byte
	used bool
}

func (r *connRequest) PrivateData() []byte  { return r.pd }
func (r *connRequest) LocalAddr() net.Addr  { return r.c.LocalAddr() }
func (r *connRequest) RemoteAddr() net.Addr { return r.c.RemoteAddr() }
func (r *connRequest) PeerIRD() int {
	if r.req.Enhanced {
		return int(r.req.IRD)
	}
	return 0
}
func (r *connRequest) PeerORD() int {
	if r.req.Enhanced {
		return int(r.req.ORD)
	}
	return 0
}

// Accept implements rdma.ConnRequest: it answers with an MPA Reply
// carrying p.PrivateData and the IRD/ORD this side will use.
func (r *connRequest) Accept(p rdma.ConnParams) (rdma.QP, error) {
	if r.used {
		return nil, errors.New("siw: connection request already answered")
	}
	r.used = true
	if p.PD == nil {
		r.c.Close()
		return nil, errors.New("siw: accept needs a protection domain")
	}
	cfg := p.QP
	cfg.Defaults()
	f := r.f
	rep := mpa.Frame{Reply: true, Rev: r.req.Rev, CRC: r.req.CRC || f.opt.CRC, PrivateData: p.PrivateData}
	ird, ord := min(cfg.IRD, maxReadDepth), min(cfg.ORD, maxReadDepth)
	if r.req.Enhanced {
		// RFC 6581 §3: our ORD is bounded by the initiator's IRD; we
		// take as many inbound slots as its ORD asks (up to our cap) so
		// it never has to be refused for insufficient IRD.
		ord = min(ord, int(r.req.IRD))
		ird = max(ird, min(int(r.req.ORD), maxReadDepth))
		rep.Enhanced, rep.IRD, rep.ORD = true, uint16(ird), uint16(ord)
		if r.req.PeerToPeer {
			// We accept either RTR the initiator offers: a zero-length
			// Write is ignored on receipt, a zero-length Read answered.
			rep.PeerToPeer = true
			rep.WriteRTR, rep.ReadRTR = r.req.WriteRTR, r.req.ReadRTR && !r.req.WriteRTR
		}
	}
	b, err := rep.Append(nil)
	if err != nil {
		r.c.Close()
		return nil, err
	}
	crc := rep.CRC
	q := newQP(r.c, p, crc, f.opt.MULPDU, ird, ord, f.detail(rep.Rev, crc), f.opt.Logger)
	q.sendTimeout = f.opt.SendTimeout
	_ = r.c.SetWriteDeadline(time.Now().Add(f.opt.HandshakeTimeout))
	if _, err := r.c.Write(b); err != nil {
		r.c.Close()
		return nil, fmt.Errorf("siw: sending MPA Reply: %w", err)
	}
	_ = r.c.SetWriteDeadline(time.Time{})
	q.start()
	return q, nil
}

// Reject implements rdma.ConnRequest: an MPA Reply with R set, then the
// connection closes (RFC 5044 §7.1).
func (r *connRequest) Reject(privateData []byte) error {
	if r.used {
		return errors.New("siw: connection request already answered")
	}
	r.used = true
	defer r.c.Close()
	rep := mpa.Frame{Reply: true, Reject: true, Rev: r.req.Rev, PrivateData: privateData}
	if r.req.Enhanced {
		rep.Enhanced = true
	}
	b, err := rep.Append(nil)
	if err != nil {
		return err
	}
	_ = r.c.SetWriteDeadline(time.Now().Add(r.f.opt.HandshakeTimeout))
	_, err = r.c.Write(b)
	return err
}

// Listen implements rdma.Fabric: TCP on addr, each connection's MPA
// Request read on its own goroutine so a slow or hostile client delays
// nobody else.
func (f *Fabric) Listen(addr string) (rdma.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return f.Serve(ln), nil
}

// Serve turns an existing TCP listener into an rdma.Listener.
func (f *Fabric) Serve(ln net.Listener) rdma.Listener {
	ctx, cancel := context.WithCancel(context.Background())
	l := &listener{f: f, ln: ln, reqs: make(chan rdma.ConnRequest), ctx: ctx, cancel: cancel}
	go l.loop()
	return l
}

type listener struct {
	f      *Fabric
	ln     net.Listener
	reqs   chan rdma.ConnRequest
	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once

	// mu guards the handshakes in progress: all of them (pending) and
	// each source address's (from); refused counts the connections
	// closed for the bounds. A leaf: nothing else is locked under it.
	mu      sync.Mutex
	pending int
	from    persource.Counts[string]
	refused int
	failed  atomic.Int64 // handshakes that failed (their log is thinned out)
}

// enter admits a connection from src among the handshakes in progress,
// or reports that a bound is reached.
func (l *listener) enter(src string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	all := l.pending >= l.f.opt.MaxHandshakes
	if all || !l.from.Take(src, l.f.opt.MaxHandshakesPerSource) {
		l.f.refused.Refused(all)
		if l.refused++; l.refused&(l.refused-1) == 0 {
			// 1, 2, 4, …: a flood is visible without a line per
			// connection.
			l.f.opt.Logger.Warn("siw: handshakes in progress at their bound: connection closed",
				"remote", src, "per_source", l.f.opt.MaxHandshakesPerSource, "all", l.f.opt.MaxHandshakes, "refused", l.refused)
		}
		return false
	}
	l.pending++
	return true
}

func (l *listener) leave(src string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending--
	l.from.Give(src)
}

func (l *listener) loop() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			l.cancel()
			return
		}
		src := l.f.opt.Sources.Of(c.RemoteAddr())
		if !l.enter(src) {
			c.Close()
			continue
		}
		setNoDelay(c)
		go func() {
			defer l.leave(src)
			r, err := l.f.Respond(l.ctx, c)
			if err != nil {
				// Anyone who reaches the port can cause this: the
				// first few are logged, then one in 1024.
				if n := l.failed.Add(1); logsample.Keep(n) {
					l.f.opt.Logger.Info("siw: connection refused", "remote", c.RemoteAddr(), "err", err, "refused", n)
				}
				c.Close()
				return
			}
			select {
			case l.reqs <- r:
			case <-l.ctx.Done():
				c.Close()
			}
		}()
	}
}

// ErrListenerClosed is returned by Accept after Close.
var ErrListenerClosed = errors.New("siw: listener closed")

func (l *listener) Accept(ctx context.Context) (rdma.ConnRequest, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-l.ctx.Done():
		return nil, ErrListenerClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *listener) Addr() net.Addr { return l.ln.Addr() }

func (l *listener) Close() error {
	var err error
	l.once.Do(func() {
		err = l.ln.Close()
		l.cancel()
	})
	return err
}

// Pair connects two queue pairs over an in-memory pipe with the full
// MPA/DDP/RDMAP protocol: the loopback device for unit tests.
func (f *Fabric) Pair(a, b rdma.ConnParams) (rdma.QP, rdma.QP, error) {
	ca, cb := net.Pipe()
	type res struct {
		qp  rdma.QP
		err error
	}
	ch := make(chan res, 1)
	go func() {
		r, err := f.Respond(context.Background(), cb)
		if err != nil {
			ch <- res{err: err}
			return
		}
		qp, err := r.Accept(b)
		ch <- res{qp, err}
	}()
	qa, _, err := f.Connect(context.Background(), ca, a)
	rb := <-ch
	if err != nil || rb.err != nil {
		ca.Close()
		cb.Close()
		if err == nil {
			err = rb.err
			qa.Close()
		}
		return nil, nil, err
	}
	return qa, rb.qp, nil
}

// BoundsHit counts the connections the fabric's listeners closed for the
// bounds on MPA handshakes in progress: all of them (handshakes,
// Options.MaxHandshakes) and one address's (handshakes_per_source).
func (f *Fabric) BoundsHit() map[string]uint64 {
	return f.refused.Hits("handshakes", "handshakes_per_source")
}
