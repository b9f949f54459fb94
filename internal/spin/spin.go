// Package spin is the polling time of a receiver that, finding its socket
// empty, reads it again without blocking for a while before it sleeps in
// Go's network poller (serve --poll): what lands meanwhile is read
// without the wake-up a sleeping core takes. The iSCSI/TCP reader
// (datamover/tcp) and the software RoCEv2 device's receiver (rdma/roce)
// share it, and so does an I/O alone on an io_uring (internal/uring),
// polling the ring's completion queue rather than a socket.
//
// The time adapts, within the configured most, to how long the peer
// takes to send again, by the rule of KVM's halt polling (halt_poll_ns),
// restated: a wait that polling would have bridged, had it polled
// longer (it slept, and the data came within the most), doubles the
// time; an idle wait, longer than the most and than a millisecond,
// halves it, down to none; a wait the polling bridged leaves it as it
// is. So a peer that answers in 150 µs gets 160 µs of polling from a
// most of 1 ms (a fixed 50 µs missed it every time: the target slept,
// and paid the wake-up, I/O after I/O), and a connection used now and
// then costs no polling at all. The millisecond keeps a small most (50
// µs) polling for a peer that answers within a millisecond but mostly
// beyond the most, as it polled before it adapted: halved on every such
// wait, the time fell to none and caught nothing (4 KiB reads at QD 1,
// 4.3-5.8k IOPS against 8.3-8.9k).
package spin

import "time"

const (
	// growStart is the first time polling gets after none, and the
	// least it keeps when halved (KVM's halt_poll_ns_grow_start).
	growStart = 10 * time.Microsecond
	// idleAfter is the least wait that counts as idleness, whatever the
	// most (at most 1ms, as serve's --poll).
	idleAfter = time.Millisecond
)

// Budget is the polling time of one wait for data. The zero Budget, or
// one of no time, never polls. It is not safe for concurrent use: one
// receiver owns it.
//
// It reads the monotonic clock once per empty read, against an epoch
// taken at New (time.Now reads the clock twice, wall and monotonic: a
// receiver that polls makes many empty reads).
type Budget struct {
	most  time.Duration // configured: the longest polling of one wait
	cur   time.Duration // the polling of the next wait, in [0, most]
	epoch time.Time
	clock func() time.Duration // nil: since epoch (tests set it)

	began   time.Duration // since epoch: the wait's first empty read; 0: none yet
	polling bool          // the last Again said to poll again
}

// New returns a Budget of at most d per wait, starting at d.
func New(d time.Duration) Budget {
	return Budget{most: max(d, 0), cur: max(d, 0), epoch: time.Now()}
}

// now is the time since epoch, never 0 (the unset began).
func (b *Budget) now() time.Duration {
	if b.clock != nil {
		return b.clock()
	}
	return time.Since(b.epoch) + 1
}

// Start begins a wait.
func (b *Budget) Start() { b.began, b.polling = 0, false }

// Again reports, after a read found the socket empty, whether the
// receiver should poll again (yielding first) rather than sleep: the
// first empty read of a wait starts its time.
func (b *Budget) Again() bool {
	if b.most <= 0 {
		return false
	}
	now := b.now()
	if b.began == 0 {
		b.began = now
	}
	b.polling = now-b.began < b.cur
	return b.polling
}

// Polled reports whether a read that found data found it while polling:
// it followed an Again of this wait that said to poll again.
func (b *Budget) Polled() bool { return b.polling }

// Woke tells the budget that the wait ended with data after the receiver
// slept (an Again of the wait said not to poll again): it adapts the
// polling of the waits to come to how long this one took.
func (b *Budget) Woke() {
	if b.most <= 0 || b.began == 0 {
		return
	}
	took := b.now() - b.began
	switch {
	case took > max(b.most, idleAfter):
		// The peer was idle: polling wasted its time; halve it, to
		// none below the start.
		b.cur /= 2
		if b.cur < growStart {
			b.cur = 0
		}
	case took > b.cur:
		// Polling a while longer would have caught it.
		b.cur = min(b.most, max(2*b.cur, growStart))
	}
}

// Current is the polling time the next wait gets.
func (b *Budget) Current() time.Duration { return b.cur }
