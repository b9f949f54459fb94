package scsitarget

import (
	"errors"
	"sync/atomic"
	"syscall"
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
// durable once a flush lost them.
func TestFailedFlushLatches(t *testing.T) {
	m, err := mem.New(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	be := &flakyFlush{Disk: m}
	d, n := devOn(t, LUConfig{Backend: be})
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

// countingFlush counts the backend's flushes.
type countingFlush struct {
	*mem.Disk
	n atomic.Int32
}

func (c *countingFlush) Flush() error { c.n.Add(1); return nil }

// TestWriteThrough: a LU configured without a write cache reports WCE 0
// in the caching mode page and flushes every write before answering it;
// with the cache on, only FUA writes flush.
func TestWriteThrough(t *testing.T) {
	for _, wt := range []bool{false, true} {
		m, err := mem.New(8 << 20)
		if err != nil {
			t.Fatal(err)
		}
		be := &countingFlush{Disk: m}
		d, n := devOn(t, LUConfig{Backend: be, WriteThrough: wt})
		// MODE SENSE(6), caching page (08h): WCE is bit 2 of its byte 2.
		page := make([]byte, 64)
		good(t, run(d, n, []byte{scsi.OpModeSense6, 0x08, 0x08, 0, 64, 0}, page))
		if wce := page[4+2]&0x04 != 0; wce == wt {
			t.Errorf("write-through %v: WCE %v", wt, wce)
		}
		good(t, run(d, n, []byte{scsi.OpWrite10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, make([]byte, 512)))
		want := int32(0)
		if wt {
			want = 1
		}
		if got := be.n.Load(); got != want {
			t.Errorf("write-through %v: %d flushes after a plain write, want %d", wt, got, want)
		}
		good(t, run(d, n, []byte{scsi.OpWrite10, 0x08, 0, 0, 0, 0, 0, 0, 1, 0}, make([]byte, 512)))
		if got := be.n.Load(); got != want+1 {
			t.Errorf("write-through %v: %d flushes after a FUA write, want %d", wt, got, want+1)
		}
	}
}

// devOn is a device with one LU of cfg and a nexus past its power-on unit
// attention.
func devOn(t *testing.T, cfg LUConfig) (*Device, *Nexus) {
	t.Helper()
	d := NewDevice("iqn.2026-11.org.blockwire:test", nil)
	lu, err := NewLU(d.Name(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.AddLU(lu)
	n := &Nexus{InitiatorPort: "iqn.a,i,0x1", TargetPort: "t,0x1"}
	d.AddNexus(n)
	clearUA(t, d, n)
	return d, n
}

// durableDisk is a memory backend with a durable write of its own
// (backend.DurableWriter, as a file's RWF_DSYNC write), which counts its
// calls and can fail.
type durableDisk struct {
	*mem.Disk
	flushes, durable atomic.Int32
	fail             atomic.Pointer[error]
}

func (d *durableDisk) Flush() error { d.flushes.Add(1); return nil }

func (d *durableDisk) WriteAtDurable(p []byte, off int64) (int, error) {
	d.durable.Add(1)
	if e := d.fail.Load(); e != nil {
		return 0, *e
	}
	return d.WriteAt(p, off)
}

// TestFUAIsADurableWrite: where the backend writes durably by itself, a
// FUA write (or any write with the write cache off) is that write alone
// — no flush of everything else after it; a plain write is not. A failed
// durable write latches like a failed flush, except out of space (no
// sync ran).
func TestFUAIsADurableWrite(t *testing.T) {
	m, err := mem.New(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	be := &durableDisk{Disk: m}
	d, n := devOn(t, LUConfig{Backend: be})
	write10 := func(fua bool, lba byte) []byte {
		c := []byte{scsi.OpWrite10, 0, 0, 0, 0, lba, 0, 0, 1, 0}
		if fua {
			c[1] = 0x08
		}
		return c
	}
	data := []byte("durable!")
	data = append(data, make([]byte, 504)...)
	good(t, run(d, n, write10(false, 1), make([]byte, 512)))
	good(t, run(d, n, write10(true, 2), data))
	if be.durable.Load() != 1 || be.flushes.Load() != 0 {
		t.Fatalf("after a plain and a FUA write: %d durable writes, %d flushes; want 1, 0", be.durable.Load(), be.flushes.Load())
	}
	got := make([]byte, 512)
	be.ReadAt(got, 2*512)
	if string(got[:8]) != "durable!" {
		t.Fatalf("the FUA write's data is not there: %q", got[:8])
	}

	nospc := error(syscall.ENOSPC)
	be.fail.Store(&nospc)
	if s := sense(t, run(d, n, write10(true, 3), data)); s.Key != scsi.SenseMediumError {
		t.Fatalf("durable write out of space: sense %v", s)
	}
	be.fail.Store(nil)
	good(t, run(d, n, write10(false, 3), data)) // not latched

	eio := error(syscall.EIO)
	be.fail.Store(&eio)
	if s := sense(t, run(d, n, write10(true, 4), data)); s.Key != scsi.SenseMediumError {
		t.Fatalf("failed durable write: sense %v", s)
	}
	be.fail.Store(nil)
	if s := sense(t, run(d, n, write10(false, 5), data)); s.Key != scsi.SenseMediumError || s.ASC != 0x0c {
		t.Fatalf("write after a failed durable write: sense %v, want MEDIUM ERROR / WRITE ERROR (latched)", s)
	}
}
