package scsitarget

import (
	"sync"
	"time"
)

// writeGate holds, on a LU whose reservations several gateways share,
// the writes that passed their reservation check and have not ended, by
// the epoch of the state they were checked against. When another gateway
// changes the state — a PREEMPT AND ABORT among others — the watch
// callback moves the epoch and waits for the writes of the one before it
// ended, and only then is the change acknowledged. So when the gateway
// that made the change answers, no write checked here against the old
// state is still to land: SPC-4 (PERSISTENT RESERVE OUT, PREEMPT AND
// ABORT) has the preempted nexuses' tasks end, on every port of the LU,
// before the preemption completes. The gateway that preempts ends its own
// with abortMatching.
//
// A write enters after its check, not before: the check takes the
// state's lock, which the gateway's own change holds while it waits for
// the others' acknowledgements — a callback waiting for a write waiting
// for that lock would make two gateways changing the state at once wait
// on each other. A write whose epoch moved between its check and its
// entry is checked again.
//
// Lock order: mu is a leaf; nothing is called under it.
type writeGate struct {
	mu      sync.Mutex
	epoch   uint64
	n       [2]int           // writes in, by the parity of their epoch
	drained [2]chan struct{} // closed when n[k] falls to 0, for settle
}

// settleWait bounds how long a gateway holds another's change back for
// its writes (backend/rbd's notify gives up at 5 s: past that the change
// stands unacknowledged).
const settleWait = 4 * time.Second

func (g *writeGate) current() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.epoch
}

// enter counts a write checked in epoch e, unless the epoch has moved
// since (false: check it again).
func (g *writeGate) enter(e uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.epoch != e {
		return false
	}
	g.n[e&1]++
	return true
}

// leave ends a write that entered in epoch e.
func (g *writeGate) leave(e uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := e & 1
	g.n[k]--
	if g.n[k] == 0 && g.drained[k] != nil {
		close(g.drained[k])
		g.drained[k] = nil
	}
}

// settle moves the epoch and waits up to d for the writes of the one
// before to end; it reports whether they did. Calls are not concurrent
// (one watch delivers the changes in turn); writes of an epoch whose wait
// gave up are waited for again by the next settle of that parity.
func (g *writeGate) settle(d time.Duration) bool {
	g.mu.Lock()
	k := g.epoch & 1
	g.epoch++
	if g.n[k] == 0 {
		g.mu.Unlock()
		return true
	}
	ch := g.drained[k]
	if ch == nil {
		ch = make(chan struct{})
		g.drained[k] = ch
	}
	g.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}
