package scsitarget

import (
	"errors"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/blockcore"
)

// heldWrites is storage whose writes wait until released.
type heldWrites struct {
	*mem.Disk
	arrived chan struct{}
	release chan struct{}
}

func (h *heldWrites) WriteAt(p []byte, off int64) (int, error) {
	h.arrived <- struct{}{}
	<-h.release
	return h.Disk.WriteAt(p, off)
}

// TestPreemptAndAbortFencesNVMeWrites: an NVMe host's write admitted
// under its registration and still running when another host preempts
// and aborts that registration ends before the preemption completes —
// a fenced host's write never lands after its fence — and its next write
// is refused. The same state answers READ KEYS-style status for both
// fabrics' registrants.
func TestPreemptAndAbortFencesNVMeWrites(t *testing.T) {
	disk, _ := mem.New(1 << 20)
	h := &heldWrites{Disk: disk, arrived: make(chan struct{}), release: make(chan struct{})}
	d := NewDevice("iqn.2026-11.org.blockwire:fence", nil)
	lu, err := NewLU(d.Name(), LUConfig{Backend: h})
	if err != nil {
		t.Fatal(err)
	}
	d.AddLU(lu)
	r := lu.Unit().Reservations()
	const a, b = "nvme-host:0a", "nvme-host:0b"
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(r.Register(b, blockcore.RegisterKey, 0, 0xb, false, 0))
	must(r.Acquire(b, blockcore.Acquire, blockcore.WriteExclusiveRegistrantsOnly, 0xb, 0))
	must(r.Register(a, blockcore.RegisterKey, 0, 0xa, false, 0))

	wrote := make(chan time.Time, 1)
	go func() {
		ok, ticket := r.Admit(a, true)
		if !ok {
			wrote <- time.Time{}
			return
		}
		lu.Unit().Store().Write(make([]byte, 512), 0, false)
		ended := time.Now() // before Done: the preemption may go on at once after it
		r.Done(ticket)
		wrote <- ended
	}()
	<-h.arrived // the write is in the storage
	preempted := make(chan time.Time, 1)
	go func() {
		must(r.Acquire(b, blockcore.PreemptAndAbort, blockcore.WriteExclusiveRegistrantsOnly, 0xb, 0xa))
		preempted <- time.Now()
	}()
	select {
	case <-preempted:
		t.Fatal("the preemption completed while the preempted host's write was still running")
	case <-time.After(100 * time.Millisecond):
	}
	close(h.release)
	w, p := <-wrote, <-preempted
	if w.IsZero() {
		t.Fatal("the registrant's write was refused before the preemption")
	}
	if p.Before(w) {
		t.Fatalf("the preemption completed at %v, before the write it fenced ended at %v", p, w)
	}
	if ok, _ := r.Admit(a, true); ok {
		t.Fatal("the preempted host's next write was admitted")
	}
	if ok, ticket := r.Admit(b, true); !ok {
		t.Fatal("the holder's write was refused")
	} else {
		r.Done(ticket)
	}
	st := r.Status()
	if st.Type != blockcore.WriteExclusiveRegistrantsOnly || len(st.Registrants) != 1 || st.Registrants[0].Name != b || !st.Registrants[0].Holder {
		t.Fatalf("status %+v: want b alone, holding", st)
	}
	if err := r.Acquire(a, blockcore.Acquire, blockcore.WriteExclusive, 0xa, 0); !errors.Is(err, blockcore.ErrReservationConflict) {
		t.Fatalf("the preempted host acquires: %v, want a conflict", err)
	}
}
