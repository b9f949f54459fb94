// Package tcp is the traditional iSCSI datamover (RFC 7143): PDUs framed on
// a TCP byte stream, Data-In PDUs for Put_Data, R2T for Get_Data, CRC32C
// header and data digests. It implements datamover.Conn over a net.Conn.
package tcp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/internal/sendguard"
	"github.com/blockwire/blockwire/internal/sockpoll"
	"github.com/blockwire/blockwire/iscsi/pdu"
)

// Conn is the TCP datamover of one connection.
type Conn struct {
	nc    net.Conn
	br    *bufio.Reader
	poll  *sockpoll.Reader // under br, after SetPoll on a TCP socket
	rw    *rawWriter       // under wmu's flushing, after SetPoll on a TCP socket
	stamp datamover.Stamper

	// Receive-side settings; touched only by the Serve goroutine (login
	// runs inside it), so they need no lock.
	rxHeaderDigest bool
	rxDataDigest   bool
	handoff        bool // stop after the current PDU (RequestHandoff)
	maxRecv        int
	scratch        []byte
	ahs            [1024]byte
	dig            [4]byte
	tail           [8]byte

	wmu            sync.Mutex
	txHeaderDigest bool
	txDataDigest   bool
	maxXmit        int
	maxBurst       int // 0: unbounded
	closed         bool

	// Group commit: senders queue their PDUs in the current batch; one of
	// them (the leader) writes whole batches with one vectored write each
	// while the others wait for theirs, so concurrent responses share
	// system calls. A sender returns only once its bytes are written, so
	// the buffers it lent stay valid until then.
	cond     *sync.Cond
	batches  [2]batch
	cur      *batch
	gen      uint64 // generation of cur
	written  uint64 // batches with a generation below this are written
	flushing bool
	werr     error
	// sendTimeout bounds how long one write may block (SetSendTimeout):
	// a peer that stops reading is dropped rather than holding the
	// connection's buffers and tasks for ever.
	sendTimeout time.Duration
	iovs        [3 * batchSize][]byte
	bufs        net.Buffers

	// Data-In PDUs sent with the A-bit whose DataACK SNACK is awaited,
	// by TTT (the ITT; RFC 7143 §11.7.4, §11.16.3). Guarded by wmu.
	acks map[uint32]bool

	pending     datamover.Params
	havePending bool
	enabled     bool // full feature phase; guarded by wmu
}

// New wraps a connected socket. stamp fills sequence numbers of outgoing
// PDUs (see datamover.Stamper).
func New(nc net.Conn, stamp datamover.Stamper) *Conn {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c := &Conn{
		nc:      nc,
		br:      bufio.NewReaderSize(nc, 64*1024),
		stamp:   stamp,
		maxRecv: 8192,
		maxXmit: 8192,
	}
	c.cond = sync.NewCond(&c.wmu)
	c.cur = &c.batches[0]
	return c
}

const batchSize = 64

// slot is one queued PDU: its stamped header (and digest), the data it
// borrows from the sender, and the pad/digest trailer.
type slot struct {
	hdr     [pdu.BHSLen + 4]byte
	long    []byte // header + AHS + digest, when there is an AHS (rare)
	hl      int
	data    []byte
	trailer [8]byte
	tl      int
}

type batch struct {
	slots [batchSize]slot
	n     int
}

// SetPoll makes the connection's reader poll its socket after finding it
// empty before it sleeps, as the group says, and its reads and writes raw
// system calls (sockpoll.Reader, rawWriter); nil: it sleeps at once. Call
// it before Serve.
func (c *Conn) SetPoll(g *sockpoll.Group) {
	if c.poll = sockpoll.New(c.nc, g); c.poll != nil {
		c.br.Reset(c.poll)
		c.rw = newRawWriter(c.nc)
	}
}

// SetSendTimeout bounds how long a write may block on a peer that does not
// read; past it the connection is closed. Zero: no bound. Call it before
// the connection is used.
func (c *Conn) SetSendTimeout(d time.Duration) { c.sendTimeout = d }

// RemoteAddr implements datamover.Conn.
func (c *Conn) RemoteAddr() string { return c.nc.RemoteAddr().String() }

// Gone implements datamover.Liveness.
func (c *Conn) Gone() bool { return sockpoll.Gone(c.nc) }

// LocalAddr implements datamover.Conn.
func (c *Conn) LocalAddr() string { return c.nc.LocalAddr().String() }

// AllocateConnectionResources implements datamover.Conn; TCP needs none.
func (c *Conn) AllocateConnectionResources(p datamover.Params) error { return nil }

// DeallocateConnectionResources implements datamover.Conn.
func (c *Conn) DeallocateConnectionResources() {}

// DeallocateTaskResources implements datamover.Conn; TCP holds nothing per
// task.
func (c *Conn) DeallocateTaskResources(itt uint32) {}

// NoticeKeyValues records the negotiated values; they take effect at
// EnableDatamover, or at once for the segment length in full feature phase.
func (c *Conn) NoticeKeyValues(p datamover.Params) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.enabled {
		if p.MaxXmitDataSegmentLength > 0 {
			c.maxXmit = p.MaxXmitDataSegmentLength
		}
		return
	}
	c.pending = p
	c.havePending = true
}

// EnableDatamover sends the final Login Response without digests and
// switches both directions to the negotiated digests and segment sizes
// (RFC 7143 §13.1: digests start after the Login Phase).
func (c *Conn) EnableDatamover(final *datamover.PDU) error {
	// The target sends its final Login Response first; an initiator,
	// which has just received it, passes nil.
	if final != nil {
		if err := c.SendControl(final, true); err != nil {
			return err
		}
	}
	c.wmu.Lock()
	c.enabled = true
	have, p := c.havePending, c.pending
	c.wmu.Unlock()
	if !have {
		return nil
	}
	c.rxHeaderDigest, c.rxDataDigest = p.HeaderDigest, p.DataDigest
	if p.MaxRecvDataSegmentLength > 0 {
		c.maxRecv = p.MaxRecvDataSegmentLength
	}
	c.wmu.Lock()
	c.txHeaderDigest, c.txDataDigest = p.HeaderDigest, p.DataDigest
	if p.MaxXmitDataSegmentLength > 0 {
		c.maxXmit = p.MaxXmitDataSegmentLength
	}
	if p.MaxBurstLength > 0 {
		c.maxBurst = p.MaxBurstLength
	}
	c.wmu.Unlock()
	return nil
}

// MaxSendDataSegmentLength implements datamover.Conn.
func (c *Conn) MaxSendDataSegmentLength() int {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.maxXmit
}

// Pending reports whether received bytes wait to be read: the next PDU has
// (at least partly) arrived.
func (c *Conn) Pending() bool { return c.br.Buffered() > 0 }

// ConnectionTerminate closes the socket; Serve returns.
func (c *Conn) ConnectionTerminate() {
	c.wmu.Lock()
	c.closed = true
	c.wmu.Unlock()
	c.nc.Close()
}

// SendControl implements datamover.Conn. PDUs are written with vectored
// writes, several senders' PDUs sharing one when they arrive together.
func (c *Conn) SendControl(p *datamover.PDU, advance bool) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	g, err := c.enqueueLocked(&p.BHS, p.AHS, p.Data, advance, false)
	if err != nil {
		return err
	}
	return c.commitLocked(g, p.More)
}

// enqueueLocked stamps a PDU and queues it, returning the generation of the
// batch it joined.
// With noStatSN the StatSN field is cleared after stamping (Data-In
// without status).
func (c *Conn) enqueueLocked(h *pdu.BHS, ahs []byte, data []byte, advance, noStatSN bool) (uint64, error) {
	for {
		if c.closed {
			return 0, net.ErrClosed
		}
		if c.werr != nil {
			return 0, c.werr
		}
		if c.cur.n < batchSize {
			break
		}
		if c.flushing {
			c.cond.Wait()
		} else {
			c.leadLocked()
		}
	}
	s := &c.cur.slots[c.cur.n]
	c.cur.n++
	// The slot holds its own header copy, so the caller's BHS does not
	// escape through the stamper (no allocation per PDU).
	copy(s.hdr[:pdu.BHSLen], h[:])
	hh := (*pdu.BHS)(s.hdr[:pdu.BHSLen])
	if c.stamp != nil {
		c.stamp(hh, advance)
	}
	if noStatSN {
		hh.SetStatSN(0)
	}
	hh.SetTotalAHSLength(len(ahs))
	hh.SetDataSegmentLength(len(data))
	s.long = nil
	s.hl = pdu.BHSLen
	if len(ahs) > 0 {
		buf := make([]byte, 0, pdu.BHSLen+len(ahs)+4)
		buf = append(append(buf, hh[:]...), ahs...)
		if c.txHeaderDigest {
			var d [4]byte
			pdu.PutDigest(d[:], pdu.Digest(buf))
			buf = append(buf, d[:]...)
		}
		s.long = buf
	} else if c.txHeaderDigest {
		pdu.PutDigest(s.hdr[pdu.BHSLen:], pdu.Digest(s.hdr[:pdu.BHSLen]))
		s.hl += 4
	}
	s.data = data
	s.tl = 0
	if len(data) > 0 {
		s.tl = pdu.Pad(len(data))
		clear(s.trailer[:s.tl])
		if c.txDataDigest {
			pdu.PutDigest(s.trailer[s.tl:], pdu.DataDigest(data))
			s.tl += 4
		}
	}
	return c.gen, nil
}

// commitLocked returns once batch g has been written: it writes batches
// itself when no other sender is doing so, after yielding once with
// linger (PDU.More).
func (c *Conn) commitLocked(g uint64, linger bool) error {
	for c.written <= g {
		if c.werr != nil {
			return c.werr
		}
		if c.flushing {
			c.cond.Wait()
			continue
		}
		if linger {
			// Others' responses may be moments away: let them queue
			// behind ours (flushing holds them in cond.Wait), then write
			// all with one system call.
			linger = false
			c.flushing = true
			c.wmu.Unlock()
			runtime.Gosched()
			c.wmu.Lock()
			c.flushing = false
			continue
		}
		c.leadLocked()
	}
	return nil
}

// leadLocked writes queued batches until none is left. The lock is released
// during each write so that other senders can queue the next batch.
func (c *Conn) leadLocked() {
	c.flushing = true
	for c.cur.n > 0 && c.werr == nil {
		b, g := c.cur, c.gen
		if c.cur == &c.batches[0] {
			c.cur = &c.batches[1]
		} else {
			c.cur = &c.batches[0]
		}
		c.cur.n = 0
		c.gen++
		c.wmu.Unlock()
		err := c.writeBatch(b)
		c.wmu.Lock()
		if err != nil {
			c.werr = err
		}
		c.written = g + 1
		c.cond.Broadcast()
	}
	c.flushing = false
	c.cond.Broadcast()
}

// writeBatch sends a batch with one vectored write (the kernel may take it
// in several system calls when it is large).
func (c *Conn) writeBatch(b *batch) error {
	c.bufs = c.iovs[:0]
	for i := 0; i < b.n; i++ {
		s := &b.slots[i]
		if s.long != nil {
			c.bufs = append(c.bufs, s.long)
		} else {
			c.bufs = append(c.bufs, s.hdr[:s.hl])
		}
		if len(s.data) > 0 {
			c.bufs = append(c.bufs, s.data)
		}
		if s.tl > 0 {
			c.bufs = append(c.bufs, s.trailer[:s.tl])
		}
	}
	// Each stretch of the send timeout must move sendguard.MinProgress
	// bytes: a peer that stops reading, or reads a trickle, is dropped.
	var err error
	if c.rw != nil {
		_, err = sendguard.WriteWith(c.nc, &c.bufs, c.sendTimeout, c.rw.write)
	} else {
		_, err = sendguard.Write(c.nc, &c.bufs, c.sendTimeout)
	}
	if err != nil {
		// A stream with a failed or timed-out write is broken: close it,
		// so the receiver ends too and the connection's tasks are released.
		c.nc.Close()
	}
	for i := 0; i < b.n; i++ {
		b.slots[i].data = nil
		b.slots[i].long = nil
	}
	for i := range c.iovs {
		c.iovs[i] = nil
	}
	return err
}

// PutData implements datamover.Conn: the data is cut into Data-In PDUs of
// at most MaxRecvDataSegmentLength (the initiator's declaration), DataSN
// counting up, grouped into sequences of at most MaxBurstLength whose last
// PDU carries F, the very last one carrying the status when asked (RFC
// 7143 §11.7, §13.13).
func (c *Conn) PutData(d *datamover.DataIn) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	var g uint64
	max := c.maxXmit
	burst := c.maxBurst
	if burst <= 0 {
		burst = len(d.Data)
	}
	off := 0
	seq := 0      // bytes sent in the current sequence
	var h pdu.BHS // enqueueLocked may wait and unlock: no shared scratch
	for {
		n := min(len(d.Data)-off, max, burst-seq)
		last := off+n >= len(d.Data)
		seq += n
		endSeq := seq == burst
		if endSeq {
			seq = 0
		}
		di := pdu.DataIn{
			LUN:    d.LUN,
			ITT:    d.ITT,
			TTT:    pdu.ReservedTTT,
			DataSN: *d.DataSN,
			Offset: d.Offset + uint32(off),
		}
		*d.DataSN++
		advance := false
		if endSeq && !last {
			di.Final = true // end of a Data-In sequence, not of the data
		}
		if last && d.Ack {
			// RFC 7143 §11.7.2: the A-bit asks for a DataACK SNACK,
			// which names this PDU by its TTT.
			di.Ack, di.TTT = true, d.ITT
			if c.acks == nil {
				c.acks = map[uint32]bool{}
			}
			c.acks[d.ITT] = true
		}
		if last && d.Final {
			di.Final = true
			if d.WithStatus {
				di.HasStatus = true
				di.Status = d.Status
				di.Overflow = d.Overflow
				di.Underflow = d.Underflow
				di.Residual = d.Residual
				advance = true
			}
		}
		di.Encode(&h)
		// Without S, StatSN is reserved: the stamper must not advance it
		// and what it writes is cleared (RFC 7143 §11.7.4).
		var err error
		g, err = c.enqueueLocked(&h, nil, d.Data[off:off+n], advance, !di.HasStatus)
		if err != nil {
			return err
		}
		off += n
		if last {
			return c.commitLocked(g, d.More)
		}
	}
}

// GetData implements datamover.Conn for TCP: it transmits the R2T; the
// solicited Data-Out PDUs arrive through Serve and are placed by the iSCSI
// layer's DataBuffer.
func (c *Conn) GetData(r2t *pdu.R2T, _ []byte) error {
	var p datamover.PDU
	r2t.Encode(&p.BHS)
	return c.SendControl(&p, false)
}

// Serve implements datamover.Conn: it reads PDUs until the connection
// ends, or until a handoff was asked for (see Handoff).
func (c *Conn) Serve(up datamover.Upcalls) {
	err := c.serve(up)
	if err == errHandoff {
		return
	}
	// The connection has ended: sends fail from now on (closing the
	// socket first unblocks a send holding wmu).
	c.nc.Close()
	c.wmu.Lock()
	c.closed = true
	c.wmu.Unlock()
	up.ConnectionTerminateNotify(err)
}

var errHandoff = errors.New("iscsi: connection handed to another datamover")

// RequestHandoff makes Serve return, without closing the connection or
// notifying termination, once the PDU being delivered has been handled:
// the RFC 5046 §5.1 switch from byte-stream mode to an RDMA stream after
// the final Login Response (RFC 5046 §5.1). Call it from ControlNotify.
func (c *Conn) RequestHandoff() { c.handoff = true }

// Handoff returns the socket and the bytes already read from it but not
// yet consumed, after Serve returned for a handoff.
func (c *Conn) Handoff() (net.Conn, []byte) {
	n := c.br.Buffered()
	pre, _ := c.br.Peek(n)
	return c.nc, append([]byte(nil), pre...)
}

// ErrHeaderDigest is a header digest mismatch; at ErrorRecoveryLevel 0 the
// connection is dropped (RFC 7143 §7.8).
var ErrHeaderDigest = errors.New("iscsi: header digest mismatch (RFC 7143 §7.8)")

func (c *Conn) serve(up datamover.Upcalls) error {
	var p datamover.PDU
	dig := c.dig[:]
	for {
		if _, err := io.ReadFull(c.br, p.BHS[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		h := &p.BHS
		ahsLen := h.TotalAHSLength()
		p.AHS = c.ahs[:ahsLen]
		if ahsLen > 0 {
			if _, err := io.ReadFull(c.br, p.AHS); err != nil {
				return fmt.Errorf("iscsi: reading %d AHS bytes: %w", ahsLen, err)
			}
		}
		if c.rxHeaderDigest {
			if _, err := io.ReadFull(c.br, dig); err != nil {
				return err
			}
			if pdu.GetDigest(dig) != pdu.Digest(h[:], p.AHS) {
				return ErrHeaderDigest
			}
		}
		dsl := h.DataSegmentLength()
		if dsl > c.maxRecv {
			// RFC 7143 §12.12: a data segment above the declared
			// MaxRecvDataSegmentLength is a protocol error; the stream
			// cannot be trusted, so the connection is dropped.
			return fmt.Errorf("iscsi: %s data segment of %d bytes exceeds MaxRecvDataSegmentLength %d (RFC 7143 §12.12)",
				h.Opcode(), dsl, c.maxRecv)
		}
		var perr error
		var buf []byte
		if dsl > 0 {
			var err error
			buf, err = up.DataBuffer(h)
			if err != nil {
				perr = err
				buf = nil
			}
			if buf == nil {
				if cap(c.scratch) < dsl {
					c.scratch = make([]byte, max(dsl, 8192))
				}
				buf = c.scratch[:dsl]
			}
			if len(buf) < dsl {
				return fmt.Errorf("iscsi: internal: data buffer of %d bytes for %d-byte segment", len(buf), dsl)
			}
			buf = buf[:dsl]
			if _, err := io.ReadFull(c.br, buf); err != nil {
				return err
			}
			pad := pdu.Pad(dsl)
			tail := c.tail[:]
			t := pad
			if c.rxDataDigest {
				t += 4
			}
			if t > 0 {
				if _, err := io.ReadFull(c.br, tail[:t]); err != nil {
					return err
				}
			}
			if c.rxDataDigest && perr == nil {
				if pdu.DataDigest(buf) != pdu.GetDigest(tail[pad:pad+4]) {
					// RFC 7143 §7.8 / §11.17.1: a data digest error is
					// answered with Reject reason 0x02 and the PDU is
					// discarded.
					perr = &datamover.ProtocolError{Reject: true, Reason: pdu.RejectDataDigest,
						Err: fmt.Errorf("iscsi: %s data digest mismatch (RFC 7143 §7.8)", h.Opcode())}
				}
			}
		}
		p.Data = buf
		if perr == nil && c.dataACK(h, up) {
			continue
		}
		if perr == nil {
			perr = up.ControlNotify(&p)
			if perr == nil && c.handoff {
				return errHandoff
			}
		}
		if perr != nil {
			var pe *datamover.ProtocolError
			if errors.As(perr, &pe) && pe.Reject {
				if err := c.sendReject(pe.Reason, h); err != nil {
					return err
				}
				continue
			}
			return perr
		}
	}
}

// sendReject answers a PDU with Reject carrying its header (RFC 7143
// §11.17).
func (c *Conn) sendReject(reason pdu.RejectReason, rejected *pdu.BHS) error {
	var r datamover.PDU
	rj := pdu.Reject{Reason: reason, DataSN: 0}
	rj.Encode(&r.BHS)
	hdr := *rejected
	r.Data = hdr[:]
	return c.SendControl(&r, true)
}

// dataACK consumes a DataACK SNACK that answers a Data-In sent with the
// A-bit and reports it as Data_ACK_Notify (draft-ietf-ips-iwarp-da §10.4; RFC 7143
// §11.16.3: TTT names the Data-In, BegRun is the next DataSN). Any other
// SNACK goes to the iSCSI layer.
func (c *Conn) dataACK(h *pdu.BHS, up datamover.Upcalls) bool {
	if h.Opcode() != pdu.OpSNACKReq || h.SNACKType() != pdu.SNACKDataACK {
		return false
	}
	ttt := h.TTT()
	c.wmu.Lock()
	ok := c.acks[ttt]
	delete(c.acks, ttt)
	c.wmu.Unlock()
	if ok {
		up.DataACKNotify(ttt, h.BufferOffset())
	}
	return ok
}
