package scsitarget

import (
	"sync"
	"sync/atomic"
)

// Work is a command ready to run: a fabric's task, which executes its
// Command in the core (Device.Execute) and answers it. Both fabrics, iSCSI
// (and iSER) and SRP, hand their commands to the LU's queue as Work: one
// execution model, one bound.
type Work interface{ Run() }

// The queue's defaults (LUConfig.Workers, LUConfig.QueueDepth).
const (
	// DefaultWorkers run an LU's commands. A worker holds a command from
	// execution to the end of its answer; while the answer waits for the
	// peer (a socket write, an iSER Send's completion) the worker is
	// detached (LU.Detach) and another one takes its place. Workers are
	// what a backend that may block (a file, a remote LUN, RBD) needs.
	DefaultWorkers = 64
	// DefaultQueueDepth bounds the commands waiting for a worker.
	DefaultQueueDepth = 2048
	// detachedPerWorker bounds the detached workers of an LU: 16 per
	// worker, and minDetached at least (8 KiB of stack each, at least),
	// beyond which Detach refuses and a worker stays counted. The
	// fabrics bound what one host holds of it (iSCSI: 256 commands on
	// workers per address), so no LU has fewer than minDetached.
	detachedPerWorker = 16
	minDetached       = 1024
)

// queue is an LU's bounded queue of commands and its workers (started with
// the first command, stopped by Close after the queue drains).
//
// Workers that are detached (LU.Detach: their command only waits for its
// answer to be taken by the fabric's peer) do not count: the queue keeps
// up to workers attached ones, starting another when a command waits and
// no attached worker is idle, and a worker left over once a detached one
// is back ends. So a peer that stops taking its answers holds goroutines
// (at most maxDetached), not the LU's workers. The counts are atomics,
// read without a lock: a race can start one worker too many (it ends
// after its command) or leave one missing (the next Submit or Detach
// starts it).
type queue struct {
	once    sync.Once
	workers int32 // attached workers wanted
	work    chan Work
	// mu orders Submit (read side) against Close (write side): after
	// Close no command enters work, so the workers can drain it and go.
	mu     sync.RWMutex
	closed bool
	quit   chan struct{}

	live        atomic.Int32 // worker goroutines
	idle        atomic.Int32 // of those, waiting for a command
	detached    atomic.Int32 // commands between Detach and Reattach
	maxDetached int32
}

func (q *queue) init(workers, depth int) {
	q.workers = int32(workers)
	q.maxDetached = int32(max(workers*detachedPerWorker, minDetached))
	q.work = make(chan Work, depth)
	q.quit = make(chan struct{})
}

func (q *queue) start() {
	q.live.Add(q.workers)
	for range q.workers {
		go q.worker()
	}
}

func (q *queue) worker() {
	for {
		if q.surplus() {
			return
		}
		q.idle.Add(1)
		select {
		case w := <-q.work:
			q.idle.Add(-1)
			// More waiting and nobody idle: a Detach or Submit that
			// saw this worker idle left them to it.
			q.grow()
			w.Run()
		case <-q.quit:
			q.idle.Add(-1)
			q.live.Add(-1)
			for {
				select {
				case w := <-q.work:
					w.Run()
				default:
					return
				}
			}
		}
	}
}

// surplus reports whether the calling worker ends, one attached worker
// too many (a detached one is back, or a race started an extra one), and
// counts it out.
func (q *queue) surplus() bool {
	for {
		l := q.live.Load()
		if l-q.detached.Load() <= q.workers {
			return false
		}
		if q.live.CompareAndSwap(l, l-1) {
			return true
		}
	}
}

// grow starts a worker when a command waits, no worker is idle, fewer
// than workers are attached and the goroutines stay within bounds.
func (q *queue) grow() {
	for len(q.work) > 0 && q.idle.Load() == 0 {
		l := q.live.Load()
		if l-q.detached.Load() >= q.workers || l >= q.workers+q.maxDetached {
			return
		}
		if q.live.CompareAndSwap(l, l+1) {
			go q.worker()
			return
		}
	}
}

// Submit queues w for the LU's workers. It reports false when the queue is
// full (LUConfig.QueueDepth commands wait already): the fabric then
// answers the command TASK SET FULL (SAM-5 §5.3.3) and the initiator
// retries it later. After Close, w runs on a goroutine of its own.
func (lu *LU) Submit(w Work) bool {
	q := &lu.q
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.closed {
		go w.Run()
		return true
	}
	q.once.Do(q.start)
	select {
	case q.work <- w:
		q.grow()
		return true
	default:
		return false
	}
}

// Detach, called from a Work's Run, says that its command is done with the
// backend and now only waits for its answer to be taken by the fabric's
// peer (a socket write, an RDMA Send's completion), which a peer that
// stops taking answers can make last until its connection times out. The
// worker is counted out of the LU's workers, and another one starts if a
// command waits for it. Reattach follows when the wait is over. Detach
// reports false, and nothing is to be undone, when the LU has its maximum
// of detached workers (16 per worker): the worker stays counted.
func (lu *LU) Detach() bool {
	q := &lu.q
	if q.detached.Add(1) > q.maxDetached {
		q.detached.Add(-1)
		return false
	}
	q.grow()
	return true
}

// Detached is how many of the LU's answers wait for their peers (between
// Detach and Reattach).
func (lu *LU) Detached() int { return int(lu.q.detached.Load()) }

// Reattach ends a Detach: the worker counts again (a worker left over
// ends after its command).
func (lu *LU) Reattach() { lu.q.detached.Add(-1) }

// close stops the workers once the commands already queued have run.
func (q *queue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.closed = true
		close(q.quit)
	}
}

// Submit hands a command's work to the queue of the LU it addresses; a
// command for no LU (its answer is an error the core gives at once) runs
// on the caller's goroutine. It reports false when the LU's queue is full.
func (d *Device) Submit(cmd *Command, w Work) bool {
	if lu := cmd.LU(); lu != nil {
		return lu.Submit(w)
	}
	w.Run()
	return true
}
