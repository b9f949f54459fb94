// Package roce is the software RoCEv2 device: the InfiniBand
// Reliable Connected transport (rdma/ib's packets) behind the rdma verbs
// API. This file is the transport itself — requester and responder of one
// queue pair over a Link that may drop, duplicate or reorder packets:
// packet sequence numbers, ACK and NAK with the AETH syndromes, go-back-N
// retransmission after a timeout or a sequence-error NAK, RNR NAK when no
// receive is posted, RDMA Read responses, path MTU segmentation. Remote
// access goes through rdma.Device.Resolve, so no packet can touch memory
// outside a registered region.
package roce

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/ib"
)

// Link sends one transport packet (BTH through pad; the device adds the
// ICRC) to the peer queue pair; it may lose it. It must not block on the
// peer, and it must copy pkt, which is reused.
type Link interface {
	Send(pkt []byte)
}

// BatchLink is a Link that sends several packets at once, in order (the
// device: one system call, runs of them as one GSO datagram).
type BatchLink interface {
	Link
	SendBatch(pkts [][]byte)
}

// VecLink is a BatchLink that takes payloads held apart: when ext[i] is
// not nil, pkts[i] is packet i's headers (BTH through the last extended
// header, the pad count set for ext[i]), ext[i] its payload, and the link
// adds the pad. The link reads ext[i] while it sends — the one copy of a
// payload, in the kernel — and not after SendVec returns.
type VecLink interface {
	BatchLink
	SendVec(pkts, ext [][]byte)
}

// RCConfig is what the connection manager negotiated for a queue pair.
type RCConfig struct {
	rdma.QPConfig
	PD                    *rdma.PD
	LocalQPN, RemoteQPN   uint32
	SendPSN, RecvPSN      uint32        // the starting PSNs: ours, and the peer's
	MTU                   int           // path MTU payload bytes: 256 … 4096
	PKey                  uint16        // 0xffff
	Timeout               time.Duration // local ACK timeout
	RetryCount            int           // retransmissions before the QP fails
	RNRRetryCount         int           // 7: retry for ever
	RNRDelay              time.Duration // the RNR NAK timer we ask for
	Window                int           // packets in flight, unacknowledged
	LocalAddr, RemoteAddr net.Addr
}

func (c *RCConfig) defaults() {
	c.QPConfig.Defaults()
	if c.MTU <= 0 {
		c.MTU = 1024
	}
	if c.PKey == 0 {
		c.PKey = 0xffff
	}
	if c.Timeout <= 0 {
		c.Timeout = 50 * time.Millisecond
	}
	if c.RetryCount <= 0 {
		c.RetryCount = 7
	}
	if c.RNRRetryCount <= 0 {
		c.RNRRetryCount = 7
	}
	if c.RNRDelay <= 0 {
		c.RNRDelay = time.Millisecond
	}
	if c.Window <= 0 {
		c.Window = 256
	}
}

const psnMask = 1<<24 - 1

// psnDiff is a-b in 24-bit serial arithmetic.
func psnDiff(a, b uint32) int32 { return int32((a-b)&psnMask<<8) >> 8 }

// wqe is a posted send-queue request.
type wqe struct {
	wr       rdma.SendWR
	sg       [rdma.MaxSGE][]byte
	total    int
	firstPSN uint32
	npkts    int
	done     bool
	readNext uint32 // Read: the PSN of the next response expected
}

func (w *wqe) lastPSN() uint32 { return (w.firstPSN + uint32(w.npkts) - 1) & psnMask }

// gather copies total bytes at off of the request's gather list into dst.
func (w *wqe) gather(dst []byte, off int) {
	for _, b := range w.wr.SG {
		if off >= len(b) {
			off -= len(b)
			continue
		}
		n := copy(dst, b[off:])
		dst, off = dst[n:], 0
		if len(dst) == 0 {
			return
		}
	}
}

// span returns the n bytes at off of the request's gather list when one
// element holds them all.
func (w *wqe) span(off, n int) ([]byte, bool) {
	for _, b := range w.wr.SG {
		if off >= len(b) {
			off -= len(b)
			continue
		}
		if off+n <= len(b) {
			return b[off : off+n], true
		}
		return nil, false
	}
	return nil, false
}

// RC is one queue pair of the Reliable Connected transport.
type RC struct {
	cfg  RCConfig
	link Link
	dev  *rdma.Device

	// mu guards the queue pair's state. Packets are built under it
	// (emit) but sent after it is released (unlock): one goroutine at a
	// time sends, in the order they were built, while others go on.
	// Lock order: mu, then the device's locks (a Close tells the device);
	// nothing is sent on a socket while mu is held.
	mu    sync.Mutex
	out   [][]byte // built, not yet sent; their buffers are reused
	spare [][]byte // the batch last sent, for its buffers
	// With a VecLink (vec), outExt[i] is out[i]'s payload when it is
	// held apart: memory of a registered region or of a Send or Write's
	// gather list, read by the kernel as it sends (as an RNIC reads it
	// by DMA), not copied here. spareExt is outExt's other array.
	vec      VecLink
	outExt   [][]byte
	spareExt [][]byte
	refs     int  // packets in out whose payload is held apart
	sending  bool // a goroutine is sending out
	// held are completions that wait until what is being sent has left:
	// while a batch is outside mu (sending) or out holds payloads held
	// apart, a completion could let a buffer's owner reuse memory the
	// link is still reading — a retransmission of a Write acknowledged
	// meanwhile, or a Read response the peer then tells of in a Send. The
	// sender gives them, in order, once out is empty (unlock); as the
	// link's own reads happen before, the race detector sees the order.
	held   []heldCompletion
	failed bool
	err    error
	done   chan struct{}

	// Requester.
	sq        []*wqe // posted, not yet completed, in order
	sqBase    []*wqe // sq's array, from its start
	freeW     []*wqe // completed, for reuse
	nextPSN   uint32 // the next PSN to assign
	sendPSN   uint32 // the next PSN to transmit (goes back to retransmit)
	acked     uint32 // the last PSN the responder acknowledged
	retries   int
	rnrTries  int
	timer     *time.Timer
	armed     bool
	rnrWait   bool      // the timer runs for an RNR back-off
	holdUntil time.Time // RNR back-off
	progress  uint64    // acknowledgements that moved something
	armedAt   uint64    // progress when the timer was armed
	rereq     uint32    // the PSN a lost Read response was last asked again from
	rereqSet  bool
	// The adaptive retransmission timer. A lost packet with nothing
	// behind it shows the responder no gap, and it says nothing: only
	// this side's timer finds the loss. Waiting the QP's timeout for it
	// (the local ACK timeout the connection manager agreed: 2.15 s from
	// Linux rxe) all but stalled a lossy link, so, as RDMA NICs that
	// run RoCE on lossy Ethernet do, the timer runs on the measured
	// round trip (RFC 6298's estimator, one packet timed at a time, never
	// a retransmitted one — Karn), under the QP's timeout; only waits as
	// long as the QP's timeout count against RetryCount.
	front        uint32    // the first PSN never sent
	rttPSN       uint32    // the packet being timed
	rttAt        time.Time // when it was sent
	rttOn        bool
	srtt, rttvar time.Duration
	fast         int       // early retransmissions since the last progress
	stallAt      time.Time // when the wait for progress began (zero: progress since the timer was armed)

	stats   Stats
	onClose func() // a local Close: the device tells the peer (DREQ)

	// Responder.
	ePSN    uint32
	msn     uint32
	nakSent bool
	recvs   []rdma.RecvWR
	cur     *rdma.RecvWR // the receive a multi-packet Send is filling
	curOff  int
	wdst    []byte // the remainder of the region a multi-packet Write fills
}

// Stats count the transport's recoveries.
type Stats struct {
	Timeouts    int // waits as long as the QP's timeout (each counts against RetryCount)
	Early       int // retransmissions by the round-trip timer, before the QP's timeout
	SeqNAKs     int // PSN sequence error NAKs received
	RNRNAKs     int // receiver-not-ready NAKs received
	ReadRetries int // RDMA Reads asked again after a lost response
	Duplicates  int // duplicate requests answered again (responder)
	NAKsSent    int
	RNRNAKsSent int
}

// Stats returns the counters.
func (q *RC) Stats() Stats {
	q.mu.Lock()
	defer q.unlock()
	return q.stats
}

// startSendLocked sets the PSN of the first packet the requester sends:
// an active side learns it from the REP, after its QP exists. q.mu held.
func (q *RC) startSendLocked(psn uint32) {
	psn &= psnMask
	q.cfg.SendPSN, q.nextPSN, q.sendPSN, q.front, q.acked = psn, psn, psn, psn, (psn-1)&psnMask
}

// NewRC returns a connected queue pair that sends through link; packets
// for it go to Input.
func NewRC(cfg RCConfig, link Link) *RC {
	cfg.defaults()
	q := &RC{cfg: cfg, link: link, dev: cfg.PD.Device(), done: make(chan struct{}),
		nextPSN: cfg.SendPSN & psnMask, sendPSN: cfg.SendPSN & psnMask, front: cfg.SendPSN & psnMask, acked: (cfg.SendPSN - 1) & psnMask,
		ePSN: cfg.RecvPSN & psnMask}
	q.vec, _ = link.(VecLink)
	q.timer = time.AfterFunc(time.Hour, q.timeout)
	q.timer.Stop()
	return q
}

// PD implements rdma.QP.
func (q *RC) PD() *rdma.PD { return q.cfg.PD }

// Attr implements rdma.QP.
func (q *RC) Attr() rdma.QPAttr {
	return rdma.QPAttr{Transport: "roce", IRD: q.cfg.IRD, ORD: q.cfg.ORD, LocalAddr: q.cfg.LocalAddr, RemoteAddr: q.cfg.RemoteAddr,
		Detail: fmt.Sprintf("RoCEv2 RC, QPN %#x to %#x, MTU %d", q.cfg.LocalQPN, q.cfg.RemoteQPN, q.cfg.MTU)}
}

// Done implements rdma.QP.
func (q *RC) Done() <-chan struct{} { return q.done }

// Err implements rdma.QP.
func (q *RC) Err() error {
	q.mu.Lock()
	defer q.unlock()
	return q.err
}

// Close implements rdma.QP: queued work is flushed.
func (q *RC) Close() error {
	q.mu.Lock()
	q.failLocked(nil)
	q.unlock()
	return nil
}

// PostRecv implements rdma.QP.
func (q *RC) PostRecv(wr rdma.RecvWR) error {
	q.mu.Lock()
	defer q.unlock()
	if q.failed {
		return rdma.ErrClosed
	}
	if len(q.recvs) >= q.cfg.RecvDepth {
		return rdma.ErrQueueFull
	}
	q.recvs = append(q.recvs, wr)
	return nil
}

// PostSend implements rdma.QP.
func (q *RC) PostSend(wr *rdma.SendWR) error {
	if len(wr.SG) > rdma.MaxSGE {
		return fmt.Errorf("roce: %d gather entries, at most %d", len(wr.SG), rdma.MaxSGE)
	}
	w := wqe{wr: *wr}
	switch wr.Op {
	case rdma.OpSend, rdma.OpWrite:
		for _, b := range wr.SG {
			w.total += len(b)
		}
	case rdma.OpRead:
		if wr.Sink == nil || wr.Length < 0 {
			return errors.New("roce: RDMA Read needs a sink region and a length")
		}
		if _, f := q.dev.Resolve(wr.Sink.STag(), q.cfg.PD, rdma.LocalWrite, wr.Sink.VA()+wr.SinkTO, wr.Length); f != rdma.FaultNone {
			return fmt.Errorf("roce: RDMA Read sink: %v", f)
		}
		w.total = wr.Length
	default:
		return fmt.Errorf("roce: cannot post %v", wr.Op)
	}
	w.npkts = max(1, (w.total+q.cfg.MTU-1)/q.cfg.MTU)
	q.mu.Lock()
	defer q.unlock()
	if q.failed {
		return rdma.ErrClosed
	}
	if len(q.sq) >= q.cfg.SendDepth {
		return rdma.ErrQueueFull
	}
	w.firstPSN = q.nextPSN
	w.readNext = w.firstPSN
	q.nextPSN = (q.nextPSN + uint32(w.npkts)) & psnMask
	// sq slides forward as requests complete: moved back to the start of
	// its array when it reaches the end, rather than grown again.
	if len(q.sq) == cap(q.sq) && cap(q.sqBase) > len(q.sq) {
		q.sq = q.sqBase[:copy(q.sqBase[:cap(q.sqBase)], q.sq)]
	}
	q.sq = append(q.sq, q.newWQE(&w))
	if cap(q.sq) > cap(q.sqBase) {
		q.sqBase = q.sq[:0]
	}
	q.pumpLocked()
	return nil
}

// newWQE is a copy of w, its gather list its own, in a request that
// completed earlier when there is one (a queue pair allocates nothing per
// request once warm). q.mu held.
func (q *RC) newWQE(w *wqe) *wqe {
	var p *wqe
	if n := len(q.freeW); n > 0 {
		p = q.freeW[n-1]
		q.freeW = q.freeW[:n-1]
	} else {
		p = new(wqe)
	}
	*p = *w
	copy(p.sg[:], w.wr.SG)
	p.wr.SG = p.sg[:len(w.wr.SG)]
	return p
}

// freeWQE keeps a completed request for reuse, holding no memory of the
// caller's. q.mu held.
func (q *RC) freeWQE(w *wqe) {
	*w = wqe{}
	q.freeW = append(q.freeW, w)
}

// find returns the request that owns psn.
func (q *RC) find(psn uint32) *wqe {
	for _, w := range q.sq {
		if d := psnDiff(psn, w.firstPSN); d >= 0 && int(d) < w.npkts {
			return w
		}
	}
	return nil
}

// pumpLocked transmits from sendPSN while the window and the read depth
// allow.
func (q *RC) pumpLocked() {
	if q.failed || (!q.holdUntil.IsZero() && time.Now().Before(q.holdUntil)) {
		return
	}
	for psnDiff(q.nextPSN, q.sendPSN) > 0 {
		if int(psnDiff(q.sendPSN, q.acked)) > q.cfg.Window {
			break // the window counts from the last acknowledged packet
		}
		w := q.find(q.sendPSN)
		if w == nil {
			q.sendPSN = q.nextPSN // everything before was completed
			break
		}
		i := int(psnDiff(q.sendPSN, w.firstPSN))
		if w.wr.Op == rdma.OpRead {
			if w.done {
				// Going back over a Read answered in full: its data is
				// in, and its key may be gone — not asked again.
				q.sendPSN = (w.lastPSN() + 1) & psnMask
				continue
			}
			if i == 0 && q.readsOutLocked() >= q.cfg.ORD {
				break
			}
			q.sendReadRequest(w, i)
			q.sentLocked(q.sendPSN, (w.lastPSN()+1)&psnMask)
			q.sendPSN = (w.lastPSN() + 1) & psnMask
			continue
		}
		q.sendSegment(w, i)
		q.sentLocked(q.sendPSN, (q.sendPSN+1)&psnMask)
		q.sendPSN = (q.sendPSN + 1) & psnMask
	}
	q.armLocked()
}

// sentLocked notes that the packets from psn to end (exclusive) are
// sent: the first of them never sent before is timed, unless one is
// being timed already (a retransmitted packet never is: its
// acknowledgement might be the first transmission's).
func (q *RC) sentLocked(psn, end uint32) {
	if psnDiff(end, q.front) <= 0 {
		return // retransmissions only
	}
	if !q.rttOn {
		if psnDiff(psn, q.front) < 0 {
			psn = q.front
		}
		q.rttOn, q.rttPSN, q.rttAt = true, psn, time.Now()
	}
	q.front = end
}

// minRTO is the least the round-trip timer waits: a retransmission too
// early costs only a duplicate the responder drops or acknowledges again
// (Reads are idempotent), but a peer's scheduling pause should not cause
// a stream of them.
const minRTO = 5 * time.Millisecond

// rttSampleLocked folds one measured round trip into the estimate
// (RFC 6298 §2: gains 1/8 and 1/4).
func (q *RC) rttSampleLocked(r time.Duration) {
	if q.srtt == 0 {
		q.srtt, q.rttvar = r, r/2
		return
	}
	q.rttvar += (max(q.srtt-r, r-q.srtt) - q.rttvar) / 4
	q.srtt += (r - q.srtt) / 8
}

// rtoLocked is the round-trip timer's wait: the QP's timeout until a
// round trip is measured, never more than it.
func (q *RC) rtoLocked() time.Duration {
	if q.srtt == 0 {
		return q.cfg.Timeout
	}
	return min(q.cfg.Timeout, max(minRTO, q.srtt+4*q.rttvar))
}

func (q *RC) bth(op ib.Opcode, psn uint32, ack bool) ib.BTH {
	return ib.BTH{Opcode: op, PKey: q.cfg.PKey, DestQP: q.cfg.RemoteQPN, PSN: psn, AckReq: ack}
}

// sendSegment transmits packet i of a Send or Write.
func (q *RC) sendSegment(w *wqe, i int) {
	off := i * q.cfg.MTU
	n := min(q.cfg.MTU, w.total-off)
	first, last := i == 0, i == w.npkts-1
	var p ib.Packet
	psn := (w.firstPSN + uint32(i)) & psnMask
	if w.wr.Op == rdma.OpSend {
		op := ib.RCSendMiddle
		switch {
		case first && last:
			op = ib.RCSendOnly
			if w.wr.Invalidate {
				op = ib.RCSendOnlyInvalidate
			}
		case first:
			op = ib.RCSendFirst
		case last:
			op = ib.RCSendLast
			if w.wr.Invalidate {
				op = ib.RCSendLastInvalidate
			}
		}
		p.BTH = q.bth(op, psn, last || q.wantAck(psn))
		p.BTH.Solicited = last && w.wr.Solicited
		p.IETH = w.wr.InvalidateSTag
	} else {
		op := ib.RCWriteMiddle
		switch {
		case first && last:
			op = ib.RCWriteOnly
		case first:
			op = ib.RCWriteFirst
		case last:
			op = ib.RCWriteLast
		}
		p.BTH = q.bth(op, psn, last || q.wantAck(psn))
		p.RETH = ib.RETH{VA: w.wr.RemoteTO, RKey: w.wr.RemoteSTag, DMALen: uint32(w.total)}
	}
	// A payload within one gather element is sent from there (VecLink):
	// the request holds it until its completion, which needs the
	// peer's acknowledgement of this very packet, so it cannot be handed
	// back before it is sent (a retransmission sent after a late
	// acknowledgement is a duplicate the peer drops). One that spans
	// elements is gathered into the packet's buffer.
	if b, ok := w.span(off, n); ok {
		q.emitRef(&p, b)
	} else if room := q.emitHeader(&p, n); room != nil {
		w.gather(room, off)
	}
}

// sendReadRequest asks for the Read's data from response packet i on
// (i > 0 after a loss: the rest of the range, under that packet's PSN).
func (q *RC) sendReadRequest(w *wqe, i int) {
	off := i * q.cfg.MTU
	p := ib.Packet{BTH: q.bth(ib.RCReadRequest, (w.firstPSN+uint32(i))&psnMask, true),
		RETH: ib.RETH{VA: w.wr.RemoteTO + uint64(off), RKey: w.wr.RemoteSTag, DMALen: uint32(w.total - off)}}
	q.emit(&p)
}

// wantAck asks for an acknowledgement in the middle of a long message,
// twice per window, so the window moves before the message ends.
func (q *RC) wantAck(psn uint32) bool {
	return int(psnDiff(psn, q.acked))%max(1, q.cfg.Window/2) == 0
}

// ackedTo records that the responder has everything up to psn.
func (q *RC) ackedTo(psn uint32) {
	if psnDiff(psn, q.acked) > 0 && psnDiff(psn, q.nextPSN) < 0 {
		q.acked = psn
		if q.rttOn && psnDiff(psn, q.rttPSN) >= 0 {
			q.rttOn = false
			q.rttSampleLocked(time.Since(q.rttAt))
		}
		q.progressLocked()
	}
}

func (q *RC) emit(p *ib.Packet) {
	b, err := p.Append(q.outBuf())
	if err != nil {
		return
	}
	q.push(b, nil)
}

// push queues packet b, with its payload ext held apart (nil: none).
func (q *RC) push(b, ext []byte) {
	q.out = append(q.out, b)
	if q.vec != nil {
		q.outExt = append(q.outExt, ext)
		if ext != nil {
			q.refs++
		}
	}
}

// heldCompletion is a completion for cq that waits (RC.held).
type heldCompletion struct {
	cq *rdma.CQ
	c  rdma.Completion
}

// complete gives c to cq, or holds it until what is being sent has left
// (held).
func (q *RC) complete(cq *rdma.CQ, c rdma.Completion) {
	if cq == nil {
		return
	}
	if q.sending || q.refs > 0 || len(q.held) > 0 {
		q.held = append(q.held, heldCompletion{cq, c})
		return
	}
	cq.Push(c)
}

// releaseHeldLocked gives the held completions (out is empty and nothing
// is being sent).
func (q *RC) releaseHeldLocked() {
	for i, h := range q.held {
		h.cq.Push(h.c)
		q.held[i] = heldCompletion{}
	}
	q.held = q.held[:0]
}

// emitRef queues p with payload, which the link copies as it sends when
// it can (VecLink); otherwise copied now, once (emitPayload). The caller
// guarantees payload stays valid until it is sent: registered memory, or
// a gather list the request holds until its completion.
func (q *RC) emitRef(p *ib.Packet, payload []byte) {
	if q.vec == nil || len(payload) == 0 {
		q.emitPayload(p, payload)
		return
	}
	b, err := p.AppendHeader(q.outBuf(), len(payload))
	if err != nil {
		return
	}
	q.push(b, payload)
}

// emitHeader queues a packet of p's headers, n bytes of payload and the
// pad (zero), and returns the payload's n bytes for the caller to fill
// (nil: not queued).
func (q *RC) emitHeader(p *ib.Packet, n int) []byte {
	buf := q.outBuf()
	if need := ib.BTHLen + 64 + n + 3; cap(buf) < need {
		buf = make([]byte, 0, need)
	}
	b, err := p.AppendHeader(buf, n)
	if err != nil {
		return nil
	}
	l := len(b)
	b = b[:l+n+(-n&3)]
	clear(b[l+n:])
	q.push(b, nil)
	return b[l : l+n : l+n]
}

// emitPayload queues p with payload, copied once, into a buffer of an
// earlier batch when there is one big enough.
func (q *RC) emitPayload(p *ib.Packet, payload []byte) {
	if room := q.emitHeader(p, len(payload)); room != nil {
		copy(room, payload)
	}
}

// outBuf is an empty buffer for the next packet: one of an earlier batch
// when there is one.
func (q *RC) outBuf() []byte {
	if n := len(q.out); n < cap(q.out) {
		return q.out[:n+1][n][:0]
	}
	return nil
}

// unlock releases mu and sends what was built under it, unless another
// goroutine is sending: that one sends it after its own, so packets
// leave in the order they were built.
func (q *RC) unlock() {
	if q.sending || len(q.out) == 0 {
		if !q.sending {
			q.releaseHeldLocked()
		}
		q.mu.Unlock()
		return
	}
	q.sending = true
	for len(q.out) > 0 {
		// Each buffer lives in one of the two arrays only: the one being
		// filled takes the spare's, and the spare is gone until the
		// batch comes back as the next spare.
		batch, ext := q.out, q.outExt
		q.out, q.spare = q.spare[:0], nil
		q.outExt, q.spareExt = q.spareExt[:0], nil
		q.refs = 0
		q.mu.Unlock()
		if q.vec != nil {
			q.vec.SendVec(batch, ext)
			clear(ext) // the payloads are not held beyond their send
		} else if bl, ok := q.link.(BatchLink); ok {
			bl.SendBatch(batch)
		} else {
			for _, b := range batch {
				q.link.Send(b)
			}
		}
		q.mu.Lock()
		q.spare, q.spareExt = batch[:0], ext[:0]
	}
	q.sending = false
	q.releaseHeldLocked()
	q.mu.Unlock()
}

// readsOutLocked counts the Reads asked for and not yet answered in full.
func (q *RC) readsOutLocked() int {
	n := 0
	for _, w := range q.sq {
		if w.wr.Op == rdma.OpRead && !w.done && psnDiff(q.sendPSN, w.firstPSN) > 0 {
			n++
		}
	}
	return n
}

// armLocked starts the retransmission timer while packets are
// unacknowledged and it is not running.
func (q *RC) armLocked() {
	if len(q.sq) == 0 || q.failed {
		if q.armed {
			q.timer.Stop()
			q.armed = false
		}
		return
	}
	if !q.armed {
		q.armed = true
		q.armedAt = q.progress
		if q.stallAt.IsZero() {
			q.stallAt = time.Now()
		}
		// Each retry waits twice as long, and so does each early one: a
		// slow peer is not flooded with whole windows again and again.
		full := q.cfg.Timeout << min(q.retries, 6)
		q.timer.Reset(min(full, q.rtoLocked()<<min(q.fast, 6)))
	}
}

// progressLocked: the peer acknowledged something; the timeout counts
// from now.
//
// The timer is not reset on every acknowledgement (two runtime timer
// operations per packet were a tenth of a receiver's CPU): progress is
// counted, and a timer that expires after progress since it was armed
// starts a new whole timeout instead of retransmitting. A loss is found
// between one and two timeouts after the last progress.
func (q *RC) progressLocked() {
	q.retries, q.rnrTries, q.rereqSet, q.fast, q.stallAt = 0, 0, false, 0, time.Time{}
	q.progress++
	q.armLocked()
}

// timeout: no progress for the round-trip timer's wait — go back to the
// oldest unacknowledged packet; when the wait has been as long as the
// QP's timeout, that is a retry, and the QP fails after RetryCount.
func (q *RC) timeout() {
	q.mu.Lock()
	defer q.unlock()
	q.armed = false
	if q.failed || len(q.sq) == 0 {
		return
	}
	if !q.rnrWait && q.progress != q.armedAt {
		q.armLocked() // progress since armed: a whole timeout from now
		return
	}
	if q.rnrWait {
		// The RNR back-off is over: send again from where the peer had
		// no receive.
		q.rnrWait = false
		q.holdUntil = time.Time{}
		q.pumpLocked()
		return
	}
	if time.Since(q.stallAt) < q.cfg.Timeout<<min(q.retries, 6) {
		q.fast++
		q.stats.Early++
		q.goBackLocked(q.oldestLocked())
		return
	}
	q.retries++
	q.stats.Timeouts++
	q.stallAt = time.Now() // the next retry counts from here
	if q.retries > q.cfg.RetryCount {
		q.failLocked(fmt.Errorf("roce: no acknowledgement after %d retries (transport retry counter exceeded)", q.cfg.RetryCount))
		return
	}
	q.goBackLocked(q.oldestLocked())
}

// oldestLocked is the first PSN not yet acknowledged.
func (q *RC) oldestLocked() uint32 {
	if len(q.sq) == 0 {
		return q.nextPSN
	}
	w := q.sq[0]
	if w.wr.Op == rdma.OpRead && !w.done {
		return w.readNext
	}
	if next := (q.acked + 1) & psnMask; psnDiff(next, w.firstPSN) > 0 {
		return next // part of the message was acknowledged
	}
	return w.firstPSN
}

// goBackLocked retransmits from psn.
func (q *RC) goBackLocked(psn uint32) {
	q.sendPSN, q.rttOn = psn, false
	q.pumpLocked()
}

// Input processes one packet addressed to this queue pair: the UDP
// payload, BTH through ICRC (the device has checked the ICRC).
func (q *RC) Input(b []byte) {
	q.mu.Lock()
	q.inputLocked(b)
	q.unlock()
}

// inputHeld is Input without sending what the packet made the queue pair
// build (acknowledgements, Read responses), unless another goroutine is
// sending anyway: the device's receiver calls flushOut after the datagrams
// one system call brought, so they leave together (and acknowledgements
// coalesce).
func (q *RC) inputHeld(b []byte) {
	q.mu.Lock()
	q.inputLocked(b)
	q.mu.Unlock()
}

// flushOut sends what was built and not yet sent.
func (q *RC) flushOut() {
	q.mu.Lock()
	q.unlock()
}

func (q *RC) inputLocked(b []byte) {
	if q.failed {
		return
	}
	p, err := ib.Decode(b)
	if err != nil {
		if errors.Is(err, ib.ErrUnknownOpcode) {
			q.nak(p.BTH.PSN, ib.NAKInvalidRequest)
		}
		return // malformed: silently dropped
	}
	switch op := p.BTH.Opcode; {
	case op == ib.RCAcknowledge:
		q.gotAck(&p)
	case op >= ib.RCReadResponseFirst && op <= ib.RCReadResponseOnly:
		q.gotReadResponse(&p)
	case op == ib.RCCompareSwap || op == ib.RCFetchAdd:
		q.nak(p.BTH.PSN, ib.NAKInvalidRequest) // no atomics
	case op == ib.RCAtomicAcknowledge:
	default:
		q.request(&p)
	}
}

// ---- requester: acknowledgements and read responses ----

// completeUpTo completes, in order, the Sends and Writes whose packets
// are all at or before psn (a Read stops the walk: only its responses end
// it).
func (q *RC) completeUpTo(psn uint32) bool {
	moved := false
	for len(q.sq) > 0 {
		w := q.sq[0]
		if w.wr.Op == rdma.OpRead {
			if !w.done {
				break
			}
		} else if psnDiff(w.lastPSN(), psn) > 0 {
			break
		}
		q.sq = q.sq[1:]
		moved = true
		q.deliver(w, rdma.Success, w.total)
		q.freeWQE(w)
	}
	if moved {
		q.progressLocked()
	}
	return moved
}

func (q *RC) deliver(w *wqe, st rdma.Status, n int) {
	if st == rdma.Success && w.wr.Unsignaled {
		return
	}
	q.complete(q.cfg.SendCQ, rdma.Completion{ID: w.wr.ID, Op: w.wr.Op, Status: st, Len: n, QP: q})
}

func (q *RC) gotAck(p *ib.Packet) {
	psn, syn := p.BTH.PSN, p.AETH.Syndrome
	switch syn & 0x60 {
	case ib.SyndromeACK:
		q.ackedTo(psn)
		q.completeUpTo(psn)
		q.impliedNAK(psn)
		q.pumpLocked()
	case ib.SyndromeRNR:
		// Everything before psn arrived; psn waits for a receive.
		q.ackedTo((psn - 1) & psnMask)
		q.completeUpTo((psn - 1) & psnMask)
		q.stats.RNRNAKs++
		q.rnrTries++
		if q.cfg.RNRRetryCount != 7 && q.rnrTries > q.cfg.RNRRetryCount {
			q.failLocked(errors.New("roce: receiver not ready after the RNR retry count"))
			return
		}
		q.holdUntil = time.Now().Add(rnrDelay(syn & 0x1f))
		q.sendPSN, q.rttOn = psn, false
		q.rnrWait, q.armed = true, true
		q.timer.Reset(time.Until(q.holdUntil))
	case ib.SyndromeNAK:
		q.ackedTo((psn - 1) & psnMask)
		q.completeUpTo((psn - 1) & psnMask)
		switch syn & 0x1f {
		case ib.NAKPSNSequenceError:
			q.stats.SeqNAKs++
			q.goBackLocked(psn)
		default:
			st := rdma.RemoteOperation
			if syn&0x1f == ib.NAKRemoteAccessError {
				st = rdma.RemoteAccess
			}
			if w := q.find(psn); w != nil {
				q.sq = q.sq[1:]
				q.deliver(w, st, 0)
			}
			q.failLocked(&rdma.TerminateError{Remote: true, Layer: "IB transport", EType: syn, Msg: fmt.Sprintf("NAK %d for PSN %#x", syn&0x1f, psn)})
		}
	}
}

// impliedNAK: an acknowledgement of psn, at or past the end of a Read
// still missing responses, says the responder has answered the Read (it
// executes requests in order), so the missing responses were lost: they
// are asked for again now, not after a timeout.
func (q *RC) impliedNAK(psn uint32) {
	if len(q.sq) == 0 {
		return
	}
	if w := q.sq[0]; w.wr.Op == rdma.OpRead && !w.done && psnDiff(psn, w.lastPSN()) >= 0 {
		q.askReadAgain(w)
	}
}

// askReadAgain asks for a Read's responses again from the one expected:
// once per loss, not for every packet that shows it.
func (q *RC) askReadAgain(w *wqe) {
	if q.rereqSet && q.rereq == w.readNext {
		return
	}
	q.rereq, q.rereqSet = w.readNext, true
	q.stats.ReadRetries++
	q.goBackLocked(w.readNext)
}

// rnrDelay decodes an RNR NAK timer (the IBA table; a few entries).
func rnrDelay(code uint8) time.Duration {
	if code == 0 {
		return 655360 * time.Microsecond
	}
	return time.Duration(10*(1<<(code/4))) * time.Microsecond
}

func (q *RC) gotReadResponse(p *ib.Packet) {
	psn := p.BTH.PSN
	w := q.find(psn)
	if w == nil || w.wr.Op != rdma.OpRead || w.done {
		return // a duplicate of something finished
	}
	// Responses come in order: one for this Read while an earlier Read
	// still misses some means those were lost — ask again from there, and
	// take nothing of this one yet. (Taking it completed this Read before
	// the earlier one, and going back re-asked for it after its data had
	// been used: a responder that invalidated its key by then — a memory
	// window ended with the I/O — fails the connection.)
	if x := q.firstUnfinishedRead(); x != nil && x != w {
		w = x
	}
	if psn != w.readNext {
		// A response was lost: ask again from the one expected (once,
		// not for every response behind the gap).
		if psnDiff(psn, w.readNext) > 0 {
			q.askReadAgain(w)
		}
		return
	}
	// A read response acknowledges every request before the Read.
	q.completeUpTo((w.firstPSN - 1) & psnMask)
	i := int(psnDiff(psn, w.firstPSN))
	off := i * q.cfg.MTU
	want := min(q.cfg.MTU, w.total-off)
	last := i == w.npkts-1
	if len(p.Payload) != want || last != (p.BTH.Opcode == ib.RCReadResponseLast || p.BTH.Opcode == ib.RCReadResponseOnly) {
		q.failLocked(fmt.Errorf("roce: RDMA Read response of %d bytes (%s), expected %d", len(p.Payload), p.BTH.Opcode, want))
		return
	}
	dst, f := q.dev.Resolve(w.wr.Sink.STag(), q.cfg.PD, rdma.LocalWrite, w.wr.Sink.VA()+w.wr.SinkTO+uint64(off), want)
	if f != rdma.FaultNone {
		q.failLocked(fmt.Errorf("roce: RDMA Read sink: %v", f))
		return
	}
	copy(dst, p.Payload)
	w.readNext = (psn + 1) & psnMask
	q.ackedTo(psn)
	if last {
		w.done = true
		// Up to the last acknowledged packet, not only to this one: an
		// acknowledgement of Sends and Writes behind the Read may have
		// come while it waited for this response, and nothing will
		// acknowledge them again.
		q.completeUpTo(q.acked)
	}
	q.progressLocked()
	q.pumpLocked()
}

// firstUnfinishedRead is the oldest Read still waiting for responses.
func (q *RC) firstUnfinishedRead() *wqe {
	for _, w := range q.sq {
		if w.wr.Op == rdma.OpRead && !w.done {
			return w
		}
	}
	return nil
}

// ---- responder ----

func (q *RC) ack(psn uint32) {
	p := ib.Packet{BTH: q.bth(ib.RCAcknowledge, psn, false), AETH: ib.AETH{Syndrome: ib.SyndromeACK | 0x1f, MSN: q.msn}}
	// Acknowledgements are cumulative: one not yet sent is replaced by
	// this later one (several requests that asked for one, received in
	// one batch, get one). A NAK in between is kept, and so is its order.
	if n := len(q.out); n > 0 && isPlainACK(q.out[n-1]) {
		if b, err := p.Append(q.out[n-1][:0]); err == nil {
			q.out[n-1] = b
		}
		return
	}
	q.emit(&p)
}

// isPlainACK tells a built Acknowledge packet whose syndrome is an ACK
// (not an RNR NAK or a NAK).
func isPlainACK(b []byte) bool {
	return len(b) == ib.BTHLen+ib.AETHLen && ib.Opcode(b[0]) == ib.RCAcknowledge && b[ib.BTHLen]&0x60 == ib.SyndromeACK
}

func (q *RC) nak(psn uint32, code uint8) {
	q.stats.NAKsSent++
	p := ib.Packet{BTH: q.bth(ib.RCAcknowledge, psn, false), AETH: ib.AETH{Syndrome: ib.SyndromeNAK | code, MSN: q.msn}}
	q.emit(&p)
}

func (q *RC) request(p *ib.Packet) {
	psn := p.BTH.PSN
	switch d := psnDiff(psn, q.ePSN); {
	case d > 0:
		// Ahead of what we expect: one NAK until the gap is filled.
		if !q.nakSent {
			q.nakSent = true
			q.nak(q.ePSN, ib.NAKPSNSequenceError)
		}
		return
	case d < 0:
		// A duplicate: acknowledge again, or answer a Read again (Reads
		// are idempotent; the data is read anew).
		q.stats.Duplicates++
		if p.BTH.Opcode == ib.RCReadRequest {
			q.readResponse(p, false)
			return
		}
		// One acknowledgement per retransmitted message (its packet
		// that asks for one), not one per duplicate packet.
		if p.BTH.AckReq {
			q.ack((q.ePSN - 1) & psnMask)
		}
		return
	}
	switch op := p.BTH.Opcode; op {
	case ib.RCSendFirst, ib.RCSendMiddle, ib.RCSendLast, ib.RCSendLastImm, ib.RCSendOnly, ib.RCSendOnlyImm,
		ib.RCSendLastInvalidate, ib.RCSendOnlyInvalidate:
		q.send(p)
	case ib.RCWriteFirst, ib.RCWriteMiddle, ib.RCWriteLast, ib.RCWriteLastImm, ib.RCWriteOnly, ib.RCWriteOnlyImm:
		q.write(p)
	case ib.RCReadRequest:
		q.readResponse(p, true)
	default:
		q.nak(psn, ib.NAKInvalidRequest)
	}
}

func (q *RC) accept(p *ib.Packet, msgEnd bool) {
	q.ePSN = (q.ePSN + 1) & psnMask
	q.nakSent = false
	if msgEnd {
		q.msn = (q.msn + 1) & psnMask
	}
	if p.BTH.AckReq {
		q.ack(p.BTH.PSN)
	}
}

func (q *RC) send(p *ib.Packet) {
	op := p.BTH.Opcode
	first := op == ib.RCSendFirst || op == ib.RCSendOnly || op == ib.RCSendOnlyImm || op == ib.RCSendOnlyInvalidate
	last := op != ib.RCSendFirst && op != ib.RCSendMiddle
	if first {
		if q.cur != nil {
			q.nak(p.BTH.PSN, ib.NAKInvalidRequest)
			return
		}
		if len(q.recvs) == 0 {
			// No receive posted: RNR NAK, the requester tries again.
			q.stats.RNRNAKsSent++
			np := ib.Packet{BTH: q.bth(ib.RCAcknowledge, p.BTH.PSN, false), AETH: ib.AETH{Syndrome: ib.SyndromeRNR | 1, MSN: q.msn}}
			q.emit(&np)
			return
		}
		r := q.recvs[0]
		q.recvs = q.recvs[1:]
		q.cur, q.curOff = &r, 0
	} else if q.cur == nil {
		q.nak(p.BTH.PSN, ib.NAKInvalidRequest)
		return
	}
	if q.curOff+len(p.Payload) > len(q.cur.Buf) {
		// Longer than the receive buffer: the receive fails, and so does
		// the requester's Send.
		q.pushRecv(rdma.Completion{ID: q.cur.ID, Op: rdma.OpRecv, Status: rdma.LocalLength, QP: q})
		q.cur = nil
		q.nak(p.BTH.PSN, ib.NAKInvalidRequest)
		return
	}
	q.curOff += copy(q.cur.Buf[q.curOff:], p.Payload)
	if last {
		c := rdma.Completion{ID: q.cur.ID, Op: rdma.OpRecv, Status: rdma.Success, Len: q.curOff, Solicited: p.BTH.Solicited, QP: q}
		if op == ib.RCSendLastInvalidate || op == ib.RCSendOnlyInvalidate {
			if f := q.dev.InvalidateRemote(p.IETH, q.cfg.PD); f != rdma.FaultNone {
				q.pushRecv(rdma.Completion{ID: q.cur.ID, Op: rdma.OpRecv, Status: rdma.RemoteAccess, QP: q})
				q.cur = nil
				q.nak(p.BTH.PSN, ib.NAKRemoteAccessError)
				return
			}
			c.Invalidated, c.STag = true, p.IETH
		}
		q.cur = nil
		q.pushRecv(c)
	}
	q.accept(p, last)
}

func (q *RC) pushRecv(c rdma.Completion) {
	q.complete(q.cfg.RecvCQ, c)
}

func (q *RC) write(p *ib.Packet) {
	op := p.BTH.Opcode
	first := op == ib.RCWriteFirst || op == ib.RCWriteOnly || op == ib.RCWriteOnlyImm
	last := op != ib.RCWriteFirst && op != ib.RCWriteMiddle
	if first {
		dst, f := q.dev.Resolve(p.RETH.RKey, q.cfg.PD, rdma.RemoteWrite, p.RETH.VA, int(p.RETH.DMALen))
		if f != rdma.FaultNone {
			q.nak(p.BTH.PSN, ib.NAKRemoteAccessError)
			return
		}
		q.wdst = dst
	} else if q.wdst == nil {
		q.nak(p.BTH.PSN, ib.NAKInvalidRequest)
		return
	}
	if len(p.Payload) > len(q.wdst) {
		q.wdst = nil
		q.nak(p.BTH.PSN, ib.NAKRemoteAccessError) // beyond what RETH named
		return
	}
	n := copy(q.wdst, p.Payload)
	q.wdst = q.wdst[n:]
	if last {
		if len(q.wdst) != 0 {
			q.wdst = nil
			q.nak(p.BTH.PSN, ib.NAKInvalidRequest) // shorter than RETH said
			return
		}
		q.wdst = nil
	}
	q.accept(p, last)
}

// readResponse answers a Read Request with the data, in MTU packets
// numbered from the request's PSN; fresh moves the expected PSN past them.
func (q *RC) readResponse(p *ib.Packet, fresh bool) {
	n := int(p.RETH.DMALen)
	src, f := q.dev.Resolve(p.RETH.RKey, q.cfg.PD, rdma.RemoteRead, p.RETH.VA, n)
	if f != rdma.FaultNone {
		q.nak(p.BTH.PSN, ib.NAKRemoteAccessError)
		return
	}
	npkts := max(1, (n+q.cfg.MTU-1)/q.cfg.MTU)
	if fresh {
		q.ePSN = (q.ePSN + uint32(npkts)) & psnMask
		q.nakSent = false
		q.msn = (q.msn + 1) & psnMask
	}
	for i := range npkts {
		off := i * q.cfg.MTU
		op := ib.RCReadResponseMiddle
		switch {
		case npkts == 1:
			op = ib.RCReadResponseOnly
		case i == 0:
			op = ib.RCReadResponseFirst
		case i == npkts-1:
			op = ib.RCReadResponseLast
		}
		rp := ib.Packet{BTH: q.bth(op, (p.BTH.PSN+uint32(i))&psnMask, false),
			AETH: ib.AETH{Syndrome: ib.SyndromeACK | 0x1f, MSN: q.msn}}
		// Straight from the registered region (an RNIC reads it by DMA
		// as it transmits; a region invalidated meanwhile is the
		// application's error, as on hardware).
		q.emitRef(&rp, src[off:min(off+q.cfg.MTU, n)])
	}
}

// ---- failure ----

// failLocked moves the QP to the error state: every request still queued
// completes as flushed, and Done closes.
func (q *RC) failLocked(err error) {
	if q.failed {
		return
	}
	q.failed, q.err = true, err
	q.timer.Stop()
	if err == nil && q.onClose != nil {
		q.onClose()
	}
	for _, w := range q.sq {
		q.deliver(w, rdma.Flushed, 0)
	}
	q.sq = nil
	for _, r := range q.recvs {
		q.pushRecv(rdma.Completion{ID: r.ID, Op: rdma.OpRecv, Status: rdma.Flushed, QP: q})
	}
	q.recvs = nil
	close(q.done)
}

var _ rdma.QP = (*RC)(nil)
