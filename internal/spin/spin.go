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
type Budget struct {
	d     time.Duration
	until time.Time // zero: the wait has not found the socket empty yet
}

// New returns a Budget of d per wait.
func New(d time.Duration) Budget { return Budget{d: d} }

// Start begins a wait.
func (b *Budget) Start() { b.until = time.Time{} }

// Again reports, after a read found the socket empty, whether the
// receiver should poll again (yielding first) rather than sleep: the
// first empty read of a wait starts its time.
func (b *Budget) Again() bool {
	if b.d <= 0 {
		return false
	}
	now := time.Now()
	if b.until.IsZero() {
		b.until = now.Add(b.d)
	}
	return now.Before(b.until)
}

// Polled reports whether a read that found data now found it while
// polling: after an empty read of this wait, within its time.
func (b *Budget) Polled() bool { return !b.until.IsZero() && time.Now().Before(b.until) }
