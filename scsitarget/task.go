package scsitarget

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/blockwire/blockwire/scsi"
)

// Command is one SCSI task as the fabric hands it to the core, and its
// outcome. Fabrics keep Commands in pools; the core never retains one after
// End.
type Command struct {
	Nexus *Nexus
	LUN   uint64
	// Tag is the fabric's task tag (iSCSI ITT, SRP tag), used by ABORT TASK.
	Tag uint64
	CDB []byte
	// Data is the data-out payload for commands that carry one, or the
	// buffer the core fills for data-in. Its length is the fabric's expected
	// data transfer length.
	Data []byte
	// OnAbort, if set, is called once (from any goroutine) when a task
	// management function aborts the task, so the fabric can stop moving its
	// data. It must not block.
	OnAbort func()

	// Outcome, valid after Execute.
	Status byte
	// Transfer is the number of bytes the command wanted to move according
	// to its CDB (the SCSI transfer length). For data-in, min(Transfer,
	// len(Data)) bytes of Data are valid; the difference is the residual.
	Transfer int
	SenseLen int
	Sense    [scsi.DescriptorLen + 8]byte

	lu         *LU
	prev, next *Command
	state      atomic.Int32 // taskActive, taskAborted or taskCommitted
	abortWG    *sync.WaitGroup
	begun      bool
	start      time.Duration // Begin, on the LU's clock (lu.since), for the latency in Stats
	class      int           // ClassRead, ClassWrite or ClassOther, at Begin
}

const (
	taskActive int32 = iota
	taskAborted
	taskCommitted
)

// Aborted reports whether a task management function aborted the task; the
// fabric then sends no response for it.
func (c *Command) Aborted() bool { return c.state.Load() == taskAborted }

// Commit is called by the fabric just before it sends the command's
// response. It reports false when the task was aborted first (no response
// may be sent); after it returns true the task can no longer be aborted,
// and an ABORT TASK for it reports that the task does not exist — so an
// initiator never sees both a response and "function complete" for one
// task (SAM-5 §7.2).
func (c *Command) Commit() bool {
	return c.state.CompareAndSwap(taskActive, taskCommitted) || c.state.Load() == taskCommitted
}

// LU is the logical unit the command was entered into by Begin (nil for a
// LUN that does not exist).
func (c *Command) LU() *LU { return c.lu }

// SenseData returns the sense bytes of a CHECK CONDITION.
func (c *Command) SenseData() []byte { return c.Sense[:c.SenseLen] }

// Begin enters the command into its LU's task set. It must be called when
// the fabric accepts the command (before its data arrives) and paired with
// End. Commands for LUNs that do not exist are not entered.
func (d *Device) Begin(c *Command) {
	lu := d.LUFor(c.Nexus, c.LUN)
	if lu == nil {
		return
	}
	c.lu = lu
	c.begun = true
	c.start = lu.since()
	// The class now: a fabric may reuse the CDB's memory before End (SRP
	// reposts the receive buffer once the response is out).
	c.class = ClassOther
	if len(c.CDB) > 0 {
		c.class = classOf(c.CDB[0])
	}
	lu.taskMu.Lock()
	c.next = lu.tasks
	c.prev = nil
	if lu.tasks != nil {
		lu.tasks.prev = c
	}
	lu.tasks = c
	lu.inTasks.Add(1)
	lu.taskMu.Unlock()
}

// InProgress is how many commands are in the LU's task set: arrived and
// not ended — waiting for their data, for a worker or for the storage,
// or answered and waiting for the initiator to take the answer. A figure
// that stays high while commands complete slowly is storage that stalls.
func (lu *LU) InProgress() int { return int(lu.inTasks.Load()) }

// End removes the command from its task set; an abort waiting for it is
// released.
func (d *Device) End(c *Command) {
	if !c.begun {
		return
	}
	lu := c.lu
	lu.taskMu.Lock()
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		lu.tasks = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	}
	c.prev, c.next = nil, nil
	lu.inTasks.Add(-1)
	wg := c.abortWG
	c.abortWG = nil
	c.begun = false
	lu.taskMu.Unlock()
	if !c.Aborted() {
		d := lu.since() - c.start
		recordStats(lu.unit.Stats(), c, d)
		if c.Nexus != nil {
			recordStats(&c.Nexus.stats, c, d)
		}
	}
	if wg != nil {
		wg.Done()
	}
}

// abortMatching marks every task in the LU's task set that match selects as
// aborted, calls their OnAbort hooks and returns a WaitGroup that is done
// when all of them have ended. except (may be nil) is left alone.
func (lu *LU) abortMatching(match func(*Command) bool, except *Command) *sync.WaitGroup {
	wg, _ := lu.abortCount(match, except)
	return wg
}

// abortCount is abortMatching that also reports how many tasks it aborted.
func (lu *LU) abortCount(match func(*Command) bool, except *Command) (*sync.WaitGroup, int) {
	wg := new(sync.WaitGroup)
	n := 0
	var hooks []func()
	lu.taskMu.Lock()
	for c := lu.tasks; c != nil; c = c.next {
		if c == except || !match(c) || !c.state.CompareAndSwap(taskActive, taskAborted) {
			// Already aborted, or its response is on its way.
			continue
		}
		wg.Add(1)
		n++
		c.abortWG = wg
		if c.OnAbort != nil {
			hooks = append(hooks, c.OnAbort)
		}
	}
	lu.taskMu.Unlock()
	for _, h := range hooks {
		h()
	}
	return wg, n
}

// TMF results (SAM-5 §7.1 service responses, mapped by the fabric).
type TMFResult int

const (
	TMFComplete TMFResult = iota
	TMFNoSuchTask
	TMFNoSuchLUN
	TMFRejected
)

// AbortTask aborts the task with tag from nexus n on lun (SAM-5 §7.2) and
// waits until it has ended. It reports TMFNoSuchTask when the task is not in
// the task set (already completed).
func (d *Device) AbortTask(n *Nexus, lun uint64, tag uint64) TMFResult {
	lu := d.LUFor(n, lun)
	if lu == nil {
		return TMFNoSuchLUN
	}
	// A task whose response is already committed is not found: it has
	// completed as far as the initiator can tell.
	wg, found := lu.abortCount(func(c *Command) bool { return c.Nexus == n && c.Tag == tag }, nil)
	wg.Wait()
	if found == 0 {
		return TMFNoSuchTask
	}
	return TMFComplete
}

// AbortTaskSet aborts every task of nexus n on lun (SAM-5 §7.3). except,
// the fabric's own TMF task if it is a Command, is left alone.
func (d *Device) AbortTaskSet(n *Nexus, lun uint64) TMFResult {
	lu := d.LUFor(n, lun)
	if lu == nil {
		return TMFNoSuchLUN
	}
	lu.abortMatching(func(c *Command) bool { return c.Nexus == n }, nil).Wait()
	return TMFComplete
}

// ClearTaskSet aborts every task on lun from every nexus (SAM-5 §7.4, one
// shared task set); the other nexuses get COMMANDS CLEARED BY ANOTHER
// INITIATOR.
func (d *Device) ClearTaskSet(n *Nexus, lun uint64) TMFResult {
	lu := d.LUFor(n, lun)
	if lu == nil {
		return TMFNoSuchLUN
	}
	lu.abortMatching(func(*Command) bool { return true }, nil).Wait()
	d.forEachNexus(func(o *Nexus) {
		if o != n {
			o.addUA(lu.lun, scsi.UACommandsCleared())
		}
	})
	return TMFComplete
}

// ResetLU performs a logical unit reset (SAM-5 §7.7): every task is
// aborted, the LU returns to its default state and every nexus (including
// n's, per SAM-5 §6.3.2) gets BUS DEVICE RESET FUNCTION OCCURRED.
func (d *Device) ResetLU(n *Nexus, lun uint64) TMFResult {
	lu := d.LUFor(n, lun)
	if lu == nil {
		return TMFNoSuchLUN
	}
	lu.abortMatching(func(*Command) bool { return true }, nil).Wait()
	lu.reset()
	d.forEachNexus(func(o *Nexus) { o.addUA(lu.lun, scsi.UALUReset()) })
	if lu.pr.shared != nil {
		// The other targets on the same storage report it too.
		if err := lu.prChange(func(p *prState) error { p.resets++; return nil }); err != nil {
			d.log.Warn("logical unit reset not recorded for the other targets", "lun", lu.lun, "err", err)
		}
	}
	return TMFComplete
}

// ResetTarget performs a target reset (warm or cold): every LU is reset and
// every nexus gets POWER ON, RESET, OR BUS DEVICE RESET OCCURRED.
func (d *Device) ResetTarget() {
	luns := d.LUNs()
	for _, l := range luns {
		if lu := d.LU(l); lu != nil {
			lu.abortMatching(func(*Command) bool { return true }, nil).Wait()
			lu.reset()
		}
	}
	d.forEachNexus(func(o *Nexus) {
		for _, l := range luns {
			o.addUA(l, scsi.UAPowerOnReset())
		}
	})
}
