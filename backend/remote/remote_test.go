package remote

import (
	"errors"
	"testing"

	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/blockdev"
	"github.com/blockwire/blockwire/scsi"
)

type fake struct {
	thin bool
	err  error
	data []byte
}

func (f *fake) ReadAt(p []byte, off int64) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	return copy(p, f.data[off:]), nil
}
func (f *fake) WriteAt(p []byte, off int64) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	return copy(f.data[off:], p), nil
}
func (f *fake) Size() int64                   { return int64(len(f.data)) }
func (f *fake) BlockSize() int                { return 512 }
func (f *fake) Thin() bool                    { return f.thin }
func (f *fake) Flush() error                  { return f.err }
func (f *fake) Unmap(off, length int64) error { return f.err }
func (f *fake) Close() error                  { return nil }

// TestClassify: a remote medium error stays one; anything else (the
// session down, a timeout, another sense) is backend.ErrUnavailable, which
// the SCSI core answers with a retryable sense. Unmap is offered only for
// a thin-provisioned remote LUN.
func TestClassify(t *testing.T) {
	f := &fake{data: make([]byte, 4096)}
	b := New(f, "iscsi://x/y/0")
	if _, ok := b.(backend.Unmapper); ok {
		t.Fatal("a thick remote LUN offers unmap")
	}
	if _, ok := New(&fake{thin: true, data: f.data}, "u").(backend.Unmapper); !ok {
		t.Fatal("a thin remote LUN does not offer unmap")
	}
	if n, err := b.WriteAt([]byte("abc"), 10); n != 3 || err != nil {
		t.Fatal(n, err)
	}
	medium := &blockdev.SCSIError{Status: scsi.StatusCheckCondition, Sense: &scsi.Sense{Key: scsi.SenseMediumError, ASC: 0x11}}
	f.err = medium
	if _, err := b.ReadAt(make([]byte, 512), 0); !errors.As(err, new(*blockdev.SCSIError)) || errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("medium error became %v", err)
	}
	for _, e := range []error{errors.New("iscsi: session closed"), &blockdev.SCSIError{Status: scsi.StatusBusy}} {
		f.err = e
		if _, err := b.ReadAt(make([]byte, 512), 0); !errors.Is(err, backend.ErrUnavailable) {
			t.Fatalf("%v became %v, want ErrUnavailable", e, err)
		}
		if err := b.(backend.Flusher).Flush(); !errors.Is(err, backend.ErrUnavailable) {
			t.Fatalf("flush: %v", err)
		}
	}
}
