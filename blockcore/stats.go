package blockcore

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// Command classes counted by Stats.
const (
	ClassRead = iota
	ClassWrite
	ClassOther
	NumClasses
)

// The latency histogram's buckets: bucket i counts durations up to
// 50 µs × 2^i (50 µs to 1.6 s); the last counts everything slower.
const (
	latencyBase    = 50 * time.Microsecond
	latencyBuckets = 16
)

// LatencyBounds returns the upper bounds of Stats' latency buckets; the
// bucket after the last bound counts everything slower.
func LatencyBounds() []time.Duration {
	b := make([]time.Duration, latencyBuckets)
	for i := range b {
		b[i] = latencyBase << i
	}
	return b
}

// latencyBucket is the bucket of d.
func latencyBucket(d time.Duration) int {
	if d <= latencyBase {
		return 0
	}
	return min(bits.Len64(uint64((d-1)/latencyBase)), latencyBuckets)
}

// Stats counts what a unit, or one session or controller of it, did, for
// exporters that read it at scrape time (package metrics): atomic adds on
// the I/O path, nothing else. Every front end counts into its unit's (one
// set for a unit served over SCSI and NVMe at once) and its session's.
type Stats struct {
	// Commands, by class (ClassRead, ClassWrite, ClassOther).
	Commands [NumClasses]atomic.Uint64
	// Bytes moved by reads and by writes.
	Bytes [2]atomic.Uint64
	// Latency from Begin to End, per class: bucket counts (the last is
	// beyond every bound) and the sum in nanoseconds.
	Latency    [NumClasses][latencyBuckets + 1]atomic.Uint64
	LatencySum [NumClasses]atomic.Uint64
	// CheckConditions by sense key; Conflicts are RESERVATION CONFLICT,
	// Busy are BUSY and TASK SET FULL.
	CheckConditions [16]atomic.Uint64
	Conflicts       atomic.Uint64
	Busy            atomic.Uint64
	// Failed are commands of a front end without sense keys (NVMe) that
	// ended with an error other than a reservation conflict.
	Failed atomic.Uint64
}

// CountStatus counts a finished command of a front end without sense
// keys (NVMe) as Count does, and its failure: a reservation conflict
// (Conflicts) or any other (Failed).
func (s *Stats) CountStatus(cl, n int, d time.Duration, conflict, failed bool) {
	switch {
	case conflict:
		s.Conflicts.Add(1)
	case failed:
		s.Failed.Add(1)
	}
	s.Count(cl, n, d)
}

// Count counts one finished command of class cl that moved n bytes (0
// for a failed read or write) and took d.
func (s *Stats) Count(cl, n int, d time.Duration) {
	s.Commands[cl].Add(1)
	if n > 0 && cl != ClassOther {
		s.Bytes[cl].Add(uint64(n))
	}
	s.Latency[cl][latencyBucket(d)].Add(1)
	s.LatencySum[cl].Add(uint64(d))
}
