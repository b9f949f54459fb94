// Task management functions (RFC 7143 §11.5, §11.6): ABORT TASK and its
// kin, run off the receiver and bounded.

package iscsitarget

import (
	"fmt"
	"slices"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/internal/logsample"
	"github.com/blockwire/blockwire/internal/serial"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/scsi"
	"github.com/blockwire/blockwire/scsitarget"
)

type tmfDelivery struct {
	c   *conn
	req pdu.TaskMgmtReq
}

func (d *tmfDelivery) drop()  {}
func (d *tmfDelivery) enter() {}

// act runs the function on a goroutine of its own (it waits for the
// affected tasks to end, and the receiver reads on meanwhile), or, at the
// connection's bound, answers "Function rejected" (RFC 7143 §11.6.1).
func (d *tmfDelivery) act() {
	var no pdu.BHS
	(&pdu.TaskMgmtResp{ITT: d.req.ITT, Response: pdu.TMFRespRejected}).Encode(&no)
	d.c.goBounded("task management function", func() { d.c.taskManagement(d.req) }, &no)
}

// goBounded runs fn, a task management function or a Logout, on a
// goroutine of its own, at most maxBackground of them at once on the
// connection; beyond that it sends refusal, the request's answer saying
// so, at once, from the goroutine that delivers the request (the
// receiver, mostly). So a peer that sends them faster than they end, or
// never reads their answers, makes the connection hold no more than the
// bound (TestBackgroundRequestFloodIsBounded); what it holds then is the
// receiver, in that send, as for a NOP-Out.
func (c *conn) goBounded(what string, fn func(), refusal *pdu.BHS) {
	if c.background.Add(1) > maxBackground {
		c.background.Add(-1)
		if n := c.refusedBG.Add(1); logsample.Keep(n) {
			c.log.Warn(what+" refused: too many running on the connection", "itt", fmt.Sprintf("%#x", refusal.ITT()),
				"running", maxBackground, "refused", n)
		}
		c.send(refusal, nil, true)
		return
	}
	go func() {
		defer func() {
			if c.background.Add(-1) == 0 && c.ending.Load() {
				select {
				case c.bgIdle <- struct{}{}:
				default:
				}
			}
		}()
		fn()
	}()
}

// awaitBackground returns once the task management functions and Logouts
// the connection started (goBounded) have ended. A connection is over —
// for Shutdown, and for the sessions that come after it — only when
// nothing it asked for still acts: a LOGICAL UNIT RESET it sent may wait
// for other sessions' I/O, and would otherwise go on after its connection
// ended, aborting commands of sessions logged in since
// (TestConnectionEndsAfterItsTaskManagement). Call it once the receiver
// has returned.
func (c *conn) awaitBackground() {
	c.ending.Store(true)
	if c.background.Load() > 0 {
		<-c.bgIdle
	}
}

// maxBackground bounds the task management functions and Logouts running
// at once on one connection. Linux's initiator sends one task management
// function at a time (its error handler holds the session's), and each
// ends when the tasks it affects have.
const maxBackground = 32

func (c *conn) handleTMF(p *datamover.PDU) error {
	var req pdu.TaskMgmtReq
	if err := req.Decode(&p.BHS); err != nil {
		return asReject(err)
	}
	c.sess.sequence(req.CmdSN, req.Immediate, &tmfDelivery{c: c, req: req})
	return nil
}

// taskManagement runs one task management function (RFC 7143 §11.5) and
// answers only after the affected tasks have really ended.
func (c *conn) taskManagement(req pdu.TaskMgmtReq) {
	ss := c.sess
	dev := ss.tgt.Device
	resp := pdu.TaskMgmtResp{ITT: req.ITT, Response: pdu.TMFRespComplete}
	lun, lunErr := scsi.DecodeLUN(req.LUN)
	mapRes := func(r scsitarget.TMFResult) byte {
		switch r {
		case scsitarget.TMFNoSuchTask:
			return pdu.TMFRespNoTask
		case scsitarget.TMFNoSuchLUN:
			return pdu.TMFRespNoLUN
		case scsitarget.TMFRejected:
			return pdu.TMFRespRejected
		}
		return pdu.TMFRespComplete
	}
	needLUN := func() bool {
		// The LUN as the initiator sees it, through its nexus's map.
		if lunErr != nil || dev.LUFor(ss.nexus, lun) == nil {
			resp.Response = pdu.TMFRespNoLUN
			return false
		}
		return true
	}
	cold := false
	switch req.Function {
	case pdu.TMFAbortTask:
		if !needLUN() {
			break
		}
		t := c.findTask(req.RTT)
		switch {
		case t != nil:
			resp.Response = mapRes(dev.AbortTask(ss.nexus, lun, uint64(req.RTT)))
			if resp.Response == pdu.TMFRespNoTask && c.abortLocal(t) {
				// It was still waiting for its CmdSN, outside the task set.
				resp.Response = pdu.TMFRespComplete
			}
		case serial.InWindow(req.RefCmdSN, ss.expCmdSN.Load(), ss.maxCmdSN.Load()):
			// RFC 7143 §11.5.1 (b): the referenced command has not arrived;
			// the target considers it received and reports completion.
			resp.Response = pdu.TMFRespComplete
		default:
			resp.Response = pdu.TMFRespNoTask
		}
	case pdu.TMFAbortTaskSet:
		if needLUN() {
			resp.Response = mapRes(dev.AbortTaskSet(ss.nexus, lun))
		}
	case pdu.TMFClearTaskSet:
		if needLUN() {
			resp.Response = mapRes(dev.ClearTaskSet(ss.nexus, lun))
		}
	case pdu.TMFLUReset:
		if needLUN() {
			resp.Response = mapRes(dev.ResetLU(ss.nexus, lun))
		}
	case pdu.TMFTargetWarmReset, pdu.TMFTargetColdReset:
		// Every LU and every initiator of the target: only an initiator
		// allowed it may (LIO refuses likewise unless its ACL says so),
		// by the target's rules as they are now, not at login.
		if t := c.srv.target(ss.targetName); t == nil || !t.AnyTargetReset && !slices.Contains(t.TargetResets, ss.initiator) {
			resp.Response = pdu.TMFRespAuthFailed
			break
		}
		dev.ResetTarget()
		cold = req.Function == pdu.TMFTargetColdReset
	case pdu.TMFClearACA:
		resp.Response = pdu.TMFRespNotSupported
	case pdu.TMFTaskReassign:
		// RFC 7143 §11.5.1: reassignment needs ErrorRecoveryLevel 2.
		resp.Response = pdu.TMFRespNoReassign
	default:
		resp.Response = pdu.TMFRespRejected
	}
	// The first few of a connection, then one in 1024: a peer sending
	// them in a loop does not flood the log.
	if n := c.tmfs.Add(1); logsample.Keep(n) {
		c.log.Info("task management", "function", req.Function, "lun", lun, "rtt", fmt.Sprintf("%#x", req.RTT),
			"response", resp.Response, "count", n)
	}
	var all []*session
	if cold {
		// RFC 7143 §11.5.1: after a target cold reset the target drops all
		// its connections. From the response on, no command is taken on
		// them: one the initiator sends before the drop reaches it would
		// run on the old nexus and be lost with it.
		c.srv.mu.Lock()
		for _, s2 := range c.srv.sessions {
			if s2.tgt == ss.tgt {
				all = append(all, s2)
			}
		}
		c.srv.mu.Unlock()
		for _, s2 := range all {
			for _, o := range s2.connList() {
				o.mu.Lock()
				o.draining = true
				o.mu.Unlock()
			}
		}
	}
	var h pdu.BHS
	resp.Encode(&h)
	c.send(&h, nil, true)
	for _, s2 := range all {
		s2.close("target cold reset")
	}
}
