// Package backend defines the storage a logical unit sits on: a fixed-size
// byte range read and written at offsets (io.ReaderAt + io.WriterAt + Size).
// Optional capabilities — durable flush, unmap, write-zeroes — are found by
// interface assertion, so a backend implements only what it can do well.
package backend

import (
	"errors"
	"io"
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
