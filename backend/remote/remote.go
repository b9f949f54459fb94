// Package remote is a backend whose storage is a LUN on another target,
// reached through one of blockwire's initiators (iscsi://, iser://,
// srp://) as a blockdev.Device. It is what makes `blockwire serve` a
// gateway (the iSER-on-InfiniBand draft §III): any front transport in front of any remote
// target.
//
// What passes through and what is answered locally:
//
//   - READ, WRITE, SYNCHRONIZE CACHE (and so FUA: a write, then a flush)
//     and UNMAP pass through; UNMAP only when the remote LUN is thin
//     provisioned (LBPME), otherwise the LU does not offer it. Size and
//     block size are the remote's.
//   - Reservations, unit attentions, mode pages and everything else are
//     the gateway's own: the gateway is the remote target's only
//     initiator, so reservations passed through would not tell our
//     initiators apart. Several gateways in front of one remote LUN do
//     not share them.
//   - While the remote target is unreachable (the initiator reconnects
//     and replays for its RecoveryTimeout), commands fail with
//     backend.ErrUnavailable, which the SCSI core answers with a retryable
//     sense — never with wrong data. A medium error reported by the remote
//     target stays a medium error.
package remote

import (
	"errors"
	"fmt"

	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/blockdev"
	"github.com/blockwire/blockwire/scsi"
)

// Device is the remote LUN as the backend sees it (a *blockdev.Device).
type Device interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	Size() int64
	BlockSize() int
	Thin() bool
	Flush() error
	Unmap(off, length int64) error
	Close() error
}

// Backend is a remote LUN.
type Backend struct {
	d    Device
	name string
}

// Thin is a Backend whose remote LUN is thin provisioned: it also unmaps.
type Thin struct{ *Backend }

// New returns the backend for d; name (its URL, without secrets) goes into
// error messages. The result implements backend.Unmapper only when the
// remote LUN is thin provisioned.
func New(d Device, name string) backend.Backend {
	b := &Backend{d: d, name: name}
	if d.Thin() {
		return Thin{b}
	}
	return b
}

// BlockSize is the remote LUN's logical block size; the LU in front must
// use the same.
func (b *Backend) BlockSize() int { return b.d.BlockSize() }

// Size implements backend.Backend.
func (b *Backend) Size() int64 { return b.d.Size() }

// ReadAt implements io.ReaderAt.
func (b *Backend) ReadAt(p []byte, off int64) (int, error) {
	n, err := b.d.ReadAt(p, off)
	return n, b.classify("read", err)
}

// WriteAt implements io.WriterAt.
func (b *Backend) WriteAt(p []byte, off int64) (int, error) {
	n, err := b.d.WriteAt(p, off)
	return n, b.classify("write", err)
}

// Flush implements backend.Flusher: SYNCHRONIZE CACHE on the remote LUN.
func (b *Backend) Flush() error { return b.classify("flush", b.d.Flush()) }

// Close implements backend.Closer: it logs out of the remote target.
func (b *Backend) Close() error { return b.d.Close() }

// Unmap implements backend.Unmapper.
func (t Thin) Unmap(off, length int64) error {
	return t.classify("unmap", t.d.Unmap(off, length))
}

// classify keeps a medium error reported by the remote target as it is
// and marks every other failure (the connection, a timeout, a busy or
// not-ready target) as backend.ErrUnavailable.
func (b *Backend) classify(op string, err error) error {
	if err == nil {
		return nil
	}
	var se *blockdev.SCSIError
	if errors.As(err, &se) && se.Sense != nil && se.Sense.Key == scsi.SenseMediumError {
		return fmt.Errorf("remote %s: %s: %w", b.name, op, err)
	}
	return fmt.Errorf("remote %s: %s: %w (%w)", b.name, op, backend.ErrUnavailable, err)
}

var (
	_ backend.Flusher  = (*Backend)(nil)
	_ backend.Closer   = (*Backend)(nil)
	_ backend.Unmapper = Thin{}
	_ Device           = (*blockdev.Device)(nil)
)
