package blockcore

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/blockwire/blockwire/backend"
)

// Store is a unit's backend as every front end writes to it: a write made
// durable when the front end asks (SCSI's FUA or a disabled write cache,
// NVMe's FUA or a volatile write cache turned off) — by the backend's
// durable write where it has one (RWF_DSYNC), else by a flush after it —
// the flush latch, and the lock that makes a compare-and-write atomic
// against every other write. What a failure is called on the wire (a
// sense, a status) is the front end's.
type Store struct {
	be      backend.Backend
	flusher backend.Flusher       // nil: nothing to flush
	durable backend.DurableWriter // nil: a durable write is a write and a flush
	log     *slog.Logger
	attrs   []any // what the log names the unit by

	// cache is the volatile write cache's state as the front ends see
	// it (SCSI's WCE, NVMe's Volatile Write Cache feature): off, every
	// write is durable before it is acknowledged. initial is its state
	// after a reset.
	cache   atomic.Bool
	initial bool

	// writes is held shared by every write and exclusively by what must
	// be atomic against them (compare-and-write, a read-modify-write, a
	// sanitize).
	writes sync.RWMutex
	// latched is the first failed flush: once the storage said writes it
	// had acknowledged may be lost, no later flush or write may succeed (a
	// second fdatasync returns 0 although the pages are gone). It clears
	// only when the store is built anew (the unit re-added, reloaded,
	// restarted): an operator's act.
	latched atomic.Pointer[error]
}

// NewStore returns be's store, its write cache on or off; log (with attrs
// naming the unit) receives its failures.
func NewStore(be backend.Backend, writeCache bool, log *slog.Logger, attrs ...any) *Store {
	s := &Store{be: be, log: log, attrs: attrs, initial: writeCache}
	s.cache.Store(writeCache)
	s.flusher, _ = be.(backend.Flusher)
	s.durable, _ = be.(backend.DurableWriter)
	return s
}

// WriteCache reports whether the write cache is on; with it off, every
// write is durable before it returns.
func (s *Store) WriteCache() bool { return s.cache.Load() }

// SetWriteCache turns the write cache on or off and reports whether that
// changed it; turned off, what it held is flushed.
func (s *Store) SetWriteCache(on bool) (changed bool, err error) {
	changed = s.cache.Swap(on) != on
	if !on {
		err = s.Flush()
	}
	return changed, err
}

// ResetWriteCache puts the write cache back as the store was built with.
func (s *Store) ResetWriteCache() { s.cache.Store(s.initial) }

// InitialWriteCache is the write cache's state after a reset.
func (s *Store) InitialWriteCache() bool { return s.initial }

// Write writes p at off as a front end's write command does: durably
// before it returns when the command asks (fua) or the write cache is off.
func (s *Store) Write(p []byte, off int64, fua bool) error {
	return s.WriteAt(p, off, fua || !s.cache.Load())
}

// WriteAt writes p at off, durably before it returns when durable is
// set, holding off compare-and-writes (Exclusive) meanwhile. A failed
// durable write or flush latches (Latched), except a write that failed
// for want of space: nothing was written, so no sync ran and none failed.
func (s *Store) WriteAt(p []byte, off int64, durable bool) error {
	if durable && s.durable != nil {
		s.writes.RLock()
		_, err := s.durable.WriteAtDurable(p, off)
		s.writes.RUnlock()
		if err != nil {
			s.log.Error("backend durable write failed", append(s.attrs, "offset", off, "err", err)...)
			if !errors.Is(err, syscall.ENOSPC) && !errors.Is(err, syscall.EDQUOT) {
				s.latch("durable write", err)
			}
		}
		return err
	}
	s.writes.RLock()
	_, err := s.be.WriteAt(p, off)
	s.writes.RUnlock()
	if err != nil {
		s.log.Error("backend write failed", append(s.attrs, "offset", off, "err", err)...)
		return err
	}
	if durable {
		if err := s.Flush(); err != nil {
			s.log.Error("backend flush failed", append(s.attrs, "err", err)...)
			return err
		}
	}
	return nil
}

// Flush flushes the backend's volatile cache. A failure latches: every
// later Flush and durable write fails too.
func (s *Store) Flush() error {
	if err := s.Latched(); err != nil {
		return err
	}
	if s.flusher == nil {
		return nil
	}
	return s.latch("flush", s.flusher.Flush())
}

// latch records a failed flush or durable write (what failed) and
// returns err.
func (s *Store) latch(what string, err error) error {
	if err != nil && !errors.Is(err, backend.ErrUnavailable) {
		if s.latched.CompareAndSwap(nil, &err) {
			s.log.Error(what+" failed: writes acknowledged before it may be lost; the unit now fails every write and flush until it is removed and added again (admin remove-lun/add-lun, reload or restart)",
				append(s.attrs, "err", err)...)
		}
	}
	return err
}

// Latched returns the latched flush failure, if any.
func (s *Store) Latched() error {
	if p := s.latched.Load(); p != nil {
		return fmt.Errorf("an earlier flush failed (%w); writes and flushes refused", *p)
	}
	return nil
}

// Exclusive holds off every other write until the returned function is
// called: a compare-and-write, a read-modify-write or a sanitize runs
// atomically against them (on this store: other gateways' writes to
// shared storage are the backend's to order).
func (s *Store) Exclusive() (release func()) {
	s.writes.Lock()
	return s.writes.Unlock
}

// Shared holds off compare-and-writes, as a write does, until the
// returned function is called: for writes a front end makes to the
// backend itself (write same, unmap, a copy).
func (s *Store) Shared() (release func()) {
	s.writes.RLock()
	return s.writes.RUnlock
}

// CompareAndWrite compares verify with the blocks at off and, only if
// every byte matches, writes data there (as long as verify) — atomically
// against every other write through this store, and against other
// gateways' writes where the backend compares and writes in one step of
// its own (backend.CompareWriter, shared storage, within its
// MaxCompareAndWrite). A mismatch is a *backend.MiscompareError with the
// offset of the first differing byte; a failed read or write is
// returned as is (readErr says which). The write is durable before it
// returns when durable is set (FUA, or the write cache off).
func (s *Store) CompareAndWrite(verify, data []byte, off int64, durable bool) (readErr bool, err error) {
	if cw, ok := s.be.(backend.CompareWriter); ok && cw.MaxCompareAndWrite() >= len(verify) {
		release := s.Exclusive()
		err = cw.CompareAndWrite(verify, data, off)
		release()
	} else {
		cur := make([]byte, len(verify))
		release := s.Exclusive()
		if _, err := s.be.ReadAt(cur, off); err != nil {
			release()
			return true, err
		}
		for i := range cur {
			if cur[i] != verify[i] {
				release()
				return false, &backend.MiscompareError{Offset: int64(i)}
			}
		}
		_, err = s.be.WriteAt(data, off)
		release()
	}
	if err == nil && durable {
		err = s.Flush()
	}
	return false, err
}
