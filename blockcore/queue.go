package blockcore

import (
	"sync"
	"sync/atomic"
)

// Work is a command ready to run: a front end's task, which executes its
// command and answers it. Every front end (iSCSI and iSER, SRP, NVMe)
// hands its commands to the unit's queue as Work: one execution model,
// one bound.
type Work interface{ Run() }

// The queue's defaults.
const (
	// DefaultWorkers run a unit's commands. A worker holds a command from
	// execution to the end of its answer; while the answer waits for the
	// peer (a socket write, an RDMA Send's completion) the worker is
	// detached (Queue.Detach) and another one takes its place. Workers
	// are what a backend that may block (a file, a remote LUN, RBD) needs.
	DefaultWorkers = 64
	// DefaultQueueDepth bounds the commands waiting for a worker.
	DefaultQueueDepth = 2048
	// DetachedPerWorker bounds the detached workers of a queue: 16 per
	// worker, and MinDetached at least (8 KiB of stack each, at least),
	// beyond which Detach refuses and a worker stays counted. The front
	// ends bound what one host holds of it (iSCSI: 256 commands on
	// workers per address), so no unit has fewer than MinDetached.
	DetachedPerWorker = 16
	MinDetached       = 1024
)

// Queue is a unit's bounded queue of commands and its workers (started
// with the first command, stopped by Close after the queue drains).
//
// Workers that are detached (Detach: their command only waits for its
// answer to be taken by the front end's peer) do not count: the queue
// keeps up to workers attached ones, starting another when a command
// waits and no attached worker is idle, and a worker left over once a
// detached one is back ends. So a peer that stops taking its answers
// holds goroutines (at most maxDetached), not the unit's workers. The
// counts are atomics, read without a lock: a race can start one worker
// too many (it ends after its command) or leave one missing (the next
// Submit or Detach starts it).
type Queue struct {
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

// NewQueue returns a queue of workers workers holding up to depth
// commands waiting for them (0: the defaults).
func NewQueue(workers, depth int) *Queue {
	if workers <= 0 {
		workers = DefaultWorkers
	}
	if depth <= 0 {
		depth = DefaultQueueDepth
	}
	return &Queue{workers: int32(workers), maxDetached: int32(max(workers*DetachedPerWorker, MinDetached)),
		work: make(chan Work, depth), quit: make(chan struct{})}
}

func (q *Queue) start() {
	q.live.Add(q.workers)
	for range q.workers {
		go q.worker()
	}
}

func (q *Queue) worker() {
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
func (q *Queue) surplus() bool {
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

func (q *Queue) grow() {
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

// Submit queues w for the workers. It reports false when the queue is
// full (depth commands wait already): the front end then answers the
// command with its protocol's "busy, retry" (SCSI TASK SET FULL, SAM-5
// §5.3.3). After Close, w runs on a goroutine of its own.
func (q *Queue) Submit(w Work) bool {
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

// Detach, called from a Work's Run, says that its command is done with
// the backend and now only waits for its answer to be taken by the front
// end's peer (a socket write, an RDMA Send's completion), which a peer
// that stops taking answers can make last until its connection times out.
// The worker is counted out of the queue's workers, and another one
// starts if a command waits for it. Reattach follows when the wait is
// over. Detach reports false, and nothing is to be undone, when the queue
// has its maximum of detached workers (16 per worker): the worker stays
// counted.
func (q *Queue) Detach() bool {
	if q.detached.Add(1) > q.maxDetached {
		q.detached.Add(-1)
		return false
	}
	q.grow()
	return true
}

// Reattach ends a Detach: the worker counts again (a worker left over
// ends after its command).
func (q *Queue) Reattach() { q.detached.Add(-1) }

// Detached is how many answers wait for their peers (between Detach and
// Reattach).
func (q *Queue) Detached() int { return int(q.detached.Load()) }

// Live is how many worker goroutines run, idle or not; Waiting how many
// commands wait for one.
func (q *Queue) Live() int    { return int(q.live.Load()) }
func (q *Queue) Waiting() int { return len(q.work) }

// Close stops the workers once the commands already queued have run.
func (q *Queue) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.closed = true
		close(q.quit)
	}
}
