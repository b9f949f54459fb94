package tcptarget

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/internal/sockpoll"
	"github.com/blockwire/blockwire/nvme"
	"github.com/blockwire/blockwire/nvme/nvmetarget"
	"github.com/blockwire/blockwire/nvme/nvmetcp"
)

// conn is one NVMe/TCP connection: one queue of a controller. Its reader
// (serve) frames what the host sends and runs or queues the commands; it
// writes the answers of the commands it runs itself before it next reads
// the socket (own), and its writer the rest — the answers of the units'
// workers, R2Ts, events. Each write is one vectored write of whole PDUs,
// and Go's net.Conn never interleaves two writes' bytes.
type conn struct {
	s   *Server
	nc  net.Conn
	log *slog.Logger
	src string // its source, to the per-source bounds

	// Negotiated by ICReq/ICResp (read-only after).
	hdgst, ddgst bool
	align        int // our data PDUs' data starts at a multiple of this (HPDA)
	maxH2C       int

	q *nvmetarget.Queue // after Connect
	// r is what the reader reads: the socket until the Connect is in,
	// then a buffer over it (one system call takes many small PDUs; a
	// payload longer than the buffer is read straight into its command's
	// buffer).
	r  io.Reader
	br *bufio.Reader // r once connected
	// queued counts the replies given to the writer and not yet written.
	queued atomic.Int32
	share  *blockcore.IOShare

	out        chan reply
	done       chan struct{} // closed when the connection ends
	writerDone chan struct{}
	closeOnce  sync.Once
	setup      atomic.Bool // counted in Server.setups
	sqhd       atomic.Uint32

	// The reader's: the header being read, the command slots by TTAG and
	// the free ones (the writer returns a slot once its answer is out).
	hdr      [nvmetcp.CapsuleCmdLen + nvmetcp.DigestLen]byte
	slots    []*command
	first    *command // a fused operation's first half, its second not yet come
	free     chan uint16
	inflight sync.WaitGroup
	// own is the reader's batch: the answer of a command it ran itself
	// with nothing else read to run, written by the reader as it goes
	// back to the socket (flushFirst), without a hand-off to the writer.
	// With 4 KiB reads at queue depth 1 (pinned, polling) 84k against 54k
	// through the writer. Commands that have others behind them in the
	// buffer, or while the writer is busy, still answer through the
	// writer, which then writes while the reader runs the rest: all
	// through the reader, 4 KiB reads at QD 32 unpinned fell to
	// 0.6-0.7x; the reader and the writer both writing, to 0.4-0.5x.
	own *batch
	// Answers written by the reader and by the writer (each counts its
	// own; for tests, once the connection is over).
	ownWritten, writerWritten int
}

// flushFirst is the reader's source once its queue is connected: before
// it reads the socket, the reader writes the answers it has batched.
type flushFirst struct {
	c   *conn
	src io.Reader
}

func (f flushFirst) Read(p []byte) (int, error) {
	if f.c.own.n > 0 {
		if err := f.c.flushOwn(); err != nil {
			return 0, err
		}
	}
	return f.src.Read(p)
}

// flushOwn writes the reader's batch (and releases its commands); a
// failed write ends the connection.
func (c *conn) flushOwn() error {
	c.ownWritten += c.own.n
	err := c.flush(c.own)
	if err != nil {
		c.Close()
	}
	return err
}

// keep adds the answer of a command the reader ran to its batch.
func (c *conn) keep(cm *command) {
	if c.own.n >= maxBatch {
		if c.flushOwn() != nil {
			cm.release()
			return
		}
	}
	c.add(c.own, reply{cm: cm})
}

// command is one command from capsule to answer.
type command struct {
	c     *conn
	cmd   nvme.Command
	ttag  uint16
	sqhd  uint16
	data  []byte // its data buffer (nil: none)
	buf   *[]byte
	taken int64 // charged to the share
	dir   nvmetarget.Direction
	// got counts the host-to-controller bytes received; awaiting is set
	// while an R2T's data is due (the reader's alone).
	got      int
	awaiting bool
	status   nvme.Status     // a transport failure to answer with
	unit     *blockcore.Unit // the namespace's, found once (Queue.Unit)
	res      nvmetarget.Result
	// partner is the other half of a fused operation; ready is set
	// while the command, its data in, waits for it (the reader's alone).
	partner *command
	ready   bool
}

// reply is what the writer sends: a command's answer, an R2T, a
// completion the controller posts, or a termination request.
type reply struct {
	cm   *command
	r2t  *command
	post *nvme.Completion
	term *nvmetcp.Term
	bad  []byte
}

func newConn(s *Server, nc net.Conn) *conn {
	return &conn{s: s, nc: nc, log: s.log.With("remote", nc.RemoteAddr()), done: make(chan struct{}), writerDone: make(chan struct{}),
		maxH2C: s.o.MaxH2CData}
}

// adminInCapsule is the most data an admin command capsule carries.
const adminInCapsule = 8192

// readBuffer is the reader's buffer once a queue is connected.
const readBuffer = 64 << 10

// errTerminated ends the reader after a termination request is queued.
var errTerminated = errors.New("connection terminated")

// serve runs the connection to its end.
func (c *conn) serve() {
	c.setup.Store(true)
	defer c.s.endSetup(c)
	c.nc.SetReadDeadline(time.Now().Add(c.s.o.SetupTimeout))
	c.r = c.nc
	err := c.handshake()
	if err == nil {
		err = c.read()
	}
	if errors.Is(err, errTerminated) && c.out != nil {
		// Let the termination request go out first.
		select {
		case <-c.writerDone:
		case <-time.After(time.Second):
		}
	}
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		c.log.Info("NVMe/TCP connection ended", "err", err)
	}
	c.Close()
	if c.own != nil {
		// Answers the reader had not written.
		c.drop(c.own)
	}
	// Commands whose data never came hold a buffer and budget, no more.
	for _, cm := range c.slots {
		if cm.awaiting || cm.ready {
			cm.awaiting, cm.ready = false, false
			cm.free()
		}
	}
	// Commands still on the units' workers answer into the void: an
	// answer queued after the writer stopped is released here, until
	// the last of them is done.
	idle := make(chan struct{})
	go func() { c.inflight.Wait(); close(idle) }()
	for waiting := true; waiting; {
		select {
		case <-idle:
			waiting = false
		case r := <-c.out: // nil before the writer ran: never ready
			if r.cm != nil {
				r.cm.release()
			}
		}
	}
	if c.out != nil {
		c.drain()
	}
	if c.q != nil {
		c.q.Disconnected()
	}
	if c.share != nil {
		c.share.Close()
	}
}

// Close ends the connection (nvmetarget.Conn).
func (c *conn) Close() {
	c.closeOnce.Do(func() {
		close(c.done)
		c.nc.Close()
	})
}

// Post queues a completion the controller makes on its own
// (nvmetarget.Conn).
func (c *conn) Post(cqe nvme.Completion) {
	cqe.SQHD = uint16(c.sqhd.Load())
	cqe.SQID = 0
	c.emit(reply{post: &cqe})
}

// handshake reads ICReq and answers ICResp (NVMe/TCP 1.0, "Connection
// Establishment"): the digests the host asks for are granted, the data
// alignment it asks for kept.
func (c *conn) handshake() error {
	var b [nvmetcp.ICLen]byte
	if _, err := io.ReadFull(c.r, b[:]); err != nil {
		return fmt.Errorf("reading ICReq: %w", err)
	}
	var req nvmetcp.ICReq
	if err := req.Decode(&b); err != nil {
		return err
	}
	if req.PFV != 0 || req.HPDA > 31 {
		return fmt.Errorf("ICReq: PFV %d, HPDA %d unsupported", req.PFV, req.HPDA)
	}
	c.hdgst, c.ddgst = req.HeaderDigest, req.DataDigest
	c.align = (int(req.HPDA) + 1) * 4
	resp := nvmetcp.ICResp{HeaderDigest: c.hdgst, DataDigest: c.ddgst, MaxH2CData: uint32(c.maxH2C)}
	resp.Encode(&b)
	if _, err := c.nc.Write(b[:]); err != nil {
		return err
	}
	// Until Connect: one command, the Connect, answered by the reader
	// itself (the writer starts with the queue).
	c.slots = []*command{{c: c}}
	c.free = make(chan uint16, 1)
	c.free <- 0
	return nil
}

// terminate queues a C2HTermReq for the header read last and returns
// errTerminated.
func (c *conn) terminate(fes uint16, fei uint32, why error) error {
	c.s.stats.Terminated.Add(1)
	c.log.Info("NVMe/TCP connection terminated", "fes", fes, "err", why)
	bad := append([]byte(nil), c.hdr[:min(int(c.hdr[2]), len(c.hdr))]...)
	c.emit(reply{term: &nvmetcp.Term{Type: nvmetcp.TypeC2HTermReq, FES: fes, FEI: fei}, bad: bad})
	return errTerminated
}

// read frames the host's PDUs until the connection ends.
func (c *conn) read() error {
	var pad [256]byte
	for {
		if _, err := io.ReadFull(c.r, c.hdr[:nvmetcp.CommonLen]); err != nil {
			return err
		}
		var h nvmetcp.Common
		if err := h.Decode(c.hdr[:]); err != nil {
			var fe *nvmetcp.FieldError
			if errors.As(err, &fe) {
				return c.terminate(nvmetcp.FESInvalidHeaderField, fe.Offset, err)
			}
			return c.terminate(nvmetcp.FESInvalidHeaderField, 0, err)
		}
		switch h.Type {
		case nvmetcp.TypeCapsuleCmd, nvmetcp.TypeH2CData, nvmetcp.TypeH2CTermReq:
		default:
			return c.terminate(nvmetcp.FESInvalidHeaderField, 0, fmt.Errorf("a %s from a host", h.Type))
		}
		if h.Flags&nvmetcp.FlagHDGST != 0 != c.hdgst {
			return c.terminate(nvmetcp.FESInvalidHeaderField, 1, errors.New("header digest flag against what was negotiated"))
		}
		n := int(h.HLen)
		if c.hdgst {
			n += nvmetcp.DigestLen
		}
		if n > len(c.hdr) {
			return c.terminate(nvmetcp.FESInvalidHeaderField, 2, errors.New("header too long"))
		}
		if _, err := io.ReadFull(c.r, c.hdr[nvmetcp.CommonLen:n]); err != nil {
			return err
		}
		if c.hdgst && nvmetcp.Digest(c.hdr[:h.HLen]) != nvmetcp.GetDigest(c.hdr[h.HLen:]) {
			return c.terminate(nvmetcp.FESHeaderDigest, 0, errors.New("header digest mismatch"))
		}
		if h.PDO == 0 && int(h.PLen) != n && h.Type != nvmetcp.TypeH2CTermReq {
			return c.terminate(nvmetcp.FESInvalidHeaderField, 4, fmt.Errorf("PLEN %d for a %s without data, whose header is %d bytes", h.PLen, h.Type, n))
		}
		dlen := h.DataLength()
		if dlen > 0 && h.Flags&nvmetcp.FlagDDGST != 0 != c.ddgst {
			return c.terminate(nvmetcp.FESInvalidHeaderField, 1, errors.New("data digest flag against what was negotiated"))
		}
		if h.PDO != 0 {
			if _, err := io.ReadFull(c.r, pad[:int(h.PDO)-n]); err != nil {
				return err
			}
		}
		var err error
		switch h.Type {
		case nvmetcp.TypeCapsuleCmd:
			err = c.capsule(h, dlen)
		case nvmetcp.TypeH2CData:
			err = c.h2cData(h, dlen)
		case nvmetcp.TypeH2CTermReq:
			// The host ends the connection; what follows is the header
			// it objected to.
			if int64(h.PLen) > nvmetcp.MaxTermPLen {
				return c.terminate(nvmetcp.FESInvalidHeaderField, 4, errors.New("termination request too long"))
			}
			var t nvmetcp.Term
			if err := t.Decode(c.hdr[:]); err == nil {
				c.log.Info("NVMe/TCP host terminated the connection", "fes", t.FES, "fei", t.FEI)
			}
			return io.EOF
		}
		if err != nil {
			return err
		}
	}
}

// readData reads a PDU's dlen data bytes into p (len(p) == dlen) and its
// digest, if any; false when the digest does not match.
func (c *conn) readData(p []byte) (bool, error) {
	if _, err := io.ReadFull(c.r, p); err != nil {
		return false, err
	}
	if !c.ddgst {
		return true, nil
	}
	d := c.hdr[:nvmetcp.DigestLen] // the header is read: its room is free
	if _, err := io.ReadFull(c.r, d); err != nil {
		return false, err
	}
	return nvmetcp.Digest(p) == nvmetcp.GetDigest(d), nil
}

// discard reads and drops n bytes (and a data digest).
func (c *conn) discard(n int) error {
	if c.ddgst && n > 0 {
		n += nvmetcp.DigestLen
	}
	_, err := io.CopyN(io.Discard, c.r, int64(n))
	return err
}

// capsule takes a command capsule: its entry, its in-capsule data, and
// runs the command or asks for its data.
func (c *conn) capsule(h nvmetcp.Common, dlen int) error {
	var cc nvmetcp.CapsuleCmd
	if err := cc.Decode(c.hdr[:]); err != nil {
		return c.terminate(nvmetcp.FESInvalidHeaderField, 0, err)
	}
	// In a capsule: before the Connect, its 1024 bytes and no more; on
	// the admin queue, 8 KiB; on an I/O queue, the controller's IOCCSZ.
	limit := nvme.ConnectDataLen
	switch {
	case c.q != nil && c.q.ID() == 0:
		limit = adminInCapsule
	case c.q != nil:
		limit = c.s.o.Target.InCapsuleData()
	}
	if dlen > limit {
		return c.terminate(nvmetcp.FESDataLimitExceeded, 0, fmt.Errorf("%d bytes in a capsule, over %d", dlen, limit))
	}
	var ttag uint16
	select {
	case ttag = <-c.free:
	default:
		return c.terminate(nvmetcp.FESSequenceError, 0, errors.New("more commands outstanding than the queue holds"))
	}
	cm := c.slots[ttag]
	*cm = command{c: c, ttag: ttag}
	if err := cm.cmd.Decode(&cc.SQE); err != nil {
		cm.status = nvme.StatusInvalidField
	}
	if c.q != nil {
		cm.sqhd = c.q.Fetched()
		c.sqhd.Store(uint32(cm.sqhd))
	}
	c.s.stats.Commands.Add(1)
	cm.dir = nvmetarget.DataDirection(&cm.cmd)
	sgl := cm.cmd.DPTR
	length := int(sgl.Length)
	switch {
	case cm.status != 0:
	case c.q == nil && (cm.cmd.Opcode != nvme.AdminFabrics || cm.cmd.FCType() != nvme.FabricsConnect):
		cm.status = nvme.StatusCommandSequence // Connect first
	case c.q == nil && length != nvme.ConnectDataLen:
		// Nothing larger is held for a host not yet admitted.
		cm.status = nvme.StatusConnectInvalidParam
	case cm.dir == nvmetarget.NoData || length == 0:
	case length > c.s.o.Target.MaxTransfer():
		cm.status = nvme.StatusInvalidField
	case sgl.ID == nvme.SGLDataBlockOffset:
		// In-capsule data, at offset 0 (ICDOFF 0), exactly as long as the
		// descriptor says.
		if cm.dir != nvmetarget.HostToController || sgl.Addr != 0 || length != dlen {
			cm.status = nvme.StatusSGLInvalidType
		}
	case sgl.ID == nvme.SGLTransportDataBlock:
		if dlen != 0 {
			cm.status = nvme.StatusSGLInvalidType
		}
	default:
		cm.status = nvme.StatusSGLInvalidType
	}
	if cm.status == 0 && cm.dir != nvmetarget.NoData && length > 0 {
		if !cm.alloc(length) {
			cm.status = nvme.StatusNamespaceNotReady // no buffer now: retried
		}
	}
	if c.q != nil {
		c.fuse(cm)
	}
	if cm.status != 0 {
		if err := c.discard(dlen); err != nil {
			return err
		}
		c.answer(cm)
		if c.q == nil {
			return errors.New("the first command was not a valid Connect")
		}
		return nil
	}
	if dlen > 0 {
		ok, err := c.readData(cm.data)
		if err != nil {
			return err
		}
		if !ok {
			cm.status = nvme.StatusDataTransferError
			c.answer(cm)
			return nil
		}
		cm.got = dlen
	}
	if cm.dir == nvmetarget.HostToController && cm.got < length {
		// The rest through R2T: all of it in one, the host sends it in
		// H2CData PDUs of at most MAXH2CDATA.
		cm.awaiting = true
		c.emit(reply{r2t: cm})
		return nil
	}
	return c.dispatch(cm)
}

// h2cData takes data a command's R2T asked for.
func (c *conn) h2cData(h nvmetcp.Common, dlen int) error {
	var d nvmetcp.Data
	if err := d.Decode(c.hdr[:]); err != nil {
		var fe *nvmetcp.FieldError
		if errors.As(err, &fe) {
			return c.terminate(nvmetcp.FESInvalidHeaderField, fe.Offset, err)
		}
		return c.terminate(nvmetcp.FESInvalidHeaderField, 0, err)
	}
	if int(d.TTag) >= len(c.slots) || !c.slots[d.TTag].awaiting || c.slots[d.TTag].cmd.CID != d.CCCID {
		return c.terminate(nvmetcp.FESInvalidHeaderField, 10, fmt.Errorf("H2CData for TTAG %d, CCCID %d, which awaits none", d.TTag, d.CCCID))
	}
	cm := c.slots[d.TTag]
	if int(d.Offset) != cm.got || dlen > c.maxH2C || cm.got+dlen > len(cm.data) {
		return c.terminate(nvmetcp.FESDataOutOfRange, 0, fmt.Errorf("H2CData of %d bytes at %d; expected at %d of %d", dlen, d.Offset, cm.got, len(cm.data)))
	}
	ok, err := c.readData(cm.data[cm.got : cm.got+dlen])
	if err != nil {
		return err
	}
	if !ok && cm.status == 0 {
		cm.status = nvme.StatusDataTransferError
	}
	cm.got += dlen
	if cm.got < len(cm.data) {
		return nil
	}
	if d.Flags&nvmetcp.FlagLastPDU == 0 {
		return c.terminate(nvmetcp.FESSequenceError, 0, errors.New("the last H2CData of a transfer without LAST_PDU"))
	}
	cm.awaiting = false
	if cm.status != 0 {
		c.answer(cm)
		return nil
	}
	return c.dispatch(cm)
}

// alloc gives the command a data buffer of n bytes, charged to the
// connection's share of the budget.
func (cm *command) alloc(n int) bool {
	c := cm.c
	if c.share != nil {
		if !c.share.Take(int64(n)) {
			c.s.stats.BudgetRefusals.Add(1)
			return false
		}
		cm.taken = int64(n)
	}
	cm.buf = c.s.getBuf(n)
	cm.data = (*cm.buf)[:n]
	return true
}

// release returns what the command holds: its buffer, its charge, its
// slot.
func (cm *command) release() {
	c := cm.c
	cm.detach().release(c)
}

// held is what an answered command holds until its answer is written:
// its buffer (the payload being sent) and the charge for it.
type held struct {
	buf   *[]byte
	taken int64
}

// detach frees the command's slot — its queue entry, which the host
// reuses as soon as it sees the answer, so before the answer is written
// — and returns what it holds until the write is done (held.release).
func (cm *command) detach() held {
	h := held{cm.buf, cm.taken}
	cm.buf, cm.data, cm.taken = nil, nil, 0
	// Last: once the slot is free the reader may reuse it.
	cm.c.free <- cm.ttag
	return h
}

// release returns the buffer and its charge, and counts the command out.
func (h held) release(c *conn) {
	if h.buf != nil {
		c.s.putBuf(h.buf)
	}
	if h.taken > 0 {
		c.share.Give(h.taken)
	}
	c.inflight.Done()
}

// free returns the command's buffer and its charge.
func (cm *command) free() {
	c := cm.c
	if cm.buf != nil {
		c.s.putBuf(cm.buf)
		cm.buf, cm.data = nil, nil
	}
	if cm.taken > 0 {
		c.share.Give(cm.taken)
		cm.taken = 0
	}
}

// dispatch runs a command whose data is in: the Connect here; an I/O
// command on its unit's queue unless the unit never blocks; the others
// on the reader.
func (c *conn) dispatch(cm *command) error {
	if c.q == nil {
		return c.connect(cm)
	}
	switch {
	case cm.partner != nil:
		c.dispatchFused(cm)
		return nil
	case c.first == cm:
		cm.ready = true // a first half: it waits for the second's capsule
		return nil
	}
	c.inflight.Add(1)
	// A unit that may block runs the command on its workers; one that
	// never blocks (memory) runs it here: handing it to a worker when
	// more commands wait in the buffer, as the iSCSI target does, halved
	// 4 KiB reads at QD 32 and did not speed up 128 KiB ones (measured,
	// this package's benchmarks).
	if cm.unit = c.q.Unit(&cm.cmd); cm.unit != nil && !cm.unit.NonBlocking() {
		if !cm.unit.Queue().Submit(cm) {
			cm.res = nvmetarget.Result{CQE: nvme.Completion{Status: nvme.StatusNamespaceNotReady}}
			c.send(cm)
		}
		return nil
	}
	if cm.exec() {
		if c.br.Buffered() == 0 && c.queued.Load() == 0 {
			// Nothing else read to run, and the writer idle: the reader
			// writes the answer itself as it goes back to the socket.
			c.keep(cm)
		} else {
			// More commands to run first: the writer sends the answer
			// meanwhile (on another core where Go has one). Or the
			// writer is busy: two writers of one socket wait for each
			// other.
			c.send(cm)
		}
	}
	return nil
}

// Run executes the command and queues its answer for the writer
// (blockcore.Work).
func (cm *command) Run() {
	if cm.exec() {
		cm.c.send(cm)
	}
}

// exec executes the command; false when it is not to be answered now.
func (cm *command) exec() bool {
	cm.res = cm.c.q.Exec(&cm.cmd, cm.data, cm.unit)
	if cm.res.Deferred {
		// An Asynchronous Event Request: answered through Post.
		cm.release()
		return false
	}
	if dir := cm.dir; dir == nvmetarget.ControllerToHost {
		cm.c.s.stats.ReadBytes.Add(uint64(cm.res.N))
	} else if dir == nvmetarget.HostToController && cm.res.CQE.Status == 0 {
		cm.c.s.stats.WriteBytes.Add(uint64(len(cm.data)))
	}
	return true
}

// fuse pairs the halves of a fused operation as their capsules arrive
// (NVMe Base 2.0, "Fused Operations": the second is the next command of
// the queue); a half without its partner fails.
func (c *conn) fuse(cm *command) {
	switch {
	case cm.cmd.Fuse == nvme.FuseFirst:
		if c.first != nil {
			c.unfuse(c.first, nvme.StatusFusedMissing)
		}
		if cm.status == 0 {
			c.first = cm
		}
	case cm.cmd.Fuse == nvme.FuseSecond:
		first := c.first
		c.first = nil
		switch {
		case first == nil && cm.status == 0:
			cm.status = nvme.StatusFusedMissing
		case first != nil && cm.status != 0:
			c.unfuse(first, nvme.StatusFusedFailed)
		case first != nil:
			cm.partner, first.partner = first, cm
		}
	case c.first != nil:
		c.unfuse(c.first, nvme.StatusFusedMissing)
		c.first = nil
	}
}

// unfuse fails the half of a fused operation whose partner is gone: at
// once if it waits, else when its data is in.
func (c *conn) unfuse(cm *command, st nvme.Status) {
	cm.partner = nil
	cm.status = st
	if cm.ready {
		cm.ready = false
		c.answer(cm)
	}
}

// fused runs the two halves of a fused operation, its data in.
type fused struct {
	c             *conn
	first, second *command
}

func (f fused) Run() {
	f.first.res, f.second.res = f.c.q.ExecFused(&f.first.cmd, f.first.data, &f.second.cmd, f.second.data)
	f.c.send(f.first)
	f.c.send(f.second)
}

// dispatchFused runs a fused operation once both halves' data is in.
func (c *conn) dispatchFused(cm *command) {
	p := cm.partner
	if !p.ready {
		cm.ready = true // waits for its partner's data
		return
	}
	first, second := p, cm
	if cm.cmd.Fuse == nvme.FuseFirst {
		first, second = cm, p
	}
	first.partner, second.partner, p.ready = nil, nil, false
	c.inflight.Add(2)
	f := fused{c, first, second}
	if u := c.q.Unit(&first.cmd); u != nil && !u.NonBlocking() {
		if !u.Queue().Submit(f) {
			first.res = nvmetarget.Result{CQE: nvme.Completion{Status: nvme.StatusNamespaceNotReady}}
			second.res = nvmetarget.Result{CQE: nvme.Completion{Status: nvme.StatusFusedFailed}}
			c.send(first)
			c.send(second)
		}
		return
	}
	f.Run()
}

// answer queues the answer of a command that failed before it ran.
func (c *conn) answer(cm *command) {
	if c.first == cm {
		c.first = nil
	}
	if p := cm.partner; p != nil {
		// Half of a fused operation: the other half fails too.
		cm.partner = nil
		c.unfuse(p, nvme.StatusFusedFailed)
	}
	c.inflight.Add(1)
	cm.res = nvmetarget.Result{CQE: nvme.Completion{Status: cm.status}}
	c.send(cm)
}

// send queues a command's answer for the writer (or, once the
// connection is gone, releases it).
func (c *conn) send(cm *command) {
	if !c.emit(reply{cm: cm}) {
		cm.release()
	}
}

// emit queues r for the writer; before the writer runs (until the
// Connect is answered) the reader writes it itself. false: the
// connection is gone and r was not sent.
func (c *conn) emit(r reply) bool {
	if c.out == nil {
		if err := c.write(r); err != nil {
			c.Close()
		}
		return true // sent or not, write released r's command
	}
	c.queued.Add(1)
	select {
	case c.out <- r:
		return true
	case <-c.done:
		c.queued.Add(-1)
		return false
	}
}

// connect executes the Connect: the queue joins (or makes) a
// controller; the connection's bounds follow from the queue's size.
func (c *conn) connect(cm *command) error {
	k, err := nvme.DecodeConnect(&cm.cmd, cm.data)
	c.inflight.Add(1)
	if err != nil {
		cm.res = nvmetarget.Result{CQE: nvme.Completion{Status: nvme.StatusConnectInvalidParam}}
		c.send(cm)
		return err
	}
	q, cqe := c.s.o.Target.Connect(k, c.nc.RemoteAddr(), c)
	cm.res = nvmetarget.Result{CQE: cqe}
	if q == nil {
		c.send(cm)
		return fmt.Errorf("connect refused: %v", cqe.Status)
	}
	c.log = c.log.With("controller", q.Controller().ID(), "qid", q.ID())
	c.log.Info("NVMe/TCP queue connected", "subsystem", k.Data.SubNQN, "host", k.Data.HostNQN, "size", q.Size(),
		"header_digest", c.hdgst, "data_digest", c.ddgst)
	if c.s.o.Budget != nil {
		src := ""
		if a, ok := c.nc.RemoteAddr().(*net.TCPAddr); ok {
			src = a.IP.String()
		}
		c.share = c.s.o.Budget.NewShare(src)
	}
	// The queue's bounds: as many commands as its entries, each answer
	// queued at most once, an R2T each, the controller's posts.
	size := q.Size()
	c.slots = append(c.slots, make([]*command, size-1)...)
	c.free = make(chan uint16, size)
	for i := 1; i < size; i++ {
		c.slots[i] = &command{c: c}
		c.free <- uint16(i)
	}
	c.q = q
	var src io.Reader = c.nc
	if p := sockpoll.New(c.nc, c.s.o.Poll); p != nil {
		src = p
	}
	c.own = newBatch()
	c.br = bufio.NewReaderSize(flushFirst{c, src}, readBuffer)
	c.r = c.br
	c.nc.SetReadDeadline(time.Time{})
	c.s.endSetup(c)
	// The Connect's answer, then the writer (slot 0, the Connect's,
	// returns to the new free list).
	c.send(cm)
	c.out = make(chan reply, 2*size+8)
	go c.writer()
	return nil
}
