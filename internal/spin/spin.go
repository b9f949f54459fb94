// Package spin is the polling time of a receiver that, finding its socket
// empty, reads it again without blocking for a while before it sleeps in
// Go's network poller (serve --poll): what lands meanwhile is read
// without the wake-up a sleeping core takes. The iSCSI/TCP reader
// (datamover/tcp) and the software RoCEv2 device's receiver (rdma/roce)
// share it.
package spin

import "time"

// Budget is the polling time of one wait for data. The zero Budget, or
// one of no time, never polls.
//
// It reads the monotonic clock once per empty read, against an epoch
// taken at New (time.Now reads the clock twice, wall and monotonic: a
// receiver that polls makes many empty reads).
type Budget struct {
	d       time.Duration
	epoch   time.Time
	until   time.Duration // since epoch; 0: the wait has not found the socket empty yet
	polling bool          // the last Again said to poll again
}

// New returns a Budget of d per wait.
func New(d time.Duration) Budget { return Budget{d: d, epoch: time.Now()} }

// Start begins a wait.
func (b *Budget) Start() { b.until, b.polling = 0, false }

// Again reports, after a read found the socket empty, whether the
// receiver should poll again (yielding first) rather than sleep: the
// first empty read of a wait starts its time.
func (b *Budget) Again() bool {
	if b.d <= 0 {
		return false
	}
	now := time.Since(b.epoch) + 1 // never 0, the unset until
	if b.until == 0 {
		b.until = now + b.d
	}
	b.polling = now < b.until
	return b.polling
}

// Polled reports whether a read that found data found it while polling:
// it followed an Again of this wait that said to poll again.
func (b *Budget) Polled() bool { return b.polling }
