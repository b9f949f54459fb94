// Package tcphost is an NVMe/TCP host (NVM Express TCP Transport
// Specification 1.0, NVMe over Fabrics 1.1): it connects a controller's
// admin queue and I/O queues, each over its own TCP connection, reads
// the discovery log, identifies, and reads and writes namespaces with
// many commands in flight per queue. Its tests run it against
// blockwire's target (nvme/tcptarget); the guest lab runs it against
// Linux nvmet-tcp.
package tcphost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/blockwire/blockwire/nvme"
	"github.com/blockwire/blockwire/nvme/nvmetcp"
)

// Direction is the data a command moves.
type Direction uint8

const (
	NoData Direction = iota
	ToController
	FromController
)

// StatusError is a command's failure as the controller reported it.
type StatusError struct{ Status nvme.Status }

func (e *StatusError) Error() string { return "nvme: " + e.Status.String() }

// ErrClosed is a command's error once its queue is closed.
var ErrClosed = errors.New("tcphost: queue closed")

// queue is one queue's connection: a sender goroutine that alone writes
// to the socket, a receiver that alone reads, and the commands in
// flight between them, by CID.
type queue struct {
	nc           net.Conn
	qid          uint16
	hdgst, ddgst bool
	maxH2C       int
	inCapsule    int // the most data sent in a capsule
	cids         chan uint16
	out          chan outgoing
	done         chan struct{}
	closeOnce    sync.Once

	// mu guards pending and err (taken alone; no I/O under it).
	mu      sync.Mutex
	pending map[uint16]*request
	err     error
}

// request is one command in flight.
type request struct {
	cmd  nvme.Command
	data []byte
	dir  Direction
	done chan struct{}
	cqe  nvme.Completion
	err  error
}

// outgoing is what the sender writes: a command capsule, or data an R2T
// asked for.
type outgoing struct {
	r           *request
	ttag        uint16
	off, length int
	h2c         bool
}

// dialQueue opens a queue's connection and exchanges ICReq and ICResp.
func dialQueue(ctx context.Context, o *Options, addr string, qid uint16, size int) (*queue, error) {
	nc, err := o.dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	var b [nvmetcp.ICLen]byte
	req := nvmetcp.ICReq{HeaderDigest: o.HeaderDigest, DataDigest: o.DataDigest}
	req.Encode(&b)
	if _, err := nc.Write(b[:]); err != nil {
		nc.Close()
		return nil, err
	}
	if _, err := io.ReadFull(nc, b[:]); err != nil {
		nc.Close()
		return nil, fmt.Errorf("tcphost: reading ICResp: %w", err)
	}
	var resp nvmetcp.ICResp
	if err := resp.Decode(&b); err != nil {
		nc.Close()
		return nil, err
	}
	if resp.PFV != 0 || resp.CPDA != 0 {
		nc.Close()
		return nil, fmt.Errorf("tcphost: ICResp PFV %d, CPDA %d unsupported", resp.PFV, resp.CPDA)
	}
	nc.SetDeadline(noDeadline)
	q := &queue{nc: nc, qid: qid, hdgst: resp.HeaderDigest, ddgst: resp.DataDigest, maxH2C: int(resp.MaxH2CData),
		inCapsule: nvme.ConnectDataLen, cids: make(chan uint16, size-1), out: make(chan outgoing, 2*size),
		done: make(chan struct{}), pending: map[uint16]*request{}}
	for i := range size - 1 {
		q.cids <- uint16(i)
	}
	go q.sender()
	go q.receiver()
	return q, nil
}

// close ends the queue: every command in flight fails with err.
func (q *queue) close(err error) {
	q.closeOnce.Do(func() {
		q.mu.Lock()
		q.err = err
		pending := q.pending
		q.pending = map[uint16]*request{}
		q.mu.Unlock()
		close(q.done)
		q.nc.Close()
		for _, r := range pending {
			r.err = err
			close(r.done)
		}
	})
}

// do sends a command and waits for its completion (or ctx's end, which
// closes the queue: a command cannot be taken back).
func (q *queue) do(ctx context.Context, cmd *nvme.Command, data []byte, dir Direction) (nvme.Completion, error) {
	var cid uint16
	select {
	case cid = <-q.cids:
	case <-q.done:
		return nvme.Completion{}, q.failure()
	case <-ctx.Done():
		return nvme.Completion{}, ctx.Err()
	}
	r := &request{cmd: *cmd, data: data, dir: dir, done: make(chan struct{})}
	r.cmd.CID = cid
	r.cmd.PSDT = 1 // SGLs
	r.cmd.DPTR = nvme.SGL{Length: uint32(len(data)), ID: nvme.SGLTransportDataBlock}
	if dir == ToController && len(data) <= q.inCapsule {
		r.cmd.DPTR.ID = nvme.SGLDataBlockOffset
	}
	if dir == NoData {
		r.cmd.DPTR = nvme.SGL{ID: nvme.SGLTransportDataBlock}
	}
	q.mu.Lock()
	if q.err != nil {
		q.mu.Unlock()
		return nvme.Completion{}, q.err
	}
	q.pending[cid] = r
	q.mu.Unlock()
	select {
	case q.out <- outgoing{r: r}:
	case <-q.done:
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		q.close(fmt.Errorf("tcphost: command abandoned: %w", ctx.Err()))
		<-r.done
	}
	if r.err != nil {
		return r.cqe, r.err
	}
	q.cids <- cid
	if r.cqe.Status != nvme.StatusSuccess {
		return r.cqe, &StatusError{r.cqe.Status}
	}
	return r.cqe, nil
}

func (q *queue) failure() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// sender writes capsules and H2CData PDUs.
func (q *queue) sender() {
	for {
		select {
		case o := <-q.out:
			var err error
			if o.h2c {
				err = q.writeH2C(o)
			} else {
				err = q.writeCapsule(o.r)
			}
			if err != nil {
				q.close(err)
				return
			}
		case <-q.done:
			return
		}
	}
}

// pdoFor is where a PDU's data starts after a header of hlen bytes.
func (q *queue) pdoFor(hlen int) int {
	if q.hdgst {
		hlen += nvmetcp.DigestLen
	}
	return hlen
}

func (q *queue) writeCapsule(r *request) error {
	var hb [nvmetcp.CapsuleCmdLen + nvmetcp.DigestLen]byte
	var data []byte
	if r.cmd.DPTR.ID == nvme.SGLDataBlockOffset {
		data = r.data
	}
	cc := nvmetcp.CapsuleCmd{}
	r.cmd.Encode(&cc.SQE)
	hl := q.pdoFor(nvmetcp.CapsuleCmdLen)
	plen := hl
	if q.hdgst {
		cc.Flags |= nvmetcp.FlagHDGST
	}
	if len(data) > 0 {
		cc.PDO = uint8(hl)
		plen += len(data)
		if q.ddgst {
			cc.Flags |= nvmetcp.FlagDDGST
			plen += nvmetcp.DigestLen
		}
	}
	cc.PLen = uint32(plen)
	cc.Encode(hb[:])
	if q.hdgst {
		nvmetcp.PutDigest(hb[nvmetcp.CapsuleCmdLen:], nvmetcp.Digest(hb[:nvmetcp.CapsuleCmdLen]))
	}
	return q.writeWithData(hb[:hl], data)
}

func (q *queue) writeWithData(hdr, data []byte) error {
	bufs := net.Buffers{hdr}
	var dd [nvmetcp.DigestLen]byte
	if len(data) > 0 {
		bufs = append(bufs, data)
		if q.ddgst {
			nvmetcp.PutDigest(dd[:], nvmetcp.Digest(data))
			bufs = append(bufs, dd[:])
		}
	}
	_, err := bufs.WriteTo(q.nc)
	return err
}

// writeH2C sends the data an R2T asked for, in PDUs of at most
// MAXH2CDATA.
func (q *queue) writeH2C(o outgoing) error {
	for sent := 0; sent < o.length; {
		n := min(o.length-sent, q.maxH2C)
		var hb [nvmetcp.DataLen + nvmetcp.DigestLen]byte
		hl := q.pdoFor(nvmetcp.DataLen)
		d := nvmetcp.Data{Type: nvmetcp.TypeH2CData, PDO: uint8(hl), CCCID: o.r.cmd.CID, TTag: o.ttag, Offset: uint32(o.off + sent), Length: uint32(n)}
		plen := hl + n
		if q.hdgst {
			d.Flags |= nvmetcp.FlagHDGST
		}
		if q.ddgst {
			d.Flags |= nvmetcp.FlagDDGST
			plen += nvmetcp.DigestLen
		}
		if sent+n == o.length {
			d.Flags |= nvmetcp.FlagLastPDU
		}
		d.PLen = uint32(plen)
		d.Encode(hb[:])
		if q.hdgst {
			nvmetcp.PutDigest(hb[nvmetcp.DataLen:], nvmetcp.Digest(hb[:nvmetcp.DataLen]))
		}
		if err := q.writeWithData(hb[:hl], o.r.data[o.off+sent:o.off+sent+n]); err != nil {
			return err
		}
		sent += n
	}
	return nil
}

// receiver reads responses, C2HData and R2Ts until the queue ends.
func (q *queue) receiver() {
	err := q.receive()
	q.close(err)
}

func (q *queue) receive() error {
	var hb [nvmetcp.MaxTermPLen + nvmetcp.DigestLen]byte
	for {
		if _, err := io.ReadFull(q.nc, hb[:nvmetcp.CommonLen]); err != nil {
			return fmt.Errorf("tcphost: queue %d: %w", q.qid, err)
		}
		var h nvmetcp.Common
		if err := h.Decode(hb[:]); err != nil {
			return err
		}
		hl := int(h.HLen)
		if h.Flags&nvmetcp.FlagHDGST != 0 {
			hl += nvmetcp.DigestLen
		}
		if hl > len(hb) {
			return fmt.Errorf("tcphost: a %s header of %d bytes", h.Type, hl)
		}
		if _, err := io.ReadFull(q.nc, hb[nvmetcp.CommonLen:hl]); err != nil {
			return err
		}
		if h.Flags&nvmetcp.FlagHDGST != 0 && nvmetcp.Digest(hb[:h.HLen]) != nvmetcp.GetDigest(hb[h.HLen:]) {
			return errors.New("tcphost: header digest mismatch")
		}
		if h.PDO != 0 {
			if _, err := io.CopyN(io.Discard, q.nc, int64(int(h.PDO)-hl)); err != nil {
				return err
			}
		}
		switch h.Type {
		case nvmetcp.TypeCapsuleResp:
			var r nvmetcp.CapsuleResp
			if err := r.Decode(hb[:]); err != nil {
				return err
			}
			var cqe nvme.Completion
			cqe.Decode(&r.CQE)
			q.complete(cqe)
		case nvmetcp.TypeC2HData:
			if err := q.c2h(hb[:], h); err != nil {
				return err
			}
		case nvmetcp.TypeR2T:
			var t nvmetcp.R2T
			if err := t.Decode(hb[:]); err != nil {
				return err
			}
			r := q.lookup(t.CCCID)
			if r == nil || r.dir != ToController || int(t.Offset)+int(t.Length) > len(r.data) {
				return fmt.Errorf("tcphost: R2T for command %d, offset %d, length %d, which it cannot be", t.CCCID, t.Offset, t.Length)
			}
			select {
			case q.out <- outgoing{r: r, h2c: true, ttag: t.TTag, off: int(t.Offset), length: int(t.Length)}:
			case <-q.done:
			}
		case nvmetcp.TypeC2HTermReq:
			var t nvmetcp.Term
			t.Decode(hb[:])
			return fmt.Errorf("tcphost: the controller terminated the connection (FES %#x, FEI %#x)", t.FES, t.FEI)
		default:
			return fmt.Errorf("tcphost: a %s from a controller", h.Type)
		}
	}
}

func (q *queue) lookup(cid uint16) *request {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.pending[cid]
}

// complete ends a command with its completion.
func (q *queue) complete(cqe nvme.Completion) {
	q.mu.Lock()
	r := q.pending[cqe.CID]
	delete(q.pending, cqe.CID)
	q.mu.Unlock()
	if r != nil {
		r.cqe = cqe
		close(r.done)
	}
}

// c2h reads a C2HData PDU's data into its command's buffer.
func (q *queue) c2h(hb []byte, h nvmetcp.Common) error {
	var d nvmetcp.Data
	if err := d.Decode(hb); err != nil {
		return err
	}
	r := q.lookup(d.CCCID)
	if r == nil || r.dir != FromController || int(d.Offset)+int(d.Length) > len(r.data) {
		return fmt.Errorf("tcphost: C2HData for command %d at %d+%d, which it cannot be", d.CCCID, d.Offset, d.Length)
	}
	p := r.data[d.Offset : d.Offset+d.Length]
	if _, err := io.ReadFull(q.nc, p); err != nil {
		return err
	}
	if h.Flags&nvmetcp.FlagDDGST != 0 {
		var dd [nvmetcp.DigestLen]byte
		if _, err := io.ReadFull(q.nc, dd[:]); err != nil {
			return err
		}
		if nvmetcp.Digest(p) != nvmetcp.GetDigest(dd[:]) {
			return errors.New("tcphost: data digest mismatch")
		}
	}
	if d.Flags&nvmetcp.FlagSuccess != 0 {
		q.complete(nvme.Completion{CID: d.CCCID})
	}
	return nil
}
