// Package backend defines the storage a logical unit sits on: a fixed-size
// byte range read and written at offsets (io.ReaderAt + io.WriterAt + Size).
// Optional capabilities — durable flush, unmap, write-zeroes — are found by
// interface assertion, so a backend implements only what it can do well.
package backend

import (
	"errors"
	"io"
	"strconv"
)

// Backend is the storage of one logical unit.
type Backend interface {
	io.ReaderAt
	io.WriterAt
	// Size is the capacity in bytes.
	Size() int64
}

// ErrUnavailable marks an error of storage that is out of reach for now
// but may come back — a remote target being reconnected (backend/remote).
// The SCSI core answers it with a sense that initiators retry, never with
// a medium error.
var ErrUnavailable = errors.New("backend: storage unavailable")

// Flusher makes every completed write durable (SYNCHRONIZE CACHE, FUA).
type Flusher interface {
	Flush() error
}

// DurableWriter writes data that is durable once the call returns — a
// write with FUA, or with the write cache off — without waiting for
// every other write as Flush does (backend/file: RWF_DSYNC). A failure
// means as much as a failed Flush: the storage may have dropped other
// acknowledged writes' errors with it (an fdatasync error is reported
// once per file).
type DurableWriter interface {
	WriteAtDurable(p []byte, off int64) (int, error)
}

// Unmapper releases a byte range so that it reads back as zeroes.
type Unmapper interface {
	Unmap(off, length int64) error
}

// Closer releases the backend's resources.
type Closer interface {
	Close() error
}

// Resizer changes the capacity.
type Resizer interface {
	Resize(size int64) error
}

// Mapper reports provisioning: whether the byte at off is backed by
// storage, and how far the same state extends (at least to off+1).
type Mapper interface {
	Mapped(off int64) (mapped bool, end int64, err error)
}

// NonBlocking is implemented by backends whose reads and writes complete
// in memory without waiting (backend/mem): a fabric may then run a lone
// command on its receive goroutine instead of handing it to a worker.
type NonBlocking interface {
	NonBlocking() bool
}

// CompareWriter compares and writes in one atomic step of the storage
// itself (COMPARE AND WRITE), so the comparison holds against writers
// that do not go through this process — other gateways in front of the
// same shared image (backend/rbd).
type CompareWriter interface {
	// CompareAndWrite writes data at off if the bytes there equal cmp
	// (len(cmp) == len(data)); if they do not, it writes nothing and
	// returns a *MiscompareError.
	CompareAndWrite(cmp, data []byte, off int64) error
	// MaxCompareAndWrite is the longest range CompareAndWrite takes, in
	// bytes, at an offset aligned to it (librbd: 512).
	MaxCompareAndWrite() int
}

// MiscompareError is a CompareAndWrite whose comparison failed.
type MiscompareError struct {
	// Offset is the first differing byte, from the start of the range.
	Offset int64
}

func (e *MiscompareError) Error() string {
	return "backend: miscompare at byte " + strconv.FormatInt(e.Offset, 10) + " of the range"
}

// CapacityWatcher is implemented by storage whose size can change from
// outside (an RBD image resized by another client). The logical unit
// gives it, once, a function to call after every change; the LU then
// reads Size again and tells initiators (CAPACITY DATA HAS CHANGED).
type CapacityWatcher interface {
	WatchCapacity(changed func())
}

// Identifier is implemented by shared storage that several targets may
// serve at once: Identity names the storage the same way everywhere, and
// the LU's NAA designator and serial number derive from it, so an
// initiator sees one LU on several paths (ALUA, multipath).
type Identifier interface {
	Identity() string
}

// SharedState is implemented by shared storage that keeps a small record
// for all the targets serving it — a LU's persistent reservations — so
// every gateway in front of one image sees one state (backend/rbd keeps
// it in the cluster).
type SharedState interface {
	// LoadState returns the record and its version.
	LoadState() (b []byte, version uint64, err error)
	// StoreState replaces the record if it is still at version, and
	// returns the new version once every other target watching it has
	// been told; ErrStale if another target stored first.
	StoreState(b []byte, version uint64) (uint64, error)
	// WatchState registers the function called when the record changed
	// (with its new version, or 0 when changes may have been missed). The
	// change counts as told once it returns; it may take a few seconds (a
	// target waits there for its writes checked against the old record),
	// and must not wait for anything that waits for a StoreState.
	WatchState(changed func(version uint64)) error
}

// ErrStale is a SharedState store that lost the race with another target.
var ErrStale = errors.New("backend: shared state changed meanwhile")
