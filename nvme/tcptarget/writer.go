package tcptarget

import (
	"math/bits"
	"net"

	"github.com/blockwire/blockwire/nvme"
	"github.com/blockwire/blockwire/nvme/nvmetarget"
	"github.com/blockwire/blockwire/nvme/nvmetcp"
)

// writer sends what the connection queues, in order, until it ends.
func (c *conn) writer() {
	defer close(c.writerDone)
	for {
		select {
		case r := <-c.out:
			err := c.write(r)
			if r.cm != nil {
				r.cm.release()
			}
			if err != nil || r.term != nil {
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

// write sends one reply.
func (c *conn) write(r reply) error {
	switch {
	case r.term != nil:
		_, err := c.nc.Write(r.term.Append(nil, r.bad))
		return err
	case r.r2t != nil:
		var b [nvmetcp.R2TLen + nvmetcp.DigestLen]byte
		t := nvmetcp.R2T{CCCID: r.r2t.cmd.CID, TTag: r.r2t.ttag, Offset: uint32(r.r2t.got), Length: uint32(len(r.r2t.data) - r.r2t.got)}
		if c.hdgst {
			t.Flags = nvmetcp.FlagHDGST
		}
		t.Encode(b[:])
		_, err := c.nc.Write(b[:c.hdrLen(nvmetcp.R2TLen, b[:])])
		return err
	case r.post != nil:
		return c.writeResp(r.post)
	}
	cm := r.cm
	cqe := cm.res.CQE
	cqe.CID, cqe.SQHD = cm.cmd.CID, cm.sqhd
	if c.q != nil {
		cqe.SQID = c.q.ID()
	}
	if cm.dir == nvmetarget.ControllerToHost && cm.res.N > 0 && cqe.Status == nvme.StatusSuccess {
		if err := c.writeC2H(cm, cm.data[:cm.res.N]); err != nil {
			return err
		}
	}
	return c.writeResp(&cqe)
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

// writeResp sends a response capsule.
func (c *conn) writeResp(cqe *nvme.Completion) error {
	var b [nvmetcp.CapsuleRespLen + nvmetcp.DigestLen]byte
	r := nvmetcp.CapsuleResp{}
	if c.hdgst {
		r.Flags = nvmetcp.FlagHDGST
	}
	cqe.Encode((*[nvme.CQELen]byte)(r.CQE[:]))
	r.Encode(b[:])
	_, err := c.nc.Write(b[:c.hdrLen(nvmetcp.CapsuleRespLen, b[:])])
	return err
}

// writeC2H sends a read's data in one C2HData PDU: header, its digest,
// padding to the host's alignment, the data (from the command's buffer,
// not copied), its digest.
func (c *conn) writeC2H(cm *command, data []byte) error {
	var hb [nvmetcp.DataLen + nvmetcp.DigestLen + 128]byte
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
	d.Encode(hb[:])
	c.hdrLen(nvmetcp.DataLen, hb[:])
	clear(hb[hl:pdo])
	bufs := net.Buffers{hb[:pdo], data}
	var dd [nvmetcp.DigestLen]byte
	if c.ddgst {
		nvmetcp.PutDigest(dd[:], nvmetcp.Digest(data))
		bufs = append(bufs, dd[:])
	}
	_, err := bufs.WriteTo(c.nc)
	return err
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
