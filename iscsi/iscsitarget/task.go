package iscsitarget

import (
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/internal/bufpool"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/scsi"
	"github.com/blockwire/blockwire/scsitarget"
)

// burst is one outstanding R2T (RFC 7143 §11.8).
type burst struct {
	ttt    uint32
	offset uint32
	length uint32
	next   uint32 // next expected offset (DataPDUInOrder)
	got    uint32
	dataSN uint32
	r2tSN  uint32
	live   bool
}

// task is one SCSI command on a connection.
type task struct {
	c     *conn
	cmd   scsitarget.Command
	cdb   [16 + 244]byte
	itt   uint32
	lun   [8]byte
	cmdSN uint32
	edtl  uint32
	read  bool
	write bool
	imm   bool
	buf   []byte       // bb.B, or nil
	bb    *bufpool.Buf // the I/O buffer's pool handle

	// Data-out accounting, guarded by conn.mu.
	received    uint32
	unsolOpen   bool
	unsolLimit  uint32
	unsolNext   uint32
	unsolDataSN uint32
	nextR2T     uint32
	r2tSN       uint32
	bursts      []burst
	r2tBuf      []pdu.R2T // reused for the R2Ts of one step
	delivered   bool
	executing   bool
	aborted     bool
	released    bool
	// finishing: executed, its response (if any) about to be sent or
	// sent, release next — its ITT is as good as free (see register).
	finishing bool
	solo      bool // delivered as the connection's only task
	parked    bool // in conn.parked, waiting for a worker (conn.mu)
	worker    bool // handed to a worker (conn.working counts it)
	// next is what enter decided and act carries out (both on the
	// delivering goroutine, enter under session.mu, act after it).
	next action
	// full: no I/O buffer could be had within the budget
	// (Options.IOBudget): the command is answered TASK SET FULL, its
	// data discarded. charged is the budget it holds; counted, that it
	// holds a slot of the session's window (session.busy).
	full    bool
	charged int64
	counted bool
	// solicits: it holds one of the connection's places for WRITEs
	// whose data is solicited (Options.SolicitedWrites), from arrival or
	// from its turn until its data is in; waiting: it is in line for one
	// (conn.waitingR2T); partial: its buffer holds only the data it
	// brought unasked, the whole one comes with its turn (wholeLocked).
	// All three guarded by conn.mu.
	solicits bool
	waiting  bool
	partial  bool
	// seen is received at the pinger's last tick, stalled the ticks
	// since without more data while Data-Out was owed (checkData).
	seen    uint32
	stalled int

	dataSN   uint32
	senseBuf [2 + 64]byte
	// Scratch for the response, so nothing escapes per command through
	// the datamover interface.
	di        datamover.DataIn
	resp      datamover.PDU
	lunErr    bool
	onAbortFn func()
}

// newTask decodes a SCSI Command header and prepares its task: the I/O
// buffer is sized to the expected data transfer length so that immediate
// data, Data-Out and Data-In all use it in place.
func (c *conn) newTask(h *pdu.BHS) (*task, error) {
	var cmd pdu.SCSICommand
	if err := cmd.Decode(h); err != nil {
		return nil, asReject(err)
	}
	dsl := uint32(h.DataSegmentLength())
	if dsl > 0 {
		switch {
		case !cmd.Write:
			return nil, reject(pdu.RejectProtocolError, "iscsi: immediate data on a command without W (RFC 7143 §11.3.1)")
		case !c.conf.ImmediateData:
			return nil, reject(pdu.RejectProtocolError, "iscsi: immediate data with ImmediateData=No (RFC 7143 §13.11)")
		case dsl > cmd.EDTL:
			return nil, reject(pdu.RejectProtocolError, "iscsi: %d bytes of immediate data exceed Expected Data Transfer Length %d (RFC 7143 §11.3.4)", dsl, cmd.EDTL)
		case dsl > c.conf.FirstBurstLength:
			return nil, reject(pdu.RejectProtocolError, "iscsi: %d bytes of immediate data exceed FirstBurstLength %d (RFC 7143 §13.14)", dsl, c.conf.FirstBurstLength)
		}
	}
	if cmd.EDTL > maxTransfer {
		return nil, reject(pdu.RejectOutOfResources, "iscsi: Expected Data Transfer Length %d above the %d-byte limit", cmd.EDTL, maxTransfer)
	}
	t := c.srv.getTask(c)
	t.itt = cmd.ITT
	t.lun = cmd.LUN
	t.cmdSN = cmd.CmdSN
	t.edtl = cmd.EDTL
	t.read = cmd.Read
	t.write = cmd.Write
	t.imm = cmd.Immediate
	copy(t.cdb[:16], cmd.CDB[:])
	cdbLen := 16
	if l := scsi.CDBLength(cmd.CDB[0]); l > 0 && l <= 16 {
		cdbLen = l
	}
	t.cmd.CDB = t.cdb[:cdbLen]
	t.cmd.Tag = uint64(cmd.ITT)
	if lun, err := scsi.DecodeLUN(cmd.LUN); err == nil {
		t.cmd.LUN = lun
	} else {
		t.cmd.LUN = ^uint64(0)
		t.lunErr = true
	}
	t.cmd.Nexus = c.sess.nexus
	if cmd.Write {
		t.received = dsl
		if !c.conf.InitialR2T {
			t.unsolLimit = min(c.conf.FirstBurstLength, cmd.EDTL)
		} else {
			t.unsolLimit = dsl
		}
		// F=0 announces unsolicited Data-Out (RFC 7143 §11.3.1).
		t.unsolOpen = !cmd.Final
		t.unsolNext = dsl
		if t.unsolOpen && c.conf.InitialR2T {
			c.freeTask(t)
			return nil, reject(pdu.RejectProtocolError, "iscsi: F=0 announces unsolicited data but InitialR2T=Yes (RFC 7143 §13.10)")
		}
		t.nextR2T = max(dsl, 0)
	}
	if need := cmd.EDTL; need > 0 {
		if cmd.Write && cmd.EDTL > t.unsolLimit && !c.solicitNow(t) {
			// Its data will be solicited after the connection's
			// earlier WRITEs' (Options.SolicitedWrites): until then it
			// holds a buffer for what it brings unasked only.
			need, t.partial = t.unsolLimit, true
		}
		switch {
		case need == 0: // nothing comes before its turn
		case c.sess.io.Take(int64(need)):
			t.charged = int64(need)
			t.bb = c.srv.pool.Get(int(need))
			t.buf = t.bb.B
			t.cmd.Data = t.buf
		default:
			t.full = true
			c.sess.noteFull(cmd.EDTL)
		}
	}
	t.cmd.OnAbort = t.onAbortFn
	return t, nil
}

// solicitNow gives t one of the connection's places for WRITEs whose data
// is solicited (Options.SolicitedWrites) if one is free and no WRITE
// waits for one already.
func (c *conn) solicitNow(t *task) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.solicitLocked(t)
}

func (c *conn) solicitLocked(t *task) bool {
	if c.soliciting >= c.srv.opts.SolicitedWrites || len(c.waitingR2T) > 0 {
		return false
	}
	c.soliciting++
	t.solicits = true
	return true
}

// endSolicitLocked gives back t's place among the soliciting WRITEs, or
// takes it out of the line for one; true when a waiting WRITE may now be
// admitted (admitWaiting, outside conn.mu).
func (c *conn) endSolicitLocked(t *task) bool {
	if t.waiting {
		t.waiting = false
		if i := slices.Index(c.waitingR2T, t); i >= 0 {
			c.waitingR2T = slices.Delete(c.waitingR2T, i, i+1)
		}
	}
	if !t.solicits {
		return false
	}
	t.solicits = false
	c.soliciting--
	return len(c.waitingR2T) > 0
}

// admitWaiting gives the WRITEs waiting for a place among the soliciting
// ones (in arrival order) the places free now, and sends their R2Ts.
func (c *conn) admitWaiting() {
	for {
		c.mu.Lock()
		if c.closed || len(c.waitingR2T) == 0 || c.soliciting >= c.srv.opts.SolicitedWrites {
			c.mu.Unlock()
			return
		}
		t := c.waitingR2T[0]
		c.waitingR2T = slices.Delete(c.waitingR2T, 0, 1)
		t.waiting = false
		c.soliciting++
		t.solicits = true
		a := t.advanceLocked()
		c.mu.Unlock()
		t.run(a)
	}
}

// wholeLocked gives a WRITE that waited with a partial buffer its whole
// transfer's buffer, the data it brought copied in (the one copy of an
// unsolicited payload that waited); false when the I/O budget has no room
// (TASK SET FULL).
func (t *task) wholeLocked() bool {
	c := t.c
	if !c.sess.io.Take(int64(t.edtl) - t.charged) {
		return false
	}
	t.charged = int64(t.edtl)
	bb := c.srv.pool.Get(int(t.edtl))
	copy(bb.B, t.buf)
	c.srv.pool.Put(t.bb)
	t.bb, t.buf, t.partial = bb, bb.B, false
	t.cmd.Data = t.buf
	return true
}

// getTask takes a task from the server's pool (no allocation per command
// in steady state) and clears it for c.
func (s *Server) getTask(c *conn) *task {
	t, _ := s.tasks.Get().(*task)
	if t == nil {
		t = &task{}
		t.onAbortFn = t.onAbort
	}
	bursts, r2ts, fn := t.bursts[:0], t.r2tBuf[:0], t.onAbortFn
	*t = task{c: c, bursts: bursts, r2tBuf: r2ts, onAbortFn: fn}
	return t
}

// putTask returns a finished task and its buffer to the pools.
func (s *Server) putTask(t *task) {
	s.pool.Put(t.bb)
	t.bb, t.buf, t.c = nil, nil, nil
	t.cmd = scsitarget.Command{}
	s.tasks.Put(t)
}

const maxTransfer = 64 << 20

// handleCommand is the SCSI Command arrival (draft-ietf-ips-iwarp-da §11.4.1).
func (c *conn) handleCommand(p *datamover.PDU) error {
	t := c.pendingTask
	c.pendingTask = nil
	if t == nil {
		var err error
		if t, err = c.newTask(&p.BHS); err != nil {
			return err
		}
	}
	if ahsLen := len(p.AHS); ahsLen > 0 {
		a, err := pdu.ParseAHS(pdu.OpSCSICommand, p.AHS)
		if err != nil {
			c.freeTask(t)
			return asReject(err)
		}
		if a.ExtCDB != nil {
			n := copy(t.cdb[16:], a.ExtCDB)
			t.cmd.CDB = t.cdb[:16+n]
		}
	}
	if t.imm {
		// Immediate commands skip CmdSN ordering, not the window.
		if !c.sess.admitImmediate() {
			itt := t.itt
			c.freeTask(t)
			return reject(pdu.RejectImmediateCmd, "iscsi: immediate command ITT %#x beyond the command window of %d (RFC 7143 §11.17.1)", itt, c.sess.window)
		}
		t.counted = true
	}
	c.mu.Lock()
	var waitUntil time.Time
	var wake *time.Timer // one for the whole wait
	for {
		old, dup := c.tasks[t.itt]
		if !dup {
			break
		}
		// An initiator that holds a command's response may reuse its ITT
		// at once (Linux's does); the old task is then finishing on its
		// worker and leaves the table in a moment: wait for that, briefly,
		// rather than reject a valid command. A task still in progress
		// makes the ITT a duplicate.
		if wake == nil {
			waitUntil = time.Now().Add(time.Second)
			wake = time.NewTimer(time.Second) // collected unstopped (Go 1.23 timers)
		}
		if !old.finishing || time.Now().After(waitUntil) {
			c.mu.Unlock()
			itt := t.itt // t goes back to the pool: not to be read after
			c.freeSlot(t)
			c.freeTask(t)
			return reject(pdu.RejectTaskInProgress, "iscsi: ITT %#x is already in use (RFC 7143 §11.2.1.8)", itt)
		}
		c.mu.Unlock()
		// Woken by a release (taskGone), not spinning: the old task's
		// answer may wait on a peer that takes none.
		select {
		case <-c.taskGone:
		case <-wake.C:
		}
		c.mu.Lock()
	}
	if c.closed || c.draining {
		c.mu.Unlock()
		c.freeSlot(t)
		c.freeTask(t)
		return nil
	}
	if n := len(c.tasks); n >= 2*int(c.sess.window) {
		// The window (non-immediate) and admitImmediate (immediate)
		// keep a connection below this; an initiator past it ignores
		// both, and is dropped with its tasks.
		c.mu.Unlock()
		c.freeSlot(t)
		c.freeTask(t)
		return &datamover.ProtocolError{Err: fmt.Errorf("iscsi: %d tasks on one connection, twice the command window of %d", n, c.sess.window)}
	}
	c.tasks[t.itt] = t
	c.inflight.Add()
	c.mu.Unlock()
	// A lone command on a LU that never blocks runs here, on the
	// receiving goroutine, rather than after a hand-off to a worker (the
	// hand-off is most of the latency at queue depth 1), unless the next
	// PDU waits already; and so does any command once the connection
	// holds maxWorking workers (run decides). Its delivery,
	// which happens under the session's ordering lock, only claims it
	// (act); the claim is on the connection, so t is not touched again
	// unless it was claimed — a dispatched t may already be finished and
	// back in the pool.
	c.inline.Store(t)
	c.sess.sequence(t.cmdSN, t.imm, t)
	if c.inline.Swap(nil) == &c.inlineClaimed {
		t.execute()
	}
	return nil
}

// enter puts the task into the SCSI task set in CmdSN order (under
// session.mu) and decides its next step, which act carries out once
// session.mu is released.
func (t *task) enter() {
	c := t.c
	c.mu.Lock()
	if t.released || t.aborted {
		// Ended while waiting for its CmdSN (connection loss, abort):
		// the window slot sequence took for it goes back (sequence
		// holds session.mu).
		if !t.imm {
			c.sess.busy--
		}
		c.mu.Unlock()
		return
	}
	if !t.imm {
		t.counted = true // the slot sequence took; release frees it
	}
	// Begin under conn.mu so that release, which checks delivered under
	// the same lock, never misses the End.
	c.sess.tgt.Device.Begin(&t.cmd)
	t.delivered = true
	t.solo = len(c.tasks) == 1
	t.next = t.advanceLocked()
	c.mu.Unlock()
}

// act carries out what enter decided: R2Ts, or execution.
func (t *task) act() {
	a := t.next
	t.next = action{}
	t.run(a)
}

// drop discards a command the CmdSN window refused.
func (t *task) drop() {
	c := t.c
	c.log.Debug("command outside the CmdSN window or duplicate, ignored (RFC 7143 §4.2.2.1)", "cmdsn", t.cmdSN, "itt", t.itt,
		"expcmdsn", c.sess.expCmdSN.Load(), "maxcmdsn", c.sess.maxCmdSN.Load())
	c.mu.Lock()
	t.aborted = true
	c.mu.Unlock()
	c.release(t, false)
}

type action struct {
	r2ts    []pdu.R2T
	execute bool
	// admit: a place among the connection's soliciting WRITEs came free
	// and a WRITE waits for it (conn.admitWaiting).
	admit bool
	// full: its whole buffer could not be had when its turn came.
	full bool
}

// advanceLocked decides the task's next step once it has been delivered:
// more R2Ts, or execution when all data is in. Called with conn.mu held.
func (t *task) advanceLocked() action {
	a := action{r2ts: t.r2tBuf[:0]}
	if !t.delivered || t.executing || t.aborted || t.released {
		return a
	}
	c := t.c
	if !t.write || t.received >= t.edtl || t.full {
		t.executing = true
		a.execute = true
		a.admit = c.endSolicitLocked(t)
		return a
	}
	if t.unsolOpen {
		return a
	}
	if !t.solicits {
		if t.waiting {
			return a
		}
		if !c.solicitLocked(t) {
			// Options.SolicitedWrites: its R2Ts wait for an earlier
			// WRITE's data to be in (admitWaiting).
			t.waiting = true
			c.waitingR2T = append(c.waitingR2T, t)
			c.srv.writesWaited.Add(1)
			return a
		}
	}
	if t.partial && !t.wholeLocked() {
		t.full = true
		t.executing = true
		a.execute = true
		a.admit = c.endSolicitLocked(t)
		a.full = true
		return a
	}
	outstanding := 0
	for i := range t.bursts {
		if t.bursts[i].live {
			outstanding++
		}
	}
	for outstanding < c.conf.MaxOutstandingR2T && t.nextR2T < t.edtl {
		n := min(t.edtl-t.nextR2T, c.conf.MaxBurstLength)
		c.nextTTT++
		if c.nextTTT == pdu.ReservedTTT {
			c.nextTTT = 0
		}
		b := burst{ttt: c.nextTTT, offset: t.nextR2T, length: n, next: t.nextR2T, r2tSN: t.r2tSN, live: true}
		slot := -1
		for i := range t.bursts {
			if !t.bursts[i].live {
				slot = i
				break
			}
		}
		if slot < 0 {
			t.bursts = append(t.bursts, b)
		} else {
			t.bursts[slot] = b
		}
		c.byTTT[b.ttt] = t
		a.r2ts = append(a.r2ts, pdu.R2T{LUN: t.lun, ITT: t.itt, TTT: b.ttt, R2TSN: t.r2tSN, Offset: b.offset, Desired: n})
		t.r2tSN++
		t.nextR2T += n
		outstanding++
	}
	t.r2tBuf = a.r2ts[:0]
	return a
}

// run carries out an action outside conn.mu and session.mu: Get_Data for
// every R2T (draft-ietf-ips-iwarp-da §9.3) or execution.
func (t *task) run(a action) {
	if a.full {
		t.c.sess.noteFull(t.edtl)
	}
	if a.admit {
		t.c.admitWaiting()
	}
	for i := range a.r2ts {
		if err := t.c.dm.GetData(&a.r2ts[i], t.buf); err != nil {
			// The datamover cannot fetch the data: the task could
			// never finish, so the connection ends (its tasks with it).
			t.c.log.Warn("Get_Data failed: the connection ends", "itt", fmt.Sprintf("%#x", t.itt), "err", err)
			t.c.terminate()
			return
		}
	}
	if a.execute {
		if !t.c.runsInline(t) {
			t.c.toWorker(t)
		}
	}
}

// runsInline decides where a command ready to execute runs: on the
// connection's receiving goroutine (true: claimed; handleCommand runs it
// once sequence returns) or on the logical unit's workers (false). The
// receiver runs it when all of these hold:
//
//   - it is the command the receiver is sequencing now (handleCommand
//     offered it in c.inline), not one a later PDU released;
//   - the connection is not iSER: there the response waits for RDMA
//     completions, and a receive goroutine waiting for them stalls every
//     other command of the connection (measured: 128 KiB reads 0.77× TCP
//     with it, 0.91× without);
//   - it is its connection's only command and the next PDU has not
//     arrived already — else the receiver goes on reading and the
//     workers' responses, sent with More, share writes (4 KiB reads at
//     QD 32 on one core: one writev per command before, 0.15 after; 7.2
//     µs of the target's CPU per command before, 5.0 after) — or the
//     connection already holds maxWorking workers: the receiver then runs
//     the command itself, which bounds what the connection holds
//     (toWorker parks the others' commands, and iSER's);
//   - its logical unit's backend never blocks (memory), so the receiver
//     is not held by storage.
func (c *conn) runsInline(t *task) bool {
	if c.inline.Load() != t || c.onRDMA() {
		return false
	}
	if !(t.solo && !c.pending() || c.working.Load() >= maxWorking) {
		return false
	}
	lu := t.cmd.LU()
	return lu != nil && lu.NonBlocking() && c.inline.CompareAndSwap(t, &c.inlineClaimed)
}

// placeDataOut validates a Data-Out header (RFC 7143 §11.7) and returns
// where its payload goes.
func (c *conn) placeDataOut(h *pdu.BHS) (doPlacement, error) {
	var d pdu.DataOut
	if err := d.Decode(h); err != nil {
		return doPlacement{}, asReject(err)
	}
	n := uint32(h.DataSegmentLength())
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.tasks[d.ITT]
	if t == nil || t.aborted || t.full {
		// Data for a task that ended or was aborted is discarded
		// (RFC 7143 §4.2.3.4 allows data to arrive after an abort).
		c.log.Debug("Data-Out for unknown or aborted task discarded", "itt", d.ITT)
		return doPlacement{valid: true}, nil
	}
	if !t.write {
		return doPlacement{}, reject(pdu.RejectProtocolError, "iscsi: Data-Out for ITT %#x, a command without W (RFC 7143 §11.7)", d.ITT)
	}
	end := d.Offset + n
	if end < d.Offset || end > t.edtl {
		return doPlacement{}, reject(pdu.RejectProtocolError, "iscsi: Data-Out offset %d length %d beyond Expected Data Transfer Length %d (RFC 7143 §11.7.6)", d.Offset, n, t.edtl)
	}
	if d.TTT == pdu.ReservedTTT {
		if !t.unsolOpen {
			return doPlacement{}, reject(pdu.RejectProtocolError, "iscsi: unsolicited Data-Out for ITT %#x outside its unsolicited burst (RFC 7143 §11.7.3)", d.ITT)
		}
		if end > t.unsolLimit {
			return doPlacement{}, reject(pdu.RejectProtocolError, "iscsi: unsolicited data up to offset %d exceeds FirstBurstLength %d (RFC 7143 §13.14)", end, t.unsolLimit)
		}
		if c.conf.DataPDUInOrder && d.Offset != t.unsolNext {
			return doPlacement{}, reject(pdu.RejectProtocolError, "iscsi: Data-Out offset %d, expected %d with DataPDUInOrder=Yes (RFC 7143 §13.18)", d.Offset, t.unsolNext)
		}
		if d.DataSN != t.unsolDataSN {
			return doPlacement{}, reject(pdu.RejectProtocolError, "iscsi: Data-Out DataSN %d, expected %d (RFC 7143 §11.7.4)", d.DataSN, t.unsolDataSN)
		}
		return doPlacement{t: t, off: d.Offset, n: n, valid: true}, nil
	}
	bt := c.byTTT[d.TTT]
	var b *burst
	if bt == t {
		for i := range t.bursts {
			if t.bursts[i].live && t.bursts[i].ttt == d.TTT {
				b = &t.bursts[i]
			}
		}
	}
	if b == nil {
		return doPlacement{}, reject(pdu.RejectInvalidPDUField, "iscsi: Data-Out with unknown TTT %#x for ITT %#x (RFC 7143 §11.7.3)", d.TTT, d.ITT)
	}
	if d.Offset < b.offset || end > b.offset+b.length {
		return doPlacement{}, reject(pdu.RejectProtocolError, "iscsi: Data-Out [%d,%d) outside the R2T's [%d,%d) (RFC 7143 §11.8.5)", d.Offset, end, b.offset, b.offset+b.length)
	}
	if c.conf.DataPDUInOrder && d.Offset != b.next {
		return doPlacement{}, reject(pdu.RejectProtocolError, "iscsi: Data-Out offset %d, expected %d with DataPDUInOrder=Yes (RFC 7143 §13.18)", d.Offset, b.next)
	}
	if d.DataSN != b.dataSN {
		return doPlacement{}, reject(pdu.RejectProtocolError, "iscsi: Data-Out DataSN %d, expected %d (RFC 7143 §11.7.4)", d.DataSN, b.dataSN)
	}
	return doPlacement{t: t, burst: b, off: d.Offset, n: n, valid: true}, nil
}

// handleDataOut accounts a received Data-Out (draft-ietf-ips-iwarp-da §11.4.5).
func (c *conn) handleDataOut(p *datamover.PDU) error {
	pl := c.pendingDO
	c.pendingDO = doPlacement{}
	if !pl.valid {
		var err error
		if pl, err = c.placeDataOut(&p.BHS); err != nil {
			return err
		}
	}
	if pl.t == nil {
		return nil
	}
	final := p.BHS.Final()
	t := pl.t
	c.mu.Lock()
	if t.aborted || t.released {
		c.mu.Unlock()
		return nil
	}
	t.received += pl.n
	if pl.burst == nil {
		t.unsolNext = pl.off + pl.n
		t.unsolDataSN++
		if final {
			t.unsolOpen = false
			if t.unsolNext > t.nextR2T {
				t.nextR2T = t.unsolNext
			}
		}
	} else {
		b := pl.burst
		b.got += pl.n
		b.next = pl.off + pl.n
		b.dataSN++
		if final {
			if b.got < b.length && c.conf.DataPDUInOrder {
				c.mu.Unlock()
				return reject(pdu.RejectProtocolError, "iscsi: R2T burst ended after %d of %d bytes (RFC 7143 §11.7.1)", b.got, b.length)
			}
			b.live = false
			delete(c.byTTT, b.ttt)
		}
	}
	act := t.advanceLocked()
	c.mu.Unlock()
	t.run(act)
	return nil
}

func (c *conn) findTask(itt uint32) *task {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tasks[itt]
}

// abortLocal aborts a task that is not in the SCSI task set yet. It
// reports false when the task is already executing or finished.
func (c *conn) abortLocal(t *task) bool {
	c.mu.Lock()
	if t.executing || t.released || t.delivered {
		c.mu.Unlock()
		return false
	}
	t.aborted = true
	c.mu.Unlock()
	c.release(t, false)
	return true
}

// onAbort is the SCSI core's abort hook: a task still waiting for data
// ends at once; an executing one ends when Execute returns, without a
// response (RFC 7143 §11.5.1, TaskReporting=RFC3720).
func (t *task) onAbort() {
	c := t.c
	c.mu.Lock()
	t.aborted = true
	waiting := !t.executing && !t.released
	c.mu.Unlock()
	// A task parked for a worker has not begun to execute: it ends now
	// too, rather than when a worker frees (behind a stalled backend).
	if waiting || c.unparkDropped(t) {
		c.release(t, false)
	}
}

// release ends a task: leaves the task set, frees its tags and (when
// reuse is safe) its buffer. Idempotent.
func (c *conn) release(t *task, reuseBuf bool) {
	c.mu.Lock()
	if t.released {
		c.mu.Unlock()
		return
	}
	t.released = true
	delivered := t.delivered
	if c.tasks[t.itt] == t {
		delete(c.tasks, t.itt)
		select {
		case c.taskGone <- struct{}{}:
		default:
		}
	}
	for i := range t.bursts {
		if t.bursts[i].live {
			delete(c.byTTT, t.bursts[i].ttt)
			t.bursts[i].live = false
		}
	}
	admit := c.endSolicitLocked(t)
	counted := t.counted
	t.counted = false
	c.mu.Unlock()
	if counted {
		c.sess.taskDone()
	}
	if admit {
		c.admitWaiting()
	}
	c.uncharge(t)
	if delivered {
		c.sess.tgt.Device.End(&t.cmd)
	}
	c.dm.DeallocateTaskResources(t.itt)
	c.inflight.Done()
	if reuseBuf {
		// Only a task that finished normally goes back to the pools: an
		// aborted one may still be the target of a Data-Out being read.
		c.srv.putTask(t)
	}
}

// freeTask drops a task that was never registered.
func (c *conn) freeTask(t *task) {
	if t.solicits {
		c.mu.Lock()
		admit := c.endSolicitLocked(t)
		c.mu.Unlock()
		if admit {
			c.admitWaiting()
		}
	}
	c.uncharge(t)
	c.srv.putTask(t)
}

// uncharge returns the task's I/O budget. The caller owns t (it was never
// registered, or release just ended it).
func (c *conn) uncharge(t *task) {
	if t.charged > 0 {
		c.sess.io.Give(t.charged)
		t.charged = 0
	}
}

// freeSlot gives back the window slot of a task that was never registered
// (an immediate command refused on arrival): nobody else can see it yet.
func (c *conn) freeSlot(t *task) {
	if t.counted {
		t.counted = false
		c.sess.taskDone()
	}
}

// execute runs the command in the SCSI core and answers it.
// Run implements blockcore.Work: the LU's queue runs the task.
func (t *task) Run() { t.execute() }

func (t *task) execute() {
	c := t.c
	dev := c.sess.tgt.Device
	if t.full {
		t.cmd.Status, t.cmd.SenseLen, t.cmd.Transfer = scsi.StatusTaskSetFull, 0, 0
	} else if !t.cmd.Aborted() {
		dev.Execute(&t.cmd)
	}
	c.mu.Lock()
	aborted := t.aborted || c.closed
	t.finishing = true
	// Other commands of the connection executing: their responses may
	// share this one's write (datamover.PDU.More).
	more := len(c.tasks) > 1
	// The slot is freed before the response, so the response carries the
	// window it opens (release would free it otherwise).
	counted := t.counted && !aborted
	if counted {
		t.counted = false
	}
	c.mu.Unlock()
	if counted {
		c.sess.taskDone()
	}
	if !aborted && !t.cmd.Commit() {
		aborted = true
	}
	worker := t.worker
	t.worker = false
	// On an LU's worker, the answer's wait for the peer (a socket write,
	// on iSER the Send's completion) does not count among the LU's
	// workers: a peer that stops taking answers holds goroutines, not the
	// workers every initiator of the LU shares.
	var lu *scsitarget.LU
	if worker {
		if lu = t.cmd.LU(); lu != nil && !lu.Detach() {
			lu = nil
		}
	}
	reuse := !aborted
	if !aborted {
		if err := t.respond(more); err != nil {
			// The device may still hold the buffer (a Write posted
			// before the failure): it is not reused.
			reuse = false
			c.answerFailed(t.itt, err)
		}
		if f := c.srv.opts.afterRespond; f != nil {
			f(t.itt)
		}
	}
	c.release(t, reuse) // t may be reused from here
	if lu != nil {
		lu.Reattach()
	}
	if worker {
		c.workerDone()
	}
}

// respond sends Data-In (Put_Data, draft-ietf-ips-iwarp-da §9.2) with the status
// collapsed into the last PDU when possible, or a SCSI Response
// (Send_Control, §11.3.2).
func (t *task) respond(more bool) error {
	c := t.c
	cmd := &t.cmd
	var over, under bool
	var residual uint32
	xfer := uint32(cmd.Transfer)
	switch {
	case xfer < t.edtl:
		under, residual = true, t.edtl-xfer
	case xfer > t.edtl:
		over, residual = true, xfer-t.edtl
	}
	if t.write && !t.read {
		// For writes the residual compares EDTL with what the CDB wanted.
		if cmd.Status != scsi.StatusGood && xfer == 0 {
			over, under, residual = false, false, 0
		}
	}
	n := min(xfer, t.edtl)
	if cmd.Status == scsi.StatusGood && t.read && n > 0 {
		t.di = datamover.DataIn{
			LUN: t.lun, ITT: t.itt, Data: t.buf[:n], DataSN: &t.dataSN,
			Final: true, WithStatus: true, Status: cmd.Status,
			Overflow: over, Underflow: under, Residual: residual, More: more,
		}
		return c.dm.PutData(&t.di)
	}
	r := pdu.SCSIResponse{
		ITT: t.itt, Response: pdu.RespCompleted, Status: cmd.Status,
		Overflow: over, Underflow: under, Residual: residual, ExpDataSN: t.dataSN + t.r2tSN,
	}
	var data []byte
	if cmd.SenseLen > 0 {
		sl := min(cmd.SenseLen, len(t.senseBuf)-2)
		binary.BigEndian.PutUint16(t.senseBuf[:2], uint16(sl))
		copy(t.senseBuf[2:], cmd.SenseData()[:sl])
		data = t.senseBuf[:2+sl]
	}
	r.Encode(&t.resp.BHS)
	t.resp.Data = data
	t.resp.More = more
	return c.dm.SendControl(&t.resp, true)
}
