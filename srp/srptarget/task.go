package srptarget

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/blockwire/blockwire/internal/bufpool"
	"github.com/blockwire/blockwire/internal/logsample"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/scsi"
	"github.com/blockwire/blockwire/scsitarget"
	"github.com/blockwire/blockwire/srp"
)

// task is one SRP_CMD or SRP_TSK_MGMT from receipt to its SRP_RSP. Tasks
// live in the channel's table, reused; the request IU stays in its receive
// buffer (the CDB and any immediate data are used in place) until the
// response is sent.
type task struct {
	ch   *channel
	idx  int32
	slot int
	iu   []byte

	tag     uint64
	sol     uint8
	write   bool
	out, in srp.Buffer
	cmd     scsitarget.Command
	bb      *bufpool.Buf
	table   *bufpool.Buf // an external descriptor table, fetched
	mr      *rdma.MR     // sink of the data-out RDMA Reads
	begun   bool
	charged int64 // I/O budget held (nexus.io)
	aborted bool  // under ch.mu
	done    bool  // released (under ch.mu)

	onAbortFn func()
	rsp       []byte // rspLen bytes of the channel's registered memory
	sg        [1][]byte
	wr        rdma.SendWR // PostSend copies it: reused for every post
}

func (t *task) reset(slot int, iu []byte) {
	t.slot, t.iu = slot, iu
	t.tag, t.sol, t.write = 0, 0, false
	t.out, t.in = srp.Buffer{}, srp.Buffer{}
	t.cmd = scsitarget.Command{}
	t.begun, t.aborted, t.done, t.charged = false, false, false, 0
	if t.onAbortFn == nil {
		t.onAbortFn = t.onAbort
	}
}

// onAbort is the SCSI core's abort hook. A task fetching data ends when
// its RDMA Reads complete, an executing one when Execute returns; neither
// is answered.
func (t *task) onAbort() {
	t.ch.mu.Lock()
	t.aborted = true
	t.ch.mu.Unlock()
}

func (ch *channel) id(t *task, kind uint64) uint64 { return uint64(t.idx)<<8 | kind }

// command starts an SRP_CMD (completion goroutine).
func (ch *channel) command(t *task) {
	var c srp.Cmd
	if err := c.Decode(t.iu, ch.immOff); err != nil {
		reason := srp.LogoutInvalidIULength
		var e *srp.Error
		if errors.As(err, &e) {
			reason = e.Logout
		}
		ch.release(t)
		ch.logout(reason, err)
		return
	}
	t.tag, t.sol, t.out, t.in = c.Tag, c.SolNT, c.Out, c.In
	cdb := c.CDB
	if l := scsi.CDBLength(cdb[0]); len(cdb) == 16 && l > 0 && l <= 16 {
		cdb = cdb[:l]
	}
	var lunField [8]byte
	binary.BigEndian.PutUint64(lunField[:], c.LUN)
	lun, err := scsi.DecodeLUN(lunField)
	if err != nil {
		lun = ^uint64(0)
	}
	t.cmd = scsitarget.Command{Nexus: ch.nx.n, LUN: lun, Tag: c.Tag, CDB: cdb, OnAbort: t.onAbortFn}

	ch.mu.Lock()
	_, dup := ch.byTag[c.Tag]
	if !dup {
		ch.byTag[c.Tag] = t
	}
	ch.mu.Unlock()
	switch {
	case dup:
		// SAM-5 §5.9: an overlapped command.
		ch.fail(t, &scsi.Sense{Key: scsi.SenseAbortedCommand, ASC: 0x4e, Bit: -1})
		return
	case c.Out.Format != srp.FmtNone && c.In.Format != srp.FmtNone:
		ch.fail(t, scsi.InvalidFieldInIU()) // bidirectional commands are not supported
		return
	case c.Out.Total > maxTransfer || c.In.Total > maxTransfer:
		ch.fail(t, scsi.InvalidFieldInIU())
		return
	case max(c.Out.Count(), c.In.Count()) > ch.s.opts.MaxDescriptors:
		ch.fail(t, scsi.InvalidFieldInIU())
		return
	}
	if n := max(int64(c.In.Total), int64(c.Out.Total)); n > 0 && c.Out.Format != srp.FmtImmediate {
		if !ch.nx.io.Take(n) {
			// No room in the nexus's share or the node's budget.
			ch.full(t, n)
			return
		}
		t.charged = n
	}
	ch.s.opts.Device.Begin(&t.cmd)
	t.begun = true
	switch {
	case c.Out.Format == srp.FmtImmediate:
		t.write = true
		t.cmd.Data = c.Out.Imm
	case c.Out.Format != srp.FmtNone:
		t.write = true
		if c.Out.Total > 0 {
			t.bb = ch.s.pool.Get(int(c.Out.Total))
			t.cmd.Data = t.bb.B
			if c.Out.External() {
				ch.fetchTable(t, &t.out)
			} else {
				ch.fetch(t, &t.out, nil)
			}
			return
		}
	case c.In.Format != srp.FmtNone && c.In.Total > 0:
		t.bb = ch.s.pool.Get(int(c.In.Total))
		t.cmd.Data = t.bb.B
		if c.In.External() {
			ch.fetchTable(t, &t.in) // executes once the table is in
			return
		}
	}
	ch.submit(t)
}

// fetchTable reads an indirect descriptor table that did not fit in the
// IU from initiator memory (SRP r16a: the table descriptor).
func (ch *channel) fetchTable(t *task, b *srp.Buffer) {
	t.table = ch.s.pool.Get(int(b.Table.Len))
	if err := ch.mapSink(t, t.table.B); err != nil {
		ch.fail(t, scsi.InvalidFieldInIU())
		return
	}
	t.wr = rdma.SendWR{ID: ch.id(t, kindTable), Op: rdma.OpRead, Sink: t.mr, Length: len(t.table.B),
		RemoteSTag: b.Table.Key, RemoteTO: b.Table.VA}
	err := ch.qp.PostSend(&t.wr)
	if err != nil {
		ch.giveUp(t)
	}
}

func (ch *channel) tableFetched(t *task) {
	t.mr.Invalidate()
	if t.write {
		ch.fetch(t, &t.out, t.table.B)
		return
	}
	// Data-in: the table says where RDMA Writes go (place).
	if descSum(t.table.B) != uint64(len(t.bb.B)) {
		ch.fail(t, scsi.InvalidFieldInIU())
		return
	}
	ch.fetched(t)
}

func descSum(list []byte) uint64 {
	var sum uint64
	for i := 0; i < len(list)/srp.DirectLen; i++ {
		sum += uint64(srp.DescAt(list, i).Len)
	}
	return sum
}

func (ch *channel) mapSink(t *task, buf []byte) error {
	if t.mr == nil {
		mr, err := ch.s.opts.PD.AllocMR()
		if err != nil {
			return err
		}
		t.mr = mr
	}
	_, err := t.mr.Map(buf, 0, rdma.LocalWrite)
	return err
}

// fetch posts the RDMA Reads of a task's data-out, one per descriptor;
// the last one is signaled. list is the whole descriptor table when it
// had to be fetched, else nil (the descriptors are in the IU).
func (ch *channel) fetch(t *task, b *srp.Buffer, list []byte) {
	n := b.InIU()
	desc := b.Desc
	if list != nil {
		n = len(list) / srp.DirectLen
		desc = func(i int) srp.Desc { return srp.DescAt(list, i) }
	}
	var sum uint64
	for i := 0; i < n; i++ {
		sum += uint64(desc(i).Len)
	}
	if sum != uint64(len(t.bb.B)) { // checked for in-IU lists by the codec, here for fetched ones
		ch.fail(t, scsi.InvalidFieldInIU())
		return
	}
	if err := ch.mapSink(t, t.bb.B); err != nil {
		ch.fail(t, scsi.InvalidFieldInIU())
		return
	}
	last := -1
	for i := 0; i < n; i++ {
		if desc(i).Len > 0 {
			last = i
		}
	}
	off := 0
	for i := 0; i <= last; i++ {
		d := desc(i)
		if d.Len == 0 {
			continue
		}
		t.wr = rdma.SendWR{ID: ch.id(t, kindRead), Op: rdma.OpRead, Sink: t.mr, SinkTO: uint64(off),
			Length: int(d.Len), RemoteSTag: d.Key, RemoteTO: d.VA, Unsignaled: i != last}
		err := ch.qp.PostSend(&t.wr)
		if err != nil {
			ch.giveUp(t)
			return
		}
		off += int(d.Len)
	}
}

// fetched: the task's data-out is in (its last RDMA Read completed).
func (ch *channel) fetched(t *task) {
	t.mr.Invalidate()
	ch.mu.Lock()
	aborted := t.aborted || ch.closing
	ch.mu.Unlock()
	if aborted {
		ch.release(t)
		return
	}
	ch.submit(t)
}

// submit hands a task whose data is in to its LU's queue (the execution
// model SRP shares with iSCSI, scsitarget.LU.Submit); a full queue
// answers it TASK SET FULL.
func (ch *channel) submit(t *task) {
	if !ch.s.opts.Device.Submit(&t.cmd, t) {
		ch.taskSetFull(t)
	}
}

// Run implements blockcore.Work.
func (t *task) Run() { t.ch.execute(t) }

// execute runs the command in the SCSI core and answers it.
func (ch *channel) execute(t *task) {
	if !t.cmd.Aborted() {
		ch.s.opts.Device.Execute(&t.cmd)
	}
	ch.mu.Lock()
	aborted := t.aborted || ch.closing
	ch.mu.Unlock()
	if aborted || !t.cmd.Commit() {
		ch.release(t)
		return
	}
	ch.respond(t)
}

// respond places data-in with RDMA Writes and sends SRP_RSP after them.
func (ch *channel) respond(t *task) {
	cmd := &t.cmd
	r := srp.Rsp{Tag: t.tag, Status: cmd.Status}
	xfer := uint32(cmd.Transfer)
	want := t.out.Total
	if !t.write {
		want = t.in.Total
	}
	var res uint32
	var over, under bool
	switch {
	case xfer < want:
		under, res = true, want-xfer
	case xfer > want:
		over, res = true, xfer-want
	}
	if t.write && cmd.Status != scsi.StatusGood && xfer == 0 {
		over, under, res = false, false, 0
	}
	switch {
	case t.write && under:
		r.Flags, r.DataOutRes = srp.DataOutUnder, res
	case t.write && over:
		r.Flags, r.DataOutRes = srp.DataOutOver, res
	case !t.write && under:
		r.Flags, r.DataInRes = srp.DataInUnder, res
	case !t.write && over:
		r.Flags, r.DataInRes = srp.DataInOver, res
	}
	if cmd.SenseLen > 0 {
		r.Sense = cmd.SenseData()
	}
	if !t.write && cmd.Status == scsi.StatusGood && t.bb != nil {
		n := min(xfer, t.in.Total)
		if !ch.place(t, t.bb.B[:n]) {
			ch.giveUp(t)
			return
		}
	}
	ch.send(t, &r, cmd.Status == scsi.StatusGood)
}

// place posts the RDMA Writes of data-in into the initiator's descriptors.
func (ch *channel) place(t *task, data []byte) bool {
	b := &t.in
	n, desc := b.InIU(), b.Desc
	if b.External() {
		list := t.table.B // fetched before execution
		n, desc = len(list)/srp.DirectLen, func(i int) srp.Desc { return srp.DescAt(list, i) }
	}
	for i := 0; i < n && len(data) > 0; i++ {
		d := desc(i)
		k := min(int(d.Len), len(data))
		if k == 0 {
			continue
		}
		t.sg[0] = data[:k]
		t.wr = rdma.SendWR{ID: ch.id(t, kindWrite), Op: rdma.OpWrite, SG: t.sg[:],
			RemoteSTag: d.Key, RemoteTO: d.VA, Unsignaled: true}
		if err := ch.qp.PostSend(&t.wr); err != nil {
			return false
		}
		data = data[k:]
	}
	return true
}

// send posts the task's SRP_RSP, returning its receive buffer and every
// credit earned since the last response (completed later in release).
func (ch *channel) send(t *task, r *srp.Rsp, good bool) {
	ch.repost(t.slot, true)
	t.slot = -1
	r.ReqLimDelta = ch.delta.Swap(0)
	r.SolNT = (good && t.sol&srp.SolSuccess != 0) || (!good && t.sol&srp.SolFailure != 0)
	b := r.Append(t.rsp[:0])
	t.sg[0] = b
	t.wr = rdma.SendWR{ID: ch.id(t, kindRsp), Op: rdma.OpSend, Solicited: r.SolNT, SG: t.sg[:]}
	err := ch.qp.PostSend(&t.wr)
	if err != nil {
		ch.delta.Add(r.ReqLimDelta)
		ch.release(t)
	}
}

// fail answers a task with CHECK CONDITION (completion goroutine or an
// executing one).
func (ch *channel) fail(t *task, s *scsi.Sense) {
	t.cmd.Status = scsi.StatusCheckCondition
	b := s.AppendFixed(t.cmd.Sense[:0])
	t.cmd.SenseLen = len(b)
	r := srp.Rsp{Tag: t.tag, Status: scsi.StatusCheckCondition, Sense: t.cmd.SenseData()}
	ch.send(t, &r, false)
}

// full answers TASK SET FULL: the command's buffer would exceed the I/O
// budget (blockcore.IOBudget); the initiator retries it later.
func (ch *channel) full(t *task, n int64) {
	if k := ch.fulls.Add(1); logsample.KeepFirst(k, 8) {
		ch.log.Warn("srp: TASK SET FULL: the nexus holds its share of the I/O buffer budget (or the node all of it)",
			"held", ch.nx.io.Held(), "want", n, "used", ch.s.opts.Budget.Used(), "io_budget", ch.s.opts.Budget.Total(), "count", k)
	}
	ch.taskSetFull(t)
}

// taskSetFull answers a command TASK SET FULL (SAM-5 §5.3.3).
func (ch *channel) taskSetFull(t *task) {
	t.cmd.Status = scsi.StatusTaskSetFull
	r := srp.Rsp{Tag: t.tag, Status: scsi.StatusTaskSetFull}
	ch.send(t, &r, false)
}

// giveUp ends a task whose work requests could not be posted. On a
// channel going down it ends without an answer; on a live one the device
// could not move the data (a kernel device whose registered memory is
// spent: a buffer outside it needs a bounce from it), and the command is
// answered TASK SET FULL, which the initiator retries — an unanswered
// command only ends in its abort and reset, and the disk offline.
func (ch *channel) giveUp(t *task) {
	ch.mu.Lock()
	down := ch.closing || ch.qp.Err() != nil
	if down {
		t.aborted = true
	}
	ch.mu.Unlock()
	if down {
		ch.release(t)
		return
	}
	if k := ch.fulls.Add(1); logsample.KeepFirst(k, 8) {
		ch.log.Warn("srp: TASK SET FULL: the RDMA device could not move a command's data (its registered memory spent?)", "count", k)
	}
	ch.taskSetFull(t)
}

// release ends a task: out of the task set, buffers back, receive buffer
// reposted (its credit returned by a CRED_REQ if no response is coming).
func (ch *channel) release(t *task) {
	ch.mu.Lock()
	if t.done {
		ch.mu.Unlock()
		return
	}
	t.done = true
	if ch.byTag[t.tag] == t {
		delete(ch.byTag, t.tag)
	}
	ch.mu.Unlock()
	if t.begun {
		ch.s.opts.Device.End(&t.cmd)
		t.begun = false
	}
	if t.mr != nil {
		t.mr.Invalidate()
	}
	if t.bb != nil {
		ch.s.pool.Put(t.bb)
		t.bb = nil
	}
	if t.charged > 0 {
		ch.nx.io.Give(t.charged)
		t.charged = 0
	}
	if t.table != nil {
		ch.s.pool.Put(t.table)
		t.table = nil
	}
	unanswered := t.slot >= 0
	if unanswered {
		ch.repost(t.slot, true)
		t.slot = -1
	}
	t.cmd = scsitarget.Command{}
	t.iu = nil
	ch.mu.Lock()
	ch.free = append(ch.free, t.idx)
	ch.live--
	idle := ch.live == 0 && !ch.closing
	ch.mu.Unlock()
	if unanswered && idle {
		ch.grantCredits()
	}
}

// grantCredits returns credits no response will carry with SRP_CRED_REQ
// (SRP r16a: the target may send it at any time).
func (ch *channel) grantCredits() {
	d := ch.delta.Swap(0)
	if d == 0 {
		return
	}
	ch.mu.Lock()
	ch.credReqs++
	cr := srp.CredReq{ReqLimDelta: d}
	b := cr.Append(ch.credBuf[:0])
	ch.mu.Unlock()
	if err := ch.qp.PostSend(&rdma.SendWR{ID: kindCtl, Op: rdma.OpSend, SG: [][]byte{b}}); err != nil {
		ch.delta.Add(d)
	}
}

// taskMgmt runs an SRP_TSK_MGMT (SAM-5 §7) and answers it with the
// function's response code in 4 bytes of response data.
func (ch *channel) taskMgmt(t *task) {
	var m srp.TskMgmt
	if err := m.Decode(t.iu); err != nil {
		ch.release(t)
		ch.logout(srp.LogoutInvalidIULength, err)
		return
	}
	t.tag, t.sol = m.Tag, m.SolNT
	go func() {
		var lunField [8]byte
		binary.BigEndian.PutUint64(lunField[:], m.LUN)
		lun, lerr := scsi.DecodeLUN(lunField)
		dev := ch.s.opts.Device
		var res scsitarget.TMFResult
		code := byte(srp.TMFComplete)
		switch {
		case m.Function == srp.TMFClearACA:
			code = srp.TMFNotSupported
		case lerr != nil:
			code = srp.TMFIncorrectLUN
		case m.Function == srp.TMFAbortTask:
			res = dev.AbortTask(ch.nx.n, lun, m.TaskTag)
		case m.Function == srp.TMFAbortTaskSet:
			res = dev.AbortTaskSet(ch.nx.n, lun)
		case m.Function == srp.TMFClearTaskSet:
			res = dev.ClearTaskSet(ch.nx.n, lun)
		case m.Function == srp.TMFLUNReset:
			res = dev.ResetLU(ch.nx.n, lun)
		default:
			code = srp.TMFNotSupported
		}
		switch res {
		case scsitarget.TMFNoSuchLUN:
			code = srp.TMFIncorrectLUN
		case scsitarget.TMFRejected:
			code = srp.TMFFailed
		}
		// TMFNoSuchTask: the task already ended, which is FUNCTION
		// COMPLETE for ABORT TASK (SAM-5 §7.2).
		// The first few of a channel, then one in 1024: an initiator
		// sending them in a loop does not flood the log.
		if n := ch.tmfs.Add(1); logsample.Keep(n) {
			ch.log.Info("srp: task management", "function", fmt.Sprintf("%#02x", m.Function), "lun", m.LUN,
				"task", m.TaskTag, "response", code, "count", n)
		}
		ch.mu.Lock()
		closing := ch.closing
		ch.mu.Unlock()
		if closing {
			ch.release(t)
			return
		}
		r := srp.Rsp{Tag: m.Tag, RespData: []byte{0, 0, 0, code}}
		ch.send(t, &r, code == srp.TMFComplete)
	}()
}
