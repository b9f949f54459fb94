// Package tcphost is an NVMe/TCP host (NVM Express TCP Transport
// Specification 1.0, NVMe over Fabrics 1.1): it connects a controller's
// admin queue and I/O queues, each over its own TCP connection, reads
// the discovery log, identifies, and reads and writes namespaces with
// many commands in flight per queue. Its tests run it against
// blockwire's target (nvme/tcptarget); the guest lab runs it against
// Linux nvmet-tcp.
package tcphost

import (
	"bufio"
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

	// reqs are the commands by CID, each reused once its CID is free.
	reqs []request

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
	done chan struct{} // one value when the command ends
	cqe  nvme.Completion
	err  error
}

// outgoing is what the sender writes: a command capsule, or data an R2T
// asked for.
type outgoing struct {
	r           *request
	fused       *request // the second half of a fused operation, sent right after r
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
		done: make(chan struct{}), pending: map[uint16]*request{}, reqs: make([]request, size-1)}
	for i := range size - 1 {
		q.cids <- uint16(i)
		q.reqs[i].done = make(chan struct{}, 1)
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
			r.done <- struct{}{}
		}
	})
}

// do sends a command and waits for its completion (or ctx's end, which
// closes the queue: a command cannot be taken back).
func (q *queue) do(ctx context.Context, cmd *nvme.Command, data []byte, dir Direction) (nvme.Completion, error) {
	r, err := q.prepare(ctx, cmd, data, dir)
	if err != nil {
		return nvme.Completion{}, err
	}
	select {
	case q.out <- outgoing{r: r}:
	case <-q.done:
	}
	return q.wait(ctx, r)
}

// doFused sends a fused operation's two commands back to back, so that
// no other command of the queue comes between them, and waits for both.
func (q *queue) doFused(ctx context.Context, first *nvme.Command, firstData []byte, second *nvme.Command, secondData []byte) (nvme.Completion, nvme.Completion, error, error) {
	a, err := q.prepare(ctx, first, firstData, ToController)
	if err != nil {
		return nvme.Completion{}, nvme.Completion{}, err, err
	}
	b, err := q.prepare(ctx, second, secondData, ToController)
	if err != nil {
		q.close(err) // a is registered and will not be sent
		ca, ea := q.wait(ctx, a)
		return ca, nvme.Completion{}, ea, err
	}
	a.cmd.Fuse, b.cmd.Fuse = nvme.FuseFirst, nvme.FuseSecond
	select {
	case q.out <- outgoing{r: a, fused: b}:
	case <-q.done:
	}
	ca, ea := q.wait(ctx, a)
	cb, eb := q.wait(ctx, b)
	return ca, cb, ea, eb
}

// prepare takes a CID for a command and registers it as in flight.
func (q *queue) prepare(ctx context.Context, cmd *nvme.Command, data []byte, dir Direction) (*request, error) {
	var cid uint16
	select {
	case cid = <-q.cids:
	case <-q.done:
		return nil, q.failure()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r := &q.reqs[cid]
	r.cmd, r.data, r.dir, r.cqe, r.err = *cmd, data, dir, nvme.Completion{}, nil
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
		err := q.err
		q.mu.Unlock()
		return nil, err
	}
	q.pending[cid] = r
	q.mu.Unlock()
	return r, nil
}

// wait waits for a command's completion and frees its CID.
func (q *queue) wait(ctx context.Context, r *request) (nvme.Completion, error) {
	select {
	case <-r.done:
	case <-ctx.Done():
		q.close(fmt.Errorf("tcphost: command abandoned: %w", ctx.Err()))
		<-r.done
	}
	cqe, err := r.cqe, r.err
	if err != nil {
		return cqe, err
	}
	q.cids <- r.cmd.CID // the request is another command's from here
	if cqe.Status != nvme.StatusSuccess {
		return cqe, &StatusError{cqe.Status}
	}
	return cqe, nil
}

func (q *queue) failure() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// sender writes capsules and H2CData PDUs: what is queued together
// leaves in one vectored write, payloads referenced, not copied.
func (q *queue) sender() {
	w := &wbatch{arena: make([]byte, 0, 64*(nvmetcp.CapsuleCmdLen+2*nvmetcp.DigestLen))}
	for {
		select {
		case o := <-q.out:
			q.add(w, o)
		more:
			for n := 1; n < 64; n++ {
				select {
				case o := <-q.out:
					q.add(w, o)
				default:
					break more
				}
			}
			iov := w.bufs
			_, err := w.bufs.WriteTo(q.nc)
			clear(iov)
			w.arena, w.bufs = w.arena[:0], iov[:0]
			if err != nil {
				q.close(err)
				return
			}
		case <-q.done:
			return
		}
	}
}

// wbatch is one vectored write being put together.
type wbatch struct {
	arena []byte
	bufs  net.Buffers
}

// hdr returns n bytes of the arena for a header (a fresh arena when it
// is full: what bufs refers to stays intact).
func (w *wbatch) hdr(n int) []byte {
	if len(w.arena)+n > cap(w.arena) {
		w.arena = make([]byte, 0, max(2*cap(w.arena), n))
	}
	start := len(w.arena)
	w.arena = w.arena[:start+n]
	return w.arena[start:]
}

func (q *queue) add(w *wbatch, o outgoing) {
	switch {
	case o.h2c:
		q.addH2C(w, o)
	case o.fused != nil:
		q.addCapsule(w, o.r)
		q.addCapsule(w, o.fused)
	default:
		q.addCapsule(w, o.r)
	}
}

// pdoFor is where a PDU's data starts after a header of hlen bytes.
func (q *queue) pdoFor(hlen int) int {
	if q.hdgst {
		hlen += nvmetcp.DigestLen
	}
	return hlen
}

func (q *queue) addCapsule(w *wbatch, r *request) {
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
	h := w.hdr(hl)
	cc.Encode(h)
	if q.hdgst {
		nvmetcp.PutDigest(h[nvmetcp.CapsuleCmdLen:], nvmetcp.Digest(h[:nvmetcp.CapsuleCmdLen]))
	}
	w.bufs = append(w.bufs, h)
	q.addData(w, data)
}

// addData adds a PDU's data and its digest.
func (q *queue) addData(w *wbatch, data []byte) {
	if len(data) == 0 {
		return
	}
	w.bufs = append(w.bufs, data)
	if q.ddgst {
		d := w.hdr(nvmetcp.DigestLen)
		nvmetcp.PutDigest(d, nvmetcp.Digest(data))
		w.bufs = append(w.bufs, d)
	}
}

// addH2C adds the data an R2T asked for, in PDUs of at most MAXH2CDATA.
func (q *queue) addH2C(w *wbatch, o outgoing) {
	for sent := 0; sent < o.length; {
		n := min(o.length-sent, q.maxH2C)
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
		h := w.hdr(hl)
		d.Encode(h)
		if q.hdgst {
			nvmetcp.PutDigest(h[nvmetcp.DataLen:], nvmetcp.Digest(h[:nvmetcp.DataLen]))
		}
		w.bufs = append(w.bufs, h)
		q.addData(w, o.r.data[o.off+sent:o.off+sent+n])
		sent += n
	}
}

// receiver reads responses, C2HData and R2Ts until the queue ends.
func (q *queue) receiver() {
	err := q.receive()
	q.close(err)
}

func (q *queue) receive() error {
	var hb [nvmetcp.MaxTermPLen + nvmetcp.DigestLen]byte
	br := bufio.NewReaderSize(q.nc, 64<<10)
	for {
		if _, err := io.ReadFull(br, hb[:nvmetcp.CommonLen]); err != nil {
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
		if _, err := io.ReadFull(br, hb[nvmetcp.CommonLen:hl]); err != nil {
			return err
		}
		if h.Flags&nvmetcp.FlagHDGST != 0 && nvmetcp.Digest(hb[:h.HLen]) != nvmetcp.GetDigest(hb[h.HLen:]) {
			return errors.New("tcphost: header digest mismatch")
		}
		if h.PDO != 0 {
			if _, err := br.Discard(int(h.PDO) - hl); err != nil {
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
			if err := q.c2h(br, hb[:], h); err != nil {
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
		r.done <- struct{}{}
	}
}

// c2h reads a C2HData PDU's data into its command's buffer.
func (q *queue) c2h(br io.Reader, hb []byte, h nvmetcp.Common) error {
	var d nvmetcp.Data
	if err := d.Decode(hb); err != nil {
		return err
	}
	r := q.lookup(d.CCCID)
	if r == nil || r.dir != FromController || int(d.Offset)+int(d.Length) > len(r.data) {
		return fmt.Errorf("tcphost: C2HData for command %d at %d+%d, which it cannot be", d.CCCID, d.Offset, d.Length)
	}
	p := r.data[d.Offset : d.Offset+d.Length]
	if _, err := io.ReadFull(br, p); err != nil {
		return err
	}
	if h.Flags&nvmetcp.FlagDDGST != 0 {
		dd := hb[:nvmetcp.DigestLen] // the header is decoded: its room is free
		if _, err := io.ReadFull(br, dd); err != nil {
			return err
		}
		if nvmetcp.Digest(p) != nvmetcp.GetDigest(dd) {
			return errors.New("tcphost: data digest mismatch")
		}
	}
	if d.Flags&nvmetcp.FlagSuccess != 0 {
		q.complete(nvme.Completion{CID: d.CCCID})
	}
	return nil
}
