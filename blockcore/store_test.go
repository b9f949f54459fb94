package blockcore

import (
	"errors"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/internal/waitfor"
)

// recorder is a memory backend that counts its flushes and durable
// writes and fails them when told to.
type recorder struct {
	*mem.Disk
	flushes, durables int
	flushErr, durErr  error
}

func (r *recorder) Flush() error { r.flushes++; return r.flushErr }

// durableRecorder also writes durably in one step (RWF_DSYNC).
type durableRecorder struct{ *recorder }

func (r durableRecorder) WriteAtDurable(p []byte, off int64) (int, error) {
	r.durables++
	if r.durErr != nil {
		return 0, r.durErr
	}
	return r.WriteAt(p, off)
}

func newRecorder(t *testing.T) *recorder {
	d, err := mem.New(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	return &recorder{Disk: d}
}

var quiet = slog.New(slog.DiscardHandler)

// TestDurableWrites: a durable write is the backend's durable write where
// it has one, else a write and a flush; a plain write flushes nothing.
func TestDurableWrites(t *testing.T) {
	r := newRecorder(t)
	s := NewStore(r, true, quiet)
	if err := s.WriteAt([]byte("a"), 0, false); err != nil || r.flushes != 0 {
		t.Fatalf("plain write: %v, %d flushes", err, r.flushes)
	}
	if err := s.WriteAt([]byte("b"), 0, true); err != nil || r.flushes != 1 {
		t.Fatalf("durable write without WriteAtDurable: %v, %d flushes, want 1", err, r.flushes)
	}
	dr := durableRecorder{newRecorder(t)}
	s = NewStore(dr, true, quiet)
	if err := s.WriteAt([]byte("c"), 0, true); err != nil || dr.durables != 1 || dr.flushes != 0 {
		t.Fatalf("durable write with WriteAtDurable: %v, %d durable writes, %d flushes", err, dr.durables, dr.flushes)
	}
	var _ backend.DurableWriter = dr
}

// TestFlushLatch: a failed flush latches — later flushes and durable
// writes fail without reaching the backend's flush — except a failure the
// backend calls unavailable (nothing said lost), and a durable write
// refused for want of space (nothing written, no sync ran).
func TestFlushLatch(t *testing.T) {
	dr := durableRecorder{newRecorder(t)}
	s := NewStore(dr, true, quiet)
	dr.durErr = syscall.ENOSPC
	if err := s.WriteAt([]byte("x"), 0, true); !errors.Is(err, syscall.ENOSPC) || s.Latched() != nil {
		t.Fatalf("ENOSPC: %v, latched %v", err, s.Latched())
	}
	dr.durErr, dr.flushErr = nil, backend.ErrUnavailable
	if err := s.Flush(); !errors.Is(err, backend.ErrUnavailable) || s.Latched() != nil {
		t.Fatalf("unavailable: %v, latched %v", err, s.Latched())
	}
	dr.flushErr = syscall.EIO
	if err := s.Flush(); !errors.Is(err, syscall.EIO) || s.Latched() == nil {
		t.Fatalf("EIO: %v, latched %v", err, s.Latched())
	}
	dr.flushErr = nil
	before := dr.flushes
	if err := s.Flush(); err == nil || dr.flushes != before {
		t.Fatalf("a flush after a failed one: %v, reached the backend %d times", err, dr.flushes-before)
	}
	r := newRecorder(t)
	s = NewStore(r, true, quiet)
	r.flushErr = syscall.EIO
	s.Flush()
	r.flushErr = nil
	if err := s.WriteAt([]byte("y"), 0, true); err == nil {
		t.Fatal("a durable write after a failed flush succeeded")
	}
}

// TestExclusive: a write waits while a compare-and-write holds the store.
// (Not on a synctest clock: a goroutine waiting on a mutex is not what a
// bubble counts as blocked.)
func TestExclusive(t *testing.T) {
	s := NewStore(newRecorder(t), true, quiet)
	release := s.Exclusive()
	done := make(chan error, 1)
	go func() { done <- s.WriteAt([]byte("z"), 0, false) }()
	if waitfor.Within(50*time.Millisecond, func() bool { return len(done) > 0 }) {
		t.Fatal("a write went on under Exclusive")
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestWriteCache: with the cache off every write is durable; turning it
// off flushes and says it changed; a reset brings back the initial state.
func TestWriteCache(t *testing.T) {
	r := newRecorder(t)
	s := NewStore(r, true, quiet)
	if err := s.Write([]byte("a"), 0, false); err != nil || r.flushes != 0 {
		t.Fatalf("a cached write: %v, %d flushes", err, r.flushes)
	}
	if err := s.Write([]byte("a"), 0, true); err != nil || r.flushes != 1 {
		t.Fatalf("a FUA write: %v, %d flushes, want 1", err, r.flushes)
	}
	if changed, err := s.SetWriteCache(false); !changed || err != nil || r.flushes != 2 {
		t.Fatalf("cache off: changed %v, %v, %d flushes (want the cache flushed)", changed, err, r.flushes)
	}
	if changed, _ := s.SetWriteCache(false); changed {
		t.Fatal("turning off a cache already off reported a change")
	}
	if err := s.Write([]byte("b"), 0, false); err != nil || r.flushes != 4 || s.WriteCache() {
		t.Fatalf("a write with the cache off: %v, %d flushes, want durable", err, r.flushes)
	}
	s.ResetWriteCache()
	if !s.WriteCache() || !s.InitialWriteCache() {
		t.Fatal("reset did not bring the cache back on")
	}
}

// TestCompareAndWrite: the data is written only when the blocks match,
// a mismatch names the first differing byte and writes nothing, a
// durable one is flushed.
func TestCompareAndWrite(t *testing.T) {
	r := newRecorder(t)
	s := NewStore(r, true, quiet)
	old, neu := make([]byte, 1024), make([]byte, 1024)
	for i := range neu {
		neu[i] = byte(i)
	}
	if _, err := s.CompareAndWrite(old, neu, 512, false); err != nil || r.flushes != 0 {
		t.Fatalf("a matching compare: %v, %d flushes", err, r.flushes)
	}
	got := make([]byte, 1024)
	r.ReadAt(got, 512)
	if string(got) != string(neu) {
		t.Fatal("the data was not written")
	}
	wrong := append([]byte(nil), neu...)
	wrong[700] ^= 1
	var mis *backend.MiscompareError
	if _, err := s.CompareAndWrite(wrong, old, 512, true); !errors.As(err, &mis) || mis.Offset != 700 {
		t.Fatalf("a mismatch: %v, want a miscompare at 700", err)
	}
	r.ReadAt(got, 512)
	if string(got) != string(neu) || r.flushes != 0 {
		t.Fatalf("a mismatch wrote (%v) or flushed (%d)", string(got) != string(neu), r.flushes)
	}
	if _, err := s.CompareAndWrite(neu, old, 512, true); err != nil || r.flushes != 1 {
		t.Fatalf("a durable compare and write: %v, %d flushes", err, r.flushes)
	}
}
