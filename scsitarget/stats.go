package scsitarget

import (
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/blockwire/blockwire/scsi"
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

// Stats counts what a logical unit did, for exporters that read it at
// scrape time (package metrics): atomic adds on the I/O path, nothing
// else.
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
}

// Stats returns the logical unit's counters.
func (lu *LU) Stats() *Stats { return &lu.stats }

// classOf sorts a command into read, write or other.
func classOf(op byte) int {
	switch op {
	case scsi.OpRead6, scsi.OpRead10, scsi.OpRead12, scsi.OpRead16:
		return ClassRead
	case scsi.OpWrite6, scsi.OpWrite10, scsi.OpWrite12, scsi.OpWrite16:
		return ClassWrite
	}
	return ClassOther
}

// record counts a finished command.
func (s *Stats) record(c *Command, d time.Duration) {
	cl := c.class
	s.Commands[cl].Add(1)
	switch c.Status {
	case scsi.StatusGood:
		if cl != ClassOther {
			s.Bytes[cl].Add(uint64(min(c.Transfer, len(c.Data))))
		}
	case scsi.StatusCheckCondition:
		key := 0
		if c.SenseLen > 2 {
			switch c.Sense[0] & 0x7f {
			case 0x70, 0x71:
				key = int(c.Sense[2] & 0x0f)
			case 0x72, 0x73:
				key = int(c.Sense[1] & 0x0f)
			}
		}
		s.CheckConditions[key].Add(1)
	case scsi.StatusReservationConflict:
		s.Conflicts.Add(1)
	case scsi.StatusBusy, scsi.StatusTaskSetFull:
		s.Busy.Add(1)
	}
	s.Latency[cl][latencyBucket(d)].Add(1)
	s.LatencySum[cl].Add(uint64(d))
}
