package scsitarget

import "github.com/blockwire/blockwire/blockcore"

// Submit queues w for the LU's workers (blockcore.Queue.Submit). It
// reports false when the queue is full: the fabric then answers the
// command TASK SET FULL (SAM-5 §5.3.3) and the initiator retries it later.
func (lu *LU) Submit(w blockcore.Work) bool { return lu.q.Submit(w) }

// Detach, called from a Work's Run, says that its command now only waits
// for its answer to be taken by the fabric's peer (blockcore.Queue.Detach).
func (lu *LU) Detach() bool { return lu.q.Detach() }

// Detached is how many of the LU's answers wait for their peers (between
// Detach and Reattach).
func (lu *LU) Detached() int { return lu.q.Detached() }

// Reattach ends a Detach.
func (lu *LU) Reattach() { lu.q.Reattach() }

// Submit hands a command's work to the queue of the LU it addresses; a
// command for no LU (its answer is an error the core gives at once) runs
// on the caller's goroutine. It reports false when the LU's queue is full.
func (d *Device) Submit(cmd *Command, w blockcore.Work) bool {
	if lu := cmd.LU(); lu != nil {
		return lu.Submit(w)
	}
	w.Run()
	return true
}
