package iscsitarget

import (
	"sync"
	"sync/atomic"
)

// inflight counts a connection's admitted tasks. Wait returns once the
// count has reached zero. Unlike a sync.WaitGroup, tasks may be added
// while another goroutine waits: the receive goroutine keeps admitting
// commands while Shutdown (drainAndClose) or a Logout for the session or
// another connection waits for the connection to drain — a WaitGroup
// forbids that (Add from zero concurrent with Wait), and the race
// detector caught it under the torture run (test/torture).
//
// mu is a leaf lock: nothing is taken under it. Done takes it only when
// someone waits: a Wait counts itself in nwait before it reads n, and
// Done reads nwait after it brought n to zero, so (atomics being
// sequentially consistent) either Wait sees the zero or Done sees the
// waiter — the common case, no waiter, stays two atomic operations.
type inflight struct {
	n       atomic.Int64
	nwait   atomic.Int32
	mu      sync.Mutex
	waiters []chan struct{} // closed at the next zero
}

// Add counts one more task.
func (f *inflight) Add() { f.n.Add(1) }

// Done counts a task out; at zero it wakes the waiters.
func (f *inflight) Done() {
	if f.n.Add(-1) != 0 || f.nwait.Load() == 0 {
		return
	}
	f.mu.Lock()
	if f.n.Load() != 0 {
		// Added again meanwhile: that task's Done wakes them.
		f.mu.Unlock()
		return
	}
	ws := f.waiters
	f.waiters = nil
	f.nwait.Add(-int32(len(ws)))
	f.mu.Unlock()
	for _, w := range ws {
		close(w)
	}
}

// Wait returns when no task is counted, or at the next zero.
func (f *inflight) Wait() {
	f.mu.Lock()
	f.nwait.Add(1)
	if f.n.Load() == 0 {
		f.nwait.Add(-1)
		f.mu.Unlock()
		return
	}
	w := make(chan struct{})
	f.waiters = append(f.waiters, w)
	f.mu.Unlock()
	<-w
}
