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
	"sync"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/iscsi/pdu"
)

// Conn is the TCP datamover of one connection.
type Conn struct {
	nc    net.Conn
	br    *bufio.Reader
	stamp datamover.Stamper

	// Receive-side settings; touched only by the Serve goroutine (login
	// runs inside it), so they need no lock.
	rxHeaderDigest bool
	rxDataDigest   bool
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
	hdr            [pdu.BHSLen + 4]byte
	trailer        [8]byte
	iov            [3][]byte
	bufs           net.Buffers
	dih            pdu.BHS // Data-In header scratch, under wmu
	noStatSN       bool    // clear StatSN after stamping (Data-In without S)
	closed         bool

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
	return &Conn{
		nc:      nc,
		br:      bufio.NewReaderSize(nc, 64*1024),
		stamp:   stamp,
		maxRecv: 8192,
		maxXmit: 8192,
	}
}

// RemoteAddr implements datamover.Conn.
func (c *Conn) RemoteAddr() string { return c.nc.RemoteAddr().String() }

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

// ConnectionTerminate closes the socket; Serve returns.
func (c *Conn) ConnectionTerminate() {
	c.wmu.Lock()
	c.closed = true
	c.wmu.Unlock()
	c.nc.Close()
}

// SendControl implements datamover.Conn: one vectored write per PDU.
func (c *Conn) SendControl(p *datamover.PDU, advance bool) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(&p.BHS, p.AHS, p.Data, advance)
}

func (c *Conn) writeLocked(h *pdu.BHS, ahs []byte, data []byte, advance bool) error {
	if c.closed {
		return net.ErrClosed
	}
	// Work on the connection's own header copy, so the caller's BHS does
	// not escape through the stamper (no allocation per PDU).
	copy(c.hdr[:pdu.BHSLen], h[:])
	hh := (*pdu.BHS)(c.hdr[:pdu.BHSLen])
	if c.stamp != nil {
		c.stamp(hh, advance)
	}
	if c.noStatSN {
		hh[24], hh[25], hh[26], hh[27] = 0, 0, 0, 0
	}
	hh.SetTotalAHSLength(len(ahs))
	hh.SetDataSegmentLength(len(data))
	n := 0
	hl := pdu.BHSLen
	if len(ahs) > 0 {
		// AHS is rare on the target side; keep the header contiguous.
		buf := make([]byte, 0, pdu.BHSLen+len(ahs)+4)
		buf = append(append(buf, hh[:]...), ahs...)
		if c.txHeaderDigest {
			var d [4]byte
			pdu.PutDigest(d[:], pdu.Digest(buf))
			buf = append(buf, d[:]...)
		}
		c.iov[n] = buf
	} else {
		if c.txHeaderDigest {
			pdu.PutDigest(c.hdr[pdu.BHSLen:], pdu.Digest(c.hdr[:pdu.BHSLen]))
			hl += 4
		}
		c.iov[n] = c.hdr[:hl]
	}
	n++
	if len(data) > 0 {
		c.iov[n] = data
		n++
		t := pdu.Pad(len(data))
		clear(c.trailer[:t])
		if c.txDataDigest {
			pdu.PutDigest(c.trailer[t:], pdu.DataDigest(data))
			t += 4
		}
		if t > 0 {
			c.iov[n] = c.trailer[:t]
			n++
		}
	}
	c.bufs = c.iov[:n]
	_, err := c.bufs.WriteTo(c.nc)
	for i := range c.iov {
		c.iov[i] = nil
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
	max := c.maxXmit
	burst := c.maxBurst
	if burst <= 0 {
		burst = len(d.Data)
	}
	off := 0
	seq := 0 // bytes sent in the current sequence
	h := &c.dih
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
		di.Encode(h)
		if !di.HasStatus {
			// StatSN is reserved without S; the stamper must not advance it
			// and we clear what it writes (RFC 7143 §11.7.4).
			if err := c.writeNoStatSN(h, d.Data[off:off+n]); err != nil {
				return err
			}
		} else if err := c.writeLocked(h, nil, d.Data[off:off+n], advance); err != nil {
			return err
		}
		off += n
		if last {
			return nil
		}
	}
}

func (c *Conn) writeNoStatSN(h *pdu.BHS, data []byte) error {
	c.noStatSN = true
	err := c.writeLocked(h, nil, data, false)
	c.noStatSN = false
	return err
}

// GetData implements datamover.Conn for TCP: it transmits the R2T; the
// solicited Data-Out PDUs arrive through Serve and are placed by the iSCSI
// layer's DataBuffer.
func (c *Conn) GetData(r2t *pdu.R2T, _ []byte) error {
	var h pdu.BHS
	r2t.Encode(&h)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(&h, nil, nil, false)
}

// Serve implements datamover.Conn: it reads PDUs until the connection ends.
func (c *Conn) Serve(up datamover.Upcalls) {
	err := c.serve(up)
	c.nc.Close()
	up.ConnectionTerminateNotify(err)
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
		if perr == nil {
			perr = up.ControlNotify(&p)
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
