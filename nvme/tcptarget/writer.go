package tcptarget

import (
	"math/bits"
	"net"

	"github.com/blockwire/blockwire/nvme"
	"github.com/blockwire/blockwire/nvme/nvmetarget"
	"github.com/blockwire/blockwire/nvme/nvmetcp"
)

// maxBatch bounds the answers one vectored write carries.
const maxBatch = 64

// batch is what one vectored write sends: headers encoded into one
// arena, payloads referenced where they are (never copied), and the
// commands to release once the write is done.
type batch struct {
	arena []byte
	bufs  net.Buffers
	done  []held // released once the batch is written
	n     int    // replies in the batch
	term  bool
}

// writer sends what the connection queues, in order, until it ends:
// what is queued together leaves in one vectored write.
func (c *conn) writer() {
	defer close(c.writerDone)
	b := newBatch()
	for {
		select {
		case r := <-c.out:
			c.add(b, r)
		more:
			for b.n < maxBatch && !b.term {
				select {
				case r := <-c.out:
					c.add(b, r)
				default:
					break more
				}
			}
			n := b.n
			c.writerWritten += n
			err := c.flush(b)
			c.queued.Add(-int32(n))
			if err != nil || b.term {
				c.Close()
				c.drain()
				return
			}
		case <-c.done:
			c.drain()
			return
		}
	}
}

// newBatch returns a batch with room for maxBatch answers' headers.
func newBatch() *batch {
	return &batch{arena: make([]byte, 0, maxBatch*(nvmetcp.DataLen+2*nvmetcp.DigestLen+128+nvmetcp.CapsuleRespLen+nvmetcp.DigestLen))}
}

// drop releases a batch's commands unsent.
func (c *conn) drop(b *batch) {
	for _, h := range b.done {
		h.release(c)
	}
	clear(b.bufs)
	b.arena, b.bufs, b.done, b.n = b.arena[:0], b.bufs[:0], b.done[:0], 0
}

// flush writes the batch and releases its commands.
func (c *conn) flush(b *batch) error {
	var err error
	iov := b.bufs
	if len(b.bufs) > 0 {
		_, err = b.bufs.WriteTo(c.nc) // consumes b.bufs
	}
	for _, h := range b.done {
		h.release(c)
	}
	clear(iov) // no payload stays referenced
	b.arena, b.bufs, b.done, b.n = b.arena[:0], iov[:0], b.done[:0], 0
	return err
}

// drain releases the answers queued but not sent.
func (c *conn) drain() {
	for {
		select {
		case r := <-c.out:
			if r.cm != nil {
				r.cm.release()
			}
		default:
			return
		}
	}
}

// hdr appends n bytes for a header to the arena and returns them: the
// arena never grows past its capacity while a batch refers to it (a
// batch ends before it would).
func (b *batch) hdr(n int) []byte {
	if len(b.arena)+n > cap(b.arena) {
		// Cannot happen with maxBatch entries of at most this size; a
		// fresh arena keeps what bufs refer to intact if it did.
		b.arena = make([]byte, 0, max(cap(b.arena), n))
	}
	start := len(b.arena)
	b.arena = b.arena[:start+n]
	return b.arena[start : start+n]
}

// add encodes one reply into the batch.
func (c *conn) add(b *batch, r reply) {
	b.n++
	switch {
	case r.term != nil:
		b.bufs = append(b.bufs, r.term.Append(nil, r.bad))
		b.term = true
	case r.r2t != nil:
		h := b.hdr(nvmetcp.R2TLen + nvmetcp.DigestLen)
		t := nvmetcp.R2T{CCCID: r.r2t.cmd.CID, TTag: r.r2t.ttag, Offset: uint32(r.r2t.got), Length: uint32(len(r.r2t.data) - r.r2t.got)}
		if c.hdgst {
			t.Flags = nvmetcp.FlagHDGST
		}
		t.Encode(h)
		b.bufs = append(b.bufs, h[:c.hdrLen(nvmetcp.R2TLen, h)])
	case r.post != nil:
		c.addResp(b, r.post)
	default:
		cm := r.cm
		cqe := cm.res.CQE
		cqe.CID, cqe.SQHD = cm.cmd.CID, cm.sqhd
		if c.q != nil {
			cqe.SQID = c.q.ID()
		}
		if cm.dir == nvmetarget.ControllerToHost && cm.res.N > 0 && cqe.Status == nvme.StatusSuccess {
			c.addC2H(b, cm, cm.data[:cm.res.N])
		}
		c.addResp(b, &cqe)
		b.done = append(b.done, cm.detach())
	}
}

// write sends one reply at once (before the writer runs: the Connect's
// answer, a refusal, a termination request).
func (c *conn) write(r reply) error {
	b := &batch{arena: make([]byte, 0, nvmetcp.MaxTermPLen+nvmetcp.CapsuleRespLen+nvmetcp.DigestLen)}
	c.add(b, r)
	return c.flush(b) // releases r's command
}

// hdrLen appends the header digest to a header of n bytes in b when
// negotiated and returns the length to send.
func (c *conn) hdrLen(n int, b []byte) int {
	if !c.hdgst {
		return n
	}
	nvmetcp.PutDigest(b[n:], nvmetcp.Digest(b[:n]))
	return n + nvmetcp.DigestLen
}

// addResp adds a response capsule.
func (c *conn) addResp(b *batch, cqe *nvme.Completion) {
	h := b.hdr(nvmetcp.CapsuleRespLen + nvmetcp.DigestLen)
	r := nvmetcp.CapsuleResp{}
	if c.hdgst {
		r.Flags = nvmetcp.FlagHDGST
	}
	cqe.Encode((*[nvme.CQELen]byte)(r.CQE[:]))
	r.Encode(h)
	b.bufs = append(b.bufs, h[:c.hdrLen(nvmetcp.CapsuleRespLen, h)])
}

// addC2H adds a read's data as one C2HData PDU: header, its digest,
// padding to the host's alignment, the data (from the command's buffer,
// not copied), its digest.
func (c *conn) addC2H(b *batch, cm *command, data []byte) {
	hl := nvmetcp.DataLen
	if c.hdgst {
		hl += nvmetcp.DigestLen
	}
	pdo := (hl + c.align - 1) / c.align * c.align
	plen := pdo + len(data)
	d := nvmetcp.Data{Type: nvmetcp.TypeC2HData, Flags: nvmetcp.FlagLastPDU, PDO: uint8(pdo), CCCID: cm.cmd.CID, Length: uint32(len(data))}
	if c.hdgst {
		d.Flags |= nvmetcp.FlagHDGST
	}
	if c.ddgst {
		d.Flags |= nvmetcp.FlagDDGST
		plen += nvmetcp.DigestLen
	}
	d.PLen = uint32(plen)
	h := b.hdr(pdo)
	d.Encode(h)
	c.hdrLen(nvmetcp.DataLen, h)
	clear(h[hl:pdo])
	b.bufs = append(b.bufs, h, data)
	if c.ddgst {
		dd := b.hdr(nvmetcp.DigestLen)
		nvmetcp.PutDigest(dd, nvmetcp.Digest(data))
		b.bufs = append(b.bufs, dd)
	}
}

// getBuf returns a buffer of at least n bytes from the server's pools
// (one per power of two from 4 KiB); putBuf returns it.
func (s *Server) getBuf(n int) *[]byte {
	k := sizeClass(n)
	if k < len(s.pools) {
		if b, ok := s.pools[k].Get().(*[]byte); ok {
			return b
		}
		b := make([]byte, 4096<<k)
		return &b
	}
	b := make([]byte, n)
	return &b
}

func (s *Server) putBuf(b *[]byte) {
	k := sizeClass(cap(*b))
	if k < len(s.pools) && cap(*b) == 4096<<k {
		*b = (*b)[:cap(*b)]
		s.pools[k].Put(b)
	}
}

// sizeClass is the pool of a buffer of n bytes: the least k with 4 KiB
// << k ≥ n.
func sizeClass(n int) int {
	if n <= 4096 {
		return 0
	}
	return bits.Len(uint(n-1)) - 12
}
