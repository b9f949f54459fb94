// Package iser is the iSER datamover (RFC 5046, and the
// connection-first form of RFC 7145 / the iSER-on-InfiniBand draft that Linux speaks): it
// implements every primitive of the Datamover Interface (draft-ietf-ips-iwarp-da §9–10,
// package datamover) over the rdma verbs API, never over a concrete
// device.
//
//	Send_Control  → an RDMA Send carrying the iSER header and the PDU
//	                (SendSE for SCSI Command/Response per RFC 5046 §9.5,
//	                Send with Invalidate of the task's STag for a SCSI
//	                Response when the initiator allows it)
//	Put_Data      → RDMA Write into the initiator's Read STag
//	Get_Data      → RDMA Read from the initiator's Write STag, then
//	                Data_Completion_Notify
//	Deallocate_Task_Resources → the task's STags are forgotten (target)
//	                or invalidated and recycled (initiator)
//
// Control-type PDUs are copied once into a registered send slot; received
// ones arrive in pre-posted receive buffers (RFC 5046 §8) and immediate or
// unsolicited data is copied once into the task's buffer. Solicited data
// never crosses the iSCSI layer: the RDMA device places it.
package iser

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/rdma"
)

// Profile selects the wire form.
type Profile int

const (
	// ProfileLinux is the connection-first form (RFC 7145, the iSER-on-InfiniBand draft,
	// Linux ib_iser/isert, tgt, libiscsi): the RDMA connection is made
	// first with the CM header in its private data, login PDUs travel in
	// Sends, the header is 28 bytes with virtual-address tagged offsets,
	// and no Hello is exchanged.
	ProfileLinux Profile = iota
	// ProfileRFC5046 is the form of RFC 5046 §5.1: byte-stream
	// login, then the connection turns into an RDMA stream, Hello and
	// HelloReply, a 12-byte header and zero-based tagged offsets.
	ProfileRFC5046
)

func (p Profile) String() string {
	if p == ProfileRFC5046 {
		return "rfc5046"
	}
	return "linux"
}

// Options size the datamover's resources.
type Options struct {
	Profile   Profile
	Initiator bool
	// Recvs is the number of receive buffers kept posted (RFC 5046 §8:
	// enough for the CmdSN window and the unexpected PDUs); default 192.
	Recvs int
	// RecvDataSize is the data segment each receive buffer holds — what
	// this side declares as its *RecvDataSegmentLength; default 8192
	// (the login buffers of Linux, facts §2.3).
	RecvDataSize int
	// SendSlots bounds the control PDUs in flight; default 192.
	SendSlots int
	// IRD and ORD are the RDMA Read depths (iSER-IRD/ORD); default 16.
	IRD, ORD int
	// CtrlDataLimit, when set, caps the data segment of control-type PDUs
	// sent in full feature phase. A target talking to Linux ib_iser needs
	// 128 (its receive buffers hold no more, facts §2.3).
	CtrlDataLimit int
	// Unexpected is the MaxOutstandingUnexpectedPDUs this side declares
	// (RFC 5046 §6.7); default a sixth of Recvs, at least 2.
	Unexpected int
	// LoginRecvs, when set, is how many receive buffers and send slots
	// the connection has until its login completes (EnableDatamover);
	// then it grows to Recvs and SendSlots. A login exchanges one PDU at
	// a time, so a target that accepts connections from anyone holds
	// little for a peer that has not logged in (Linux isert posts a
	// single login-sized receive until then). 0: everything from the
	// start.
	LoginRecvs int
	// Memory, when set, is charged what grow adds when the login
	// completes (the rest of the ring and the send slots) and given it
	// back when the connection ends; a refused charge fails the login's
	// EnableDatamover.
	Memory datamover.Charger
	Logger *slog.Logger
}

// WithDefaults returns the options with every zero field at its default.
func (o Options) WithDefaults() Options {
	o.defaults()
	return o
}

// MaxUnexpected is the MaxOutstandingUnexpectedPDUs a connection with
// these options declares: the unexpected PDUs its receive buffers take
// (RFC 5046 §8).
func (o Options) MaxUnexpected() int { return o.unexpected() }

func (o Options) unexpected() int {
	o.defaults()
	if o.Unexpected > 0 {
		return o.Unexpected
	}
	return max(o.Recvs/6, 2)
}

func (o *Options) defaults() {
	if o.Recvs <= 0 {
		o.Recvs = 192
	}
	if o.RecvDataSize <= 0 {
		o.RecvDataSize = 8192
	}
	if o.SendSlots <= 0 {
		o.SendSlots = 192
	}
	if o.IRD <= 0 {
		o.IRD = 16
	}
	if o.ORD <= 0 {
		o.ORD = 16
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.LoginRecvs >= o.Recvs || o.LoginRecvs >= o.SendSlots {
		o.LoginRecvs = 0
	}
}

// maxAHS is room for an AHS in a receive buffer or send slot.
const maxAHS = 256

// Resources are what a connection needs before it exists: the completion
// queues and the receive buffers posted before the first message can
// arrive (RFC 5046 §5.1: Allocate_Connection_Resources).
type Resources struct {
	opt      Options
	pd       *rdma.PD
	scq, rcq *rdma.CQ
	hl       int
	// recvBufs has an entry for each of the Recvs buffers; the first
	// posted of them exist from Prepare, the rest from grow.
	recvBufs [][]byte
	posted   int

	// recvBacking holds the first posted buffers, grown the rest.
	recvBacking, grown []byte
	attached           atomic.Bool
}

// Prepare allocates the resources of one connection.
func Prepare(pd *rdma.PD, opt Options) *Resources {
	opt.defaults()
	r := &Resources{opt: opt, pd: pd, hl: HeaderLenLinux,
		scq: rdma.NewCQ(opt.SendSlots + 2*opt.ORD + 8), rcq: rdma.NewCQ(opt.Recvs)}
	if opt.Profile == ProfileRFC5046 {
		r.hl = HeaderLenRFC5046
	}
	r.recvBufs = make([][]byte, opt.Recvs)
	r.posted = opt.Recvs
	if opt.LoginRecvs > 0 {
		r.posted = opt.LoginRecvs
	}
	r.recvBacking = r.carve(0, r.posted)
	return r
}

// carve allocates the receive buffers from..to-1 and returns their
// backing: from the PD, on a hardware device registered memory the
// receives land in without a bounce (given back when the connection
// ends).
func (r *Resources) carve(from, to int) []byte {
	size := r.recvSize()
	backing := r.pd.Alloc(size * (to - from))
	for i := from; i < to; i++ {
		j := i - from
		r.recvBufs[i] = backing[j*size : (j+1)*size : (j+1)*size]
	}
	return backing
}

// recvSize is the size of one receive buffer.
func (r *Resources) recvSize() int { return r.hl + pdu.BHSLen + maxAHS + r.opt.RecvDataSize }

// Release gives back the resources of a connection that was never
// attached (its accept failed, or the node refused it before it ran).
// After Attach the connection gives them back itself when it ends.
func (r *Resources) Release() {
	if r.attached.CompareAndSwap(false, true) {
		r.pd.Free(r.recvBacking)
	}
}

// ConnParams are the rdma connection parameters with the receives to
// post and privateData for the connection request or accept.
func (r *Resources) ConnParams(privateData []byte) rdma.ConnParams {
	p := rdma.ConnParams{PD: r.pd, PrivateData: privateData,
		QP: rdma.QPConfig{SendCQ: r.scq, RecvCQ: r.rcq, SendDepth: r.opt.SendSlots + 2*r.opt.ORD + 8,
			RecvDepth: r.opt.Recvs, IRD: r.opt.IRD, ORD: r.opt.ORD}}
	for i, b := range r.recvBufs[:r.posted] {
		p.Recvs = append(p.Recvs, rdma.RecvWR{ID: uint64(i), Buf: b})
	}
	return p
}

// Work request IDs: the kind in the top byte, an index below.
const (
	kindSlot  = 1 << 56 // a control PDU's send slot
	kindRead  = 2 << 56 // a Get_Data RDMA Read
	kindWait  = 3 << 56 // a signaled request someone waits for
	kindMask  = 0xFF << 56
	indexMask = 1<<56 - 1
)

// taskTags are the STags of one task.
type taskTags struct {
	wsv, rsv bool
	wstag    uint32
	wva      uint64
	rstag    uint32
	rva      uint64
	solBase  int64 // buffer offset of the first solicited byte (Linux profile)
	wmr, rmr *rdma.MR
	// cmds (target) counts the SCSI Commands with this ITT that arrived
	// and have not ended: an initiator may reuse an ITT once it holds the
	// response, before the old task is deallocated, and the new command's
	// tags must outlive the old task's deallocation.
	cmds int
}

type readCtx struct {
	itt, ttt uint32
	mr       *rdma.MR
}

// Conn is the iSER datamover of one connection.
type Conn struct {
	r       *Resources
	qp      rdma.QP
	stamp   datamover.Stamper
	hl      int
	init    bool
	sendInv bool // a SCSI Response may invalidate the initiator's STag
	log     *slog.Logger

	up     datamover.Upcalls
	ctx    context.Context
	cancel context.CancelFunc

	smu   sync.Mutex // transmit order
	slots [][]byte
	// slotBacking holds the slots: from the PD (registered memory on a
	// hardware device), given back with the receive buffers once the
	// connection has ended and its dispatchers are done; moreSlots holds
	// those grow added. nslots is how many slots exist (Options.LoginRecvs
	// until the login completes): the free ones are on freeSlot.
	slotBacking, moreSlots []byte
	freeSlot               chan int
	nslots                 atomic.Int32
	waiters                []chan rdma.Status

	tmu    sync.Mutex
	tasks  map[uint32]*taskTags
	spare  []*taskTags
	mrPool []*rdma.MR

	reads    []readCtx
	ackMR    *rdma.MR // the sink of Data_ACK's zero-length Reads (target)
	freeRead chan int
	rmu      sync.Mutex
	queued   []queuedRead // Get_Data waiting for a free read context

	pmu      sync.Mutex
	maxXmit  int // data segment limit of control PDUs we send
	pending  datamover.Params
	havePend bool
	enabled  bool
	freed    bool  // the buffers were given back (the connection ended)
	charged  int64 // what grow charged to Options.Memory
	termOnce sync.Once
	dispDone chan struct{}

	// The unexpected control-type PDUs of each direction (RFC 5046 §8.1,
	// unexpected.go), counted once either side declared a limit.
	umu     sync.Mutex
	ucount  atomic.Bool
	fromIni ledger
	fromTgt ledger

	// ready is closed once the Hello exchange of the RFC 5046 profile is
	// over (at once in the Linux profile); control PDUs wait for it.
	ready     chan struct{}
	helloDone bool // receive goroutine
}

type queuedRead struct {
	r2t pdu.R2T
	buf []byte
}

// Attach builds the datamover over an established queue pair. peer is
// the iSER CM header the other side sent (its flags decide whether a
// SCSI Response may carry Send with Invalidate).
func (r *Resources) Attach(qp rdma.QP, peer CMHeader, stamp datamover.Stamper) *Conn {
	o := r.opt
	ctx, cancel := context.WithCancel(context.Background())
	c := &Conn{r: r, qp: qp, stamp: stamp, hl: r.hl, init: o.Initiator, log: o.Logger,
		sendInv: !o.Initiator && !peer.SendInvNotSupported,
		ctx:     ctx, cancel: cancel,
		tasks:   map[uint32]*taskTags{},
		maxXmit: 8192, dispDone: make(chan struct{}), ready: make(chan struct{})}
	if o.Profile != ProfileRFC5046 {
		close(c.ready)
		c.helloDone = true
	}
	r.attached.Store(true)
	c.slots = make([][]byte, o.SendSlots)
	c.waiters = make([]chan rdma.Status, o.SendSlots)
	c.freeSlot = make(chan int, o.SendSlots)
	n := o.SendSlots
	if r.posted < len(r.recvBufs) {
		n = o.LoginRecvs
	}
	c.slotBacking = c.addSlots(0, n)
	if !o.Initiator {
		var err error
		if c.ackMR, err = r.pd.Register(make([]byte, 1), 0, rdma.LocalWrite); err != nil {
			panic(err) // the STag space has 16M entries
		}
		n := 2 * o.ORD
		c.reads = make([]readCtx, n)
		c.freeRead = make(chan int, n)
		for i := range c.reads {
			mr, err := r.pd.AllocMR()
			if err != nil {
				panic(err) // the STag space has 16M entries
			}
			c.reads[i].mr = mr
			c.freeRead <- i
		}
	}
	return c
}

// addSlots allocates the send slots from..to-1, frees them for use and
// returns their backing.
func (c *Conn) addSlots(from, to int) []byte {
	size := c.slotSize()
	backing := c.r.pd.Alloc(size * (to - from))
	for i := from; i < to; i++ {
		j := i - from
		c.slots[i] = backing[j*size : (j+1)*size : (j+1)*size]
		c.waiters[i] = make(chan rdma.Status, 1)
	}
	c.nslots.Store(int32(to))
	for i := from; i < to; i++ {
		c.freeSlot <- i
	}
	return backing
}

// slotSize is the size of one send slot.
func (c *Conn) slotSize() int { return c.hl + pdu.BHSLen + maxAHS + max(c.r.opt.RecvDataSize, 8192) }

// deregister gives back the connection's memory regions once nothing can
// use them (the queue pair is closed, its dispatchers are done): the read
// contexts' sinks, Data_ACK's sink and the tasks' regions. A region left
// registered stays in its device's table with the buffer it last mapped
// (each iSER connection left 33 and more behind).
func (c *Conn) deregister() {
	for i := range c.reads {
		c.reads[i].mr.Deregister()
	}
	if c.ackMR != nil {
		c.ackMR.Deregister()
	}
	c.tmu.Lock()
	defer c.tmu.Unlock()
	for _, mr := range c.mrPool {
		mr.Deregister()
	}
	c.mrPool = nil
	for _, t := range c.tasks {
		for _, mr := range []*rdma.MR{t.rmr, t.wmr} {
			if mr != nil {
				mr.Deregister()
			}
		}
	}
}

// grow gives a connection that began with Options.LoginRecvs its whole
// receive ring and every send slot, once its login has completed.
func (c *Conn) grow() error {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	r := c.r
	if r.posted == len(r.recvBufs) || c.freed {
		return nil
	}
	from := r.posted
	if m := r.opt.Memory; m != nil {
		// What carve and addSlots below allocate: the buffers and
		// slots not there yet, at the sizes they give them.
		n := int64(len(r.recvBufs)-from)*int64(r.recvSize()) + int64(len(c.slots)-int(c.nslots.Load()))*int64(c.slotSize())
		if !m.Take(n) {
			return fmt.Errorf("iser: no room in the I/O budget for the connection's receive ring and send slots (%d bytes)", n)
		}
		c.charged = n
	}
	r.grown = r.carve(from, len(r.recvBufs))
	r.posted = len(r.recvBufs)
	for i := from; i < len(r.recvBufs); i++ {
		if err := c.qp.PostRecv(rdma.RecvWR{ID: uint64(i), Buf: r.recvBufs[i]}); err != nil {
			return err
		}
	}
	c.moreSlots = c.addSlots(int(c.nslots.Load()), len(c.slots))
	return nil
}

// RemoteAddr implements datamover.Conn.
func (c *Conn) RemoteAddr() string { return addr(c.qp.Attr().RemoteAddr) }

// LocalAddr implements datamover.Conn.
func (c *Conn) LocalAddr() string { return addr(c.qp.Attr().LocalAddr) }

func addr(a interface{ String() string }) string {
	if a == nil {
		return ""
	}
	return a.String()
}

// Transport names the RDMA transport under the connection ("iwarp",
// "roce").
func (c *Conn) Transport() string { return c.qp.Attr().Transport }

// Profile is the wire form in use.

func (c *Conn) Profile() Profile { return c.r.opt.Profile }

// AllocateConnectionResources implements datamover.Conn: the resources
// were allocated by Prepare before the connection was accepted, after the
// RDMA connection request was checked (RFC 5046 §5.1).
func (c *Conn) AllocateConnectionResources(p datamover.Params) error { return nil }

// DeallocateConnectionResources implements datamover.Conn.
func (c *Conn) DeallocateConnectionResources() { c.ConnectionTerminate() }

// NoticeKeyValues implements datamover.Conn: with RDMAExtensions=Yes the
// control-PDU limit is the peer's *RecvDataSegmentLength (RFC 5046 §6.6),
// otherwise its MaxRecvDataSegmentLength.
func (c *Conn) NoticeKeyValues(p datamover.Params) {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if c.enabled {
		c.apply(p)
		return
	}
	c.pending, c.havePend = p, true
}

func (c *Conn) apply(p datamover.Params) {
	mx := p.MaxXmitDataSegmentLength
	if p.RDMAExtensions {
		if c.init {
			mx = p.TargetRecvDataSegmentLength
		} else {
			mx = p.InitiatorRecvDataSegmentLength
		}
	}
	if mx > 0 {
		c.maxXmit = mx
	}
	if p.RDMAExtensions {
		own, peer := p.MaxOutstandingUnexpectedPDUs, p.PeerMaxOutstandingUnexpectedPDUs
		c.umu.Lock()
		if c.init {
			c.fromIni.limit, c.fromTgt.limit = peer, own
		} else {
			c.fromIni.limit, c.fromTgt.limit = own, peer
		}
		c.ucount.Store(own > 0 || peer > 0)
		c.umu.Unlock()
	}
}

// MaxOutstandingUnexpectedPDUs implements datamover.ReceiveBudget: the
// receive buffers beyond those the command window and its responses
// need (RFC 5046 §8.1).
func (c *Conn) MaxOutstandingUnexpectedPDUs() int { return c.r.opt.unexpected() }

// MaxSendDataSegmentLength implements datamover.Conn.
func (c *Conn) MaxSendDataSegmentLength() int {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	mx := min(c.maxXmit, len(c.slots[0])-c.hl-pdu.BHSLen-maxAHS)
	if c.enabled && c.r.opt.CtrlDataLimit > 0 {
		mx = min(mx, c.r.opt.CtrlDataLimit)
	}
	return mx
}

// EnableDatamover implements datamover.Conn: the final Login Response
// goes out as a Send, then the negotiated values apply.
func (c *Conn) EnableDatamover(final *datamover.PDU) error {
	// The whole ring is posted before the final Login Response goes
	// out: the initiator may send a full window right after it.
	if err := c.grow(); err != nil {
		return err
	}
	if final != nil {
		if err := c.SendControl(final, true); err != nil {
			return err
		}
	}
	c.pmu.Lock()
	c.enabled = true
	if c.havePend {
		c.apply(c.pending)
		c.havePend = false
	}
	c.pmu.Unlock()
	return nil
}

var errTerminated = errors.New("iser: connection terminated")

// SendControl implements datamover.Conn (draft-ietf-ips-iwarp-da §9.1, RFC 5046 §9.5).
func (c *Conn) SendControl(p *datamover.PDU, advance bool) error {
	return c.sendControl(p, advance, false)
}

// sendControl sends a control PDU; with wait it returns once the Send
// (and every earlier request) has completed.
func (c *Conn) sendControl(p *datamover.PDU, advance, wait bool) error {
	select {
	case <-c.ready:
	case <-c.ctx.Done():
		return errTerminated
	}
	var slot int
	select {
	case slot = <-c.freeSlot:
	case <-c.ctx.Done():
		return errTerminated
	}
	if c.ctx.Err() != nil {
		// A select with both ready picks either: a connection that has
		// ended must refuse every send, not some.
		c.freeSlot <- slot
		return errTerminated
	}
	buf := c.slots[slot]
	n := c.hl + pdu.BHSLen + len(p.AHS) + len(p.Data)
	if len(p.AHS) > maxAHS || n > len(buf) {
		c.freeSlot <- slot
		return fmt.Errorf("iser: %s of %d bytes does not fit a %d-byte send buffer", p.BHS.Opcode(), n, len(buf))
	}
	op := p.BHS.Opcode()
	var h Header
	wr := rdma.SendWR{ID: kindSlot | uint64(slot), Op: rdma.OpSend}
	switch {
	case c.init && op == pdu.OpSCSICommand:
		if err := c.registerTask(p, &h); err != nil {
			c.freeSlot <- slot
			return err
		}
		wr.Solicited = true
	case !c.init && op == pdu.OpSCSIResponse:
		wr.Solicited = true
		if c.sendInv {
			// RFC 5046 §9.5: the response may invalidate the initiator's
			// STag (the Read STag, else the Write STag).
			c.tmu.Lock()
			if t := c.tasks[p.BHS.ITT()]; t != nil {
				switch {
				case t.rsv:
					wr.Invalidate, wr.InvalidateSTag = true, t.rstag
				case t.wsv:
					wr.Invalidate, wr.InvalidateSTag = true, t.wstag
				}
			}
			c.tmu.Unlock()
		}
	case op == pdu.OpLogoutReq:
		wr.Solicited = true
	}
	h.Encode(buf, c.hl)
	c.smu.Lock()
	if !c.mayGenerate(p) {
		c.smu.Unlock()
		c.freeSlot <- slot
		return datamover.ErrUnexpectedLimit
	}
	p.BHS.SetTotalAHSLength(len(p.AHS))
	p.BHS.SetDataSegmentLength(len(p.Data))
	if c.stamp != nil {
		c.stamp(&p.BHS, advance)
	}
	c.count(p)
	o := c.hl + copy(buf[c.hl:], p.BHS[:])
	o += copy(buf[o:], p.AHS)
	o += copy(buf[o:], p.Data)
	wr.SG = [][]byte{buf[:o]}
	if wait {
		wr.ID = kindWait | uint64(slot)
	}
	err := c.qp.PostSend(&wr)
	c.smu.Unlock()
	if err != nil {
		c.freeSlot <- slot
		return err
	}
	if !wait {
		return nil
	}
	return c.awaitSlot(slot, rdma.OpSend)
}

// awaitSlot waits for the completion of the signaled request posted with
// slot and gives the slot back.
func (c *Conn) awaitSlot(slot int, op rdma.Op) error {
	var st rdma.Status
	select {
	case st = <-c.waiters[slot]:
	case <-c.ctx.Done():
		// The completion (flushed) still arrives; the slot is not
		// needed any more.
		return errTerminated
	}
	c.freeSlot <- slot
	if st != rdma.Success {
		return fmt.Errorf("iser: RDMA %v failed: %v", op, st)
	}
	return nil
}

// registerTask maps the command's buffers and fills the header (the
// initiator's side of draft-ietf-ips-iwarp-da §11.3.1): the data-in buffer whole under a
// remote-write STag (RSV), the solicited part of the data-out buffer
// under a remote-read STag (WSV). In the Linux profile the base offset is
// a virtual address and the write base already points past the
// unsolicited data (facts §2.5); in RFC 5046 offsets are zero-based.
func (c *Conn) registerTask(p *datamover.PDU, h *Header) error {
	itt := p.BHS.ITT()
	c.tmu.Lock()
	defer c.tmu.Unlock()
	t := c.taskLocked(itt)
	linux := c.r.opt.Profile == ProfileLinux
	// register maps buf under a recycled region: VA-based offsets in the
	// Linux profile, zero-based in RFC 5046.
	register := func(buf []byte, access rdma.Access) (*rdma.MR, uint32, uint64, error) {
		mr, err := c.mrLocked()
		if err != nil {
			return nil, 0, 0, err
		}
		va := uint64(0)
		if linux {
			va = vaBase(mr)
		}
		stag, err := mr.Map(buf, va, access)
		// A hardware device names the buffer by its own address
		// (VA-based, the iSER-on-InfiniBand draft part IV) whatever va was asked.
		return mr, stag, mr.VA(), err
	}
	if len(p.DataIn) > 0 {
		mr, stag, va, err := register(p.DataIn, rdma.RemoteWrite)
		if err != nil {
			return err
		}
		t.rmr, t.rsv, t.rstag, t.rva = mr, true, stag, va
		h.RSV, h.ReadSTag, h.ReadVA = true, stag, va
	}
	if len(p.DataOut) > p.UnsolicitedDataSize {
		mr, stag, va, err := register(p.DataOut, rdma.RemoteRead)
		if err != nil {
			return err
		}
		t.wmr, t.wsv, t.wstag, t.wva = mr, true, stag, va
		h.WSV, h.WriteSTag, h.WriteVA = true, stag, va
		if linux {
			h.WriteVA = va + uint64(p.UnsolicitedDataSize)
		}
	}
	return nil
}

// vaBase gives each region its own stretch of a made-up address space, so
// tagged offsets look like the virtual addresses Linux uses.
func vaBase(mr *rdma.MR) uint64 { return 0x7f00_0000_0000 | uint64(mr.STag()>>8)<<24 }

func (c *Conn) taskLocked(itt uint32) *taskTags {
	t := c.tasks[itt]
	if t == nil {
		if n := len(c.spare); n > 0 {
			t = c.spare[n-1]
			c.spare = c.spare[:n-1]
		} else {
			t = &taskTags{}
		}
		*t = taskTags{solBase: -1}
		c.tasks[itt] = t
	}
	return t
}

func (c *Conn) mrLocked() (*rdma.MR, error) {
	if n := len(c.mrPool); n > 0 {
		mr := c.mrPool[n-1]
		c.mrPool = c.mrPool[:n-1]
		return mr, nil
	}
	// On a hardware device with memory windows each mapping is a window
	// of its own on this queue pair (a key per I/O).
	return c.r.pd.AllocMROn(c.qp)
}

// settle puts a read's data in the initiator's buffer before its SCSI
// Response is delivered: the target's RDMA Writes, all placed before the
// response's Send, may have gone to a bounce buffer (rdma.MR.Settle).
func (c *Conn) settle(itt uint32) {
	c.tmu.Lock()
	var mr *rdma.MR
	if t := c.tasks[itt]; t != nil {
		mr = t.rmr
	}
	c.tmu.Unlock()
	if mr != nil {
		mr.Settle()
	}
}

// DeallocateTaskResources implements datamover.Conn (draft-ietf-ips-iwarp-da §9.9): the
// initiator invalidates STags the target did not invalidate and recycles
// them; the target forgets them.
func (c *Conn) DeallocateTaskResources(itt uint32) {
	c.tmu.Lock()
	defer c.tmu.Unlock()
	t := c.tasks[itt]
	if t == nil {
		return
	}
	if t.cmds--; t.cmds > 0 {
		return // a later command with the ITT goes on
	}
	delete(c.tasks, itt)
	for _, mr := range []*rdma.MR{t.rmr, t.wmr} {
		if mr != nil {
			mr.Invalidate()
			c.mrPool = append(c.mrPool, mr)
		}
	}
	*t = taskTags{}
	c.spare = append(c.spare, t)
}

// wait posts a signaled request and waits for its completion.
func (c *Conn) wait(wr *rdma.SendWR) error {
	var slot int
	select {
	case slot = <-c.freeSlot:
	case <-c.ctx.Done():
		return errTerminated
	}
	wr.ID = kindWait | uint64(slot)
	if err := c.qp.PostSend(wr); err != nil {
		c.freeSlot <- slot
		return err
	}
	return c.awaitSlot(slot, wr.Op)
}

// PutData implements datamover.Conn (draft-ietf-ips-iwarp-da §9.2, RFC 5046 §9.6): RDMA
// Write into the Read STag the command advertised; with the status
// collapsed, the SCSI Response follows as a Send.
func (c *Conn) PutData(d *datamover.DataIn) error {
	c.tmu.Lock()
	t := c.tasks[d.ITT]
	var stag uint32
	var to uint64
	ok := t != nil && t.rsv
	if ok {
		stag, to = t.rstag, t.rva+uint64(d.Offset)
	}
	c.tmu.Unlock()
	if !ok {
		return &datamover.ProtocolError{Err: fmt.Errorf("iser: Put_Data for ITT %#x, whose command advertised no Read STag (RFC 5046 §7.3.1, §9.2)", d.ITT)}
	}
	withStatus := d.Final && d.WithStatus
	if len(d.Data) > 0 {
		wr := rdma.SendWR{Op: rdma.OpWrite, SG: [][]byte{d.Data}, RemoteSTag: stag, RemoteTO: to}
		if !withStatus && !d.Ack {
			// The write completes before the buffer goes back to the
			// task.
			return c.wait(&wr)
		}
		// A later completion below comes after this one (send queues
		// complete in order), so one wait covers both.
		wr.Unsignaled = true
		if err := c.qp.PostSend(&wr); err != nil {
			return err
		}
	}
	if d.Ack {
		// RFC 5046 §7.3.5, approach 1 (right at every ErrorRecoveryLevel):
		// a zero-length RDMA Read after the Write. The initiator's RNIC
		// answers it only after placing the Write (RDMAP ordering, RFC
		// 5040 §5.5), so its completion is the acknowledgement.
		rd := rdma.SendWR{Op: rdma.OpRead, Sink: c.ackMR, RemoteSTag: stag, RemoteTO: to + uint64(len(d.Data))}
		if err := c.wait(&rd); err != nil {
			return err
		}
		next := uint32(0)
		if d.DataSN != nil {
			next = *d.DataSN
		}
		c.up.DataACKNotify(d.ITT, next)
	}
	if !withStatus {
		return nil
	}
	r := pdu.SCSIResponse{ITT: d.ITT, Response: pdu.RespCompleted, Status: d.Status,
		Overflow: d.Overflow, Underflow: d.Underflow, Residual: d.Residual}
	var p datamover.PDU
	r.Encode(&p.BHS)
	return c.sendControl(&p, true, true)
}

// GetData implements datamover.Conn (draft-ietf-ips-iwarp-da §9.3, RFC 5046 §9.6): the
// R2T becomes an RDMA Read of the solicited range from the Write STag into
// buf; Data_Completion_Notify follows its completion. The QP never has
// more Reads outstanding than the negotiated ORD.
func (c *Conn) GetData(r2t *pdu.R2T, buf []byte) error {
	end := uint64(r2t.Offset) + uint64(r2t.Desired)
	if end > uint64(len(buf)) {
		return fmt.Errorf("iser: R2T [%d,+%d) beyond the %d-byte buffer", r2t.Offset, r2t.Desired, len(buf))
	}
	stag, to, ok := c.readTarget(r2t)
	if !ok {
		return fmt.Errorf("iser: Get_Data for ITT %#x, whose command advertised no Write STag (RFC 5046 §9.2)", r2t.ITT)
	}
	var i int
	select {
	case i = <-c.freeRead:
	default:
		// All read contexts are busy: the dispatcher starts this one
		// when a Read completes (it must never block on itself).
		c.rmu.Lock()
		c.queued = append(c.queued, queuedRead{*r2t, buf})
		c.rmu.Unlock()
		return nil
	}
	return c.startRead(i, r2t, buf, stag, to)
}

// readTarget is where the solicited range of r2t lives at the initiator.
func (c *Conn) readTarget(r2t *pdu.R2T) (stag uint32, to uint64, ok bool) {
	c.tmu.Lock()
	defer c.tmu.Unlock()
	t := c.tasks[r2t.ITT]
	if t == nil || !t.wsv {
		return 0, 0, false
	}
	if c.r.opt.Profile == ProfileRFC5046 {
		return t.wstag, uint64(r2t.Offset), true
	}
	// Linux profile: the write base addresses the first solicited byte
	// (facts §2.5), the first R2T's offset.
	if t.solBase < 0 {
		t.solBase = int64(r2t.Offset)
	}
	return t.wstag, t.wva + uint64(int64(r2t.Offset)-t.solBase), true
}

func (c *Conn) startRead(i int, r2t *pdu.R2T, buf []byte, stag uint32, to uint64) error {
	end := r2t.Offset + r2t.Desired
	rc := &c.reads[i]
	rc.itt, rc.ttt = r2t.ITT, r2t.TTT
	if _, err := rc.mr.Map(buf[r2t.Offset:end], 0, rdma.LocalWrite); err != nil {
		c.freeRead <- i
		return err
	}
	wr := rdma.SendWR{ID: kindRead | uint64(i), Op: rdma.OpRead, Sink: rc.mr, Length: int(r2t.Desired),
		RemoteSTag: stag, RemoteTO: to}
	if err := c.qp.PostSend(&wr); err != nil {
		rc.mr.Invalidate()
		c.freeRead <- i
		return err
	}
	return nil
}

// terminateGrace bounds how long ConnectionTerminate waits for the sends
// already posted. On a reliable connection a lost message is resent after
// the ACK timeout, and acknowledged one later: Linux's rdma_cm asks for
// 4.096 µs × 2^17 ≈ 0.54 s on RoCE, and a retransmission timer that
// checks once per timeout resends after one to two of them. Four seconds
// cover two lost transmissions; a peer that never acknowledges holds a
// closing connection no longer.
const terminateGrace = 4 * time.Second

// ConnectionTerminate implements datamover.Conn (draft-ietf-ips-iwarp-da §9.7). Control
// PDUs already handed to Send_Control (a Logout Response, a failed Login
// Response) still go out first: the queue pair closes once its sends
// have completed, once it has failed, or after terminateGrace.
func (c *Conn) ConnectionTerminate() {
	c.termOnce.Do(func() {
		deadline := time.Now().Add(terminateGrace)
		for len(c.freeSlot) < int(c.nslots.Load()) && time.Now().Before(deadline) {
			select {
			case <-c.qp.Done():
				deadline = time.Now()
			case <-time.After(time.Millisecond):
			}
		}
		c.cancel()
		c.qp.Close()
	})
}

// dispatch handles send-queue completions: slots come back, waiters wake,
// and finished RDMA Reads become Data_Completion_Notify.
func (c *Conn) dispatch() {
	defer close(c.dispDone)
	var cs [32]rdma.Completion
	for {
		n, err := c.r.scq.Wait(c.ctx, cs[:])
		if err != nil {
			// Drain what the flush delivered so slot owners are freed.
			n = c.r.scq.Poll(cs[:])
			if n == 0 {
				return
			}
		}
		for _, cp := range cs[:n] {
			i := int(cp.ID & indexMask)
			switch cp.ID & kindMask {
			case kindSlot:
				c.freeSlot <- i
			case kindWait:
				c.waiters[i] <- cp.Status
			case kindRead:
				rc := c.reads[i]
				rc.mr.Invalidate()
				c.freeRead <- i
				c.startQueued()
				if cp.Status == rdma.Success {
					c.up.DataCompletionNotify(rc.itt, rc.ttt)
				}
			}
			if cp.Status != rdma.Success && cp.Status != rdma.Flushed {
				// A send that fails because the peer closed the
				// connection (a kernel device may fail it rather than
				// flush it when the peer leaves mid-send) is no error of
				// ours: the iSCSI layer logs the connection's end.
				lvl := slog.LevelWarn
				if errors.Is(c.qp.Err(), rdma.ErrDisconnected) {
					lvl = slog.LevelDebug
				}
				c.log.Log(c.ctx, lvl, "iser: send queue error", "status", cp.Status, "err", c.qp.Err())
				c.ConnectionTerminate()
			}
		}
	}
}

// flushGrace is how long serve may go on reading after its queue pair
// ended, for what arrived before the end and the flushes behind it.
const flushGrace = 200 * time.Millisecond

// Serve implements datamover.Conn: it delivers received PDUs until the
// connection ends, then calls ConnectionTerminateNotify once.
func (c *Conn) Serve(up datamover.Upcalls) {
	c.up = up
	go c.dispatch()
	// A queue pair's end flushes its receives, in order behind what had
	// arrived: serve delivers that and ends at the first flushed one. The
	// end may be heard first — a target disconnects right after its
	// Logout Response, and a kernel device tells the disconnect and the
	// receive on different channels — so it ends serve's wait only if no
	// flush comes within flushGrace: a queue pair can fail without
	// flushing (a kernel device after the peer broke the rules).
	go func() {
		select {
		case <-c.qp.Done():
			select {
			case <-time.After(flushGrace):
				c.cancel()
			case <-c.ctx.Done():
			}
		case <-c.ctx.Done():
		}
	}()
	var err error
	if !c.helloDone && c.init {
		// RFC 5046 §5.1.3: Hello is the initiator's first iSER message.
		h := Hello{MaxVer: VersionRFC5046, MinVer: VersionRFC5046, IRD: uint16(c.r.opt.IRD)}
		err = c.sendRaw(h.Append(nil))
	}
	if err == nil {
		err = c.serve(up)
	}
	c.ConnectionTerminate()
	<-c.qp.Done()
	<-c.dispDone
	// The queue pair is closed and nothing reads a receive buffer or a
	// send slot any more (a delivered PDU is not kept past its upcall:
	// its buffer is posted again right after).
	c.deregister()
	c.pmu.Lock()
	c.freed = true
	c.r.pd.Free(c.r.recvBacking)
	c.r.pd.Free(c.r.grown)
	c.r.pd.Free(c.slotBacking)
	c.r.pd.Free(c.moreSlots)
	if c.charged > 0 {
		c.r.opt.Memory.Give(c.charged)
		c.charged = 0
	}
	c.pmu.Unlock()
	if err == nil {
		if qerr := c.qp.Err(); qerr != nil && !errors.Is(qerr, rdma.ErrDisconnected) {
			err = qerr
		}
	}
	up.ConnectionTerminateNotify(err)
}

func (c *Conn) serve(up datamover.Upcalls) error {
	var cs [32]rdma.Completion
	var p datamover.PDU
	for {
		n, err := c.r.rcq.Wait(c.ctx, cs[:])
		if err != nil {
			return nil
		}
		for _, cp := range cs[:n] {
			if cp.Status != rdma.Success {
				// The QP failed: the rest are flushed receives.
				return nil
			}
			if err := c.receive(up, &cp, &p); err != nil {
				return err
			}
			if err := c.qp.PostRecv(rdma.RecvWR{ID: cp.ID, Buf: c.r.recvBufs[cp.ID]}); err != nil {
				return nil
			}
		}
	}
}

func (c *Conn) receive(up datamover.Upcalls, cp *rdma.Completion, p *datamover.PDU) error {
	msg := c.r.recvBufs[cp.ID][:cp.Len]
	if !c.helloDone {
		return c.hello(msg)
	}
	h, err := Decode(msg, c.hl)
	if err != nil {
		return err
	}
	if h.Opcode != OpControl {
		return formatError("unexpected %#x message in full feature phase (RFC 5046 §10.1.3.2)", h.Opcode>>4)
	}
	copy(p.BHS[:], msg[c.hl:])
	ahs := p.BHS.TotalAHSLength()
	dsl := p.BHS.DataSegmentLength()
	start := c.hl + pdu.BHSLen + ahs
	if start+dsl > len(msg) {
		return formatError("%s announces %d AHS and %d data bytes, the message holds %d (RFC 5046 §9.2)",
			p.BHS.Opcode(), ahs, dsl, len(msg)-c.hl-pdu.BHSLen)
	}
	p.AHS = msg[c.hl+pdu.BHSLen : start]
	p.Data = msg[start : start+dsl]
	if c.count(p) {
		lim := c.fromIni.limit
		if c.init {
			lim = c.fromTgt.limit
		}
		return unexpectedError(&p.BHS, lim)
	}
	op := p.BHS.Opcode()
	if c.init && op == pdu.OpSCSIResponse {
		c.settle(p.BHS.ITT())
	}
	command := !c.init && op == pdu.OpSCSICommand
	if command {
		if edtl, bad := readsWithoutSTag(&p.BHS, h); bad {
			// Its Put_Data would have nowhere to write, and the
			// initiator would wait for data until its own timeout.
			return &datamover.ProtocolError{Err: fmt.Errorf(
				"iser: SCSI read command ITT %#x for %d bytes advertises no Read STag (RFC 5046 §7.3.1; an iSER protocol error, RFC 5046 §10.1.3.4)",
				p.BHS.ITT(), edtl)}
		}
		// The command's STags, kept from its arrival until its task is
		// deallocated, or dropped below if the iSCSI layer refuses it.
		c.tmu.Lock()
		t := c.taskLocked(p.BHS.ITT())
		t.wsv, t.wstag, t.wva = h.WSV, h.WriteSTag, h.WriteVA
		t.rsv, t.rstag, t.rva = h.RSV, h.ReadSTag, h.ReadVA
		t.cmds++
		c.tmu.Unlock()
	}
	var perr error
	if dsl > 0 {
		buf, err := up.DataBuffer(&p.BHS)
		switch {
		case err != nil:
			perr = err
		case buf != nil:
			if len(buf) < dsl {
				return fmt.Errorf("iser: internal: data buffer of %d bytes for a %d-byte segment", len(buf), dsl)
			}
			// Immediate and unsolicited data: the one copy, out of the
			// receive buffer into the task's buffer.
			p.Data = buf[:copy(buf, p.Data)]
		}
	}
	if perr == nil {
		perr = up.ControlNotify(p)
	}
	if perr != nil && command {
		// Refused, it never becomes a task that would be deallocated.
		c.DeallocateTaskResources(p.BHS.ITT())
	}
	if perr != nil {
		var pe *datamover.ProtocolError
		if errors.As(perr, &pe) && pe.Reject {
			var r datamover.PDU
			rj := pdu.Reject{Reason: pe.Reason}
			rj.Encode(&r.BHS)
			hdr := p.BHS
			r.Data = hdr[:]
			if err := c.SendControl(&r, true); !errors.Is(err, datamover.ErrUnexpectedLimit) {
				return err
			}
			// RFC 5046 §8.1.2: no Reject beyond the initiator's limit.
			c.log.Warn("iser: Reject not sent: the initiator's MaxOutstandingUnexpectedPDUs is reached", "err", perr)
			return nil
		}
		return perr
	}
	return nil
}

var _ datamover.Conn = (*Conn)(nil)

// readsWithoutSTag reports a SCSI Command that expects data-in (R set,
// W clear, Expected Data Transfer Length above zero) but whose iSER header
// advertises no Read STag, which RFC 5046 §7.3.1 c requires of it; edtl is
// its length. A bidirectional command's read length is in its AHS: its
// Put_Data reports the missing STag instead.
func readsWithoutSTag(b *pdu.BHS, h Header) (edtl uint32, bad bool) {
	if h.RSV {
		return 0, false
	}
	var cmd pdu.SCSICommand
	cmd.Decode(b) // the iSCSI layer answers a malformed one
	return cmd.EDTL, cmd.Read && !cmd.Write && cmd.EDTL > 0
}

// startQueued issues queued Get_Data requests while read contexts are
// free.
func (c *Conn) startQueued() {
	for {
		c.rmu.Lock()
		if len(c.queued) == 0 {
			c.rmu.Unlock()
			return
		}
		var i int
		select {
		case i = <-c.freeRead:
		default:
			c.rmu.Unlock()
			return
		}
		q := c.queued[0]
		copy(c.queued, c.queued[1:])
		c.queued = c.queued[:len(c.queued)-1]
		c.rmu.Unlock()
		stag, to, ok := c.readTarget(&q.r2t)
		if !ok {
			c.freeRead <- i
			continue // the task is gone
		}
		if err := c.startRead(i, &q.r2t, q.buf, stag, to); err != nil {
			c.ConnectionTerminate()
			return
		}
	}
}

// RecvDataSize is the data segment a receive buffer holds: this side's
// Target/InitiatorRecvDataSegmentLength.
func (c *Conn) RecvDataSize() int { return c.r.opt.RecvDataSize }

// sendRaw sends an iSER message that is not an iSCSI PDU (Hello,
// HelloReply) as a SendSE (RFC 5046 Appendix A), ahead of the ready gate.
func (c *Conn) sendRaw(msg []byte) error {
	var slot int
	select {
	case slot = <-c.freeSlot:
	case <-c.ctx.Done():
		return errTerminated
	}
	buf := c.slots[slot][:copy(c.slots[slot], msg)]
	wr := rdma.SendWR{ID: kindSlot | uint64(slot), Op: rdma.OpSend, Solicited: true, SG: [][]byte{buf}}
	c.smu.Lock()
	err := c.qp.PostSend(&wr)
	c.smu.Unlock()
	if err != nil {
		c.freeSlot <- slot
	}
	return err
}

// hello handles the first message of the RFC 5046 profile: the target
// answers the initiator's Hello (iSER-ORD = min(own ORD, iSER-IRD),
// rejecting when the versions do not overlap or it cannot serve the
// initiator's RDMA Reads); the initiator checks the HelloReply. Anything
// else first is a protocol error (RFC 5046 §10.1.3.2): the stream ends.
func (c *Conn) hello(msg []byte) error {
	if c.init {
		r, err := DecodeHelloReply(msg)
		if err != nil {
			return fmt.Errorf("iser: the target's first message is not a HelloReply (RFC 5046 §5.1.3): %w", err)
		}
		if r.Reject {
			return fmt.Errorf("iser: the target rejected our Hello (versions %d-%d, its %d; iSER-ORD %d) (RFC 5046 §10.1.3.4)",
				VersionRFC5046, VersionRFC5046, r.MaxVer, r.ORD)
		}
		c.helloDone = true
		close(c.ready)
		return nil
	}
	h, err := DecodeHello(msg)
	if err != nil {
		return fmt.Errorf("iser: the initiator's first message is not a Hello (RFC 5046 §5.1.3): %w", err)
	}
	r := AnswerHello(h, VersionRFC5046, VersionRFC5046, uint16(c.qp.Attr().ORD))
	if err := c.sendRaw(r.Append(nil)); err != nil {
		return err
	}
	if r.Reject {
		return fmt.Errorf("iser: Hello rejected: versions %d-%d, iSER-IRD %d, our ORD %d (RFC 5046 §10.1.3.4)",
			h.MinVer, h.MaxVer, h.IRD, c.qp.Attr().ORD)
	}
	c.helloDone = true
	close(c.ready)
	return nil
}

// mayGenerate reports whether p may be sent without exceeding the peer's
// MaxOutstandingUnexpectedPDUs (RFC 5046 §8.1.1.3, §8.1.2). A target keeps
// the last one for a NOP-In ping, through whose answer the initiator can
// retire the others (§8.2's implementation note). Called under smu.
func (c *Conn) mayGenerate(p *datamover.PDU) bool {
	if !c.ucount.Load() {
		return true
	}
	c.umu.Lock()
	defer c.umu.Unlock()
	if c.init {
		return !initiatorUnexpected(&p.BHS) || !c.fromIni.full(0)
	}
	u, ttt := targetUnexpected(&p.BHS, p.Data)
	if !u {
		return true
	}
	reserve := 1
	if p.BHS.Opcode() == pdu.OpNopIn && ttt != pdu.ReservedTTT {
		reserve = 0
	}
	return !c.fromTgt.full(min(reserve, c.fromTgt.limit-1))
}

// count applies a control PDU sent or received to the unexpected-PDU
// ledgers and reports whether a received one exceeds this side's limit.
func (c *Conn) count(p *datamover.PDU) (over bool) {
	if !c.ucount.Load() {
		return false
	}
	c.umu.Lock()
	defer c.umu.Unlock()
	if op := p.BHS.Opcode(); op&0x20 != 0 { // target opcodes (RFC 7143 §11.2.1.2)
		return targetPDU(&p.BHS, p.Data, &c.fromIni, &c.fromTgt)
	}
	return initiatorPDU(&p.BHS, &c.fromIni, &c.fromTgt)
}
