package scsitarget

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/scsi"
)

// flakyFlush is a memory backend whose next Flush fails once, as an
// fdatasync does after the kernel dropped dirty pages it could not write
// back (the error is reported once; a later fdatasync succeeds although
// the data is gone).
type flakyFlush struct {
	*mem.Disk
	failNext atomic.Bool
}

func (f *flakyFlush) Flush() error {
	if f.failNext.Swap(false) {
		return errors.New("fdatasync: input/output error")
	}
	return nil
}

// TestFailedFlushLatches: after one failed SYNCHRONIZE CACHE, later ones
// and every write fail too (MEDIUM ERROR, WRITE ERROR) until the LU is
// built anew — an initiator must never be told its earlier writes are
// durable once a flush lost them (issue 20).
func TestFailedFlushLatches(t *testing.T) {
	m, err := mem.New(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	be := &flakyFlush{Disk: m}
	d := NewDevice("iqn.2026-11.org.blockwire:test", nil)
	lu, err := NewLU(d.Name(), LUConfig{Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	d.AddLU(lu)
	n := &Nexus{InitiatorPort: "iqn.a,i,0x1", TargetPort: "t,0x1"}
	d.AddNexus(n)
	clearUA(t, d, n)
	sync10 := []byte{scsi.OpSynchronizeCache10, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	write10 := []byte{scsi.OpWrite10, 0, 0, 0, 0, 0, 0, 0, 1, 0}
	good(t, run(d, n, write10, make([]byte, 512)))
	be.failNext.Store(true)
	if s := sense(t, run(d, n, sync10, nil)); s.Key != scsi.SenseMediumError {
		t.Fatalf("failed flush: sense %v", s)
	}
	// The backend's next flush would succeed: the LU must not say so.
	if s := sense(t, run(d, n, sync10, nil)); s.Key != scsi.SenseMediumError {
		t.Fatalf("flush after a lost flush: sense %v, want MEDIUM ERROR", s)
	}
	s := sense(t, run(d, n, write10, make([]byte, 512)))
	if s.Key != scsi.SenseMediumError || s.ASC != 0x0c {
		t.Fatalf("write after a lost flush: sense %v, want MEDIUM ERROR / WRITE ERROR", s)
	}
	// Reads still work: the data that is there can be copied off.
	good(t, run(d, n, []byte{scsi.OpRead10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, make([]byte, 512)))
}
