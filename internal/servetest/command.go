package servetest

import (
	"context"
	"testing"
	"time"

	"github.com/blockwire/blockwire/blockdev"
)

// Doer runs one SCSI command: what an iSCSI session and an SRP channel
// share.
type Doer func(ctx context.Context, lun uint64, cdb []byte, out, in []byte) (blockdev.Result, error)

// OneCommand starts one command on do — a READ(10) of 8 KiB, or with
// write a WRITE(10) of 16 KiB — for a test whose target misbehaves. The
// wait it returns fails t unless the command has ended within 10 s, with
// an error or with a result inside its buffer.
func OneCommand(do Doer, write bool) (wait func(t testing.TB)) {
	cdb, out, in := []byte{0x28, 0, 0, 0, 0, 0, 0, 0, 16, 0}, []byte(nil), make([]byte, 8192)
	if write {
		cdb, out, in = []byte{0x2a, 0, 0, 0, 0, 0, 0, 0, 32, 0}, make([]byte, 16384), nil
	}
	type answer struct {
		res blockdev.Result
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := do(context.Background(), 0, cdb, out, in)
		done <- answer{res, err}
	}()
	return func(t testing.TB) {
		t.Helper()
		select {
		case a := <-done:
			if a.err == nil && (a.res.In < 0 || a.res.In > len(in)) {
				t.Fatalf("a read of %d bytes reports %d in", len(in), a.res.In)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the command did not end after the target dropped the connection")
		}
	}
}

// Closes runs close and returns its error; it fails t if close has not
// returned within d (a session or channel whose peer misbehaved must
// still close).
func Closes(t testing.TB, close func() error, d time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- close() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatal("Close hangs")
		return nil
	}
}
