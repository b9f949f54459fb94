package scsitarget

import (
	"time"

	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/scsi"
)

// Command classes counted by Stats.
const (
	ClassRead  = blockcore.ClassRead
	ClassWrite = blockcore.ClassWrite
	ClassOther = blockcore.ClassOther
	NumClasses = blockcore.NumClasses
)

// Stats counts what a logical unit, or a nexus, did: the block core's
// counters (the unit's are shared with the NVMe front end).
type Stats = blockcore.Stats

// LatencyBounds returns the upper bounds of Stats' latency buckets.
func LatencyBounds() []time.Duration { return blockcore.LatencyBounds() }

// Stats returns the logical unit's counters.
func (lu *LU) Stats() *Stats { return lu.unit.Stats() }

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

// recordStats counts a finished command in s.
func recordStats(s *Stats, c *Command, d time.Duration) {
	cl := c.class
	n := 0
	switch c.Status {
	case scsi.StatusGood:
		n = min(c.Transfer, len(c.Data))
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
	s.Count(cl, n, d)
}
