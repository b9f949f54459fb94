// Package servetest holds a check that the tests of several packages
// share: a well-behaved initiator gets served in time while a hostile
// peer does its worst.
package servetest

import (
	"io"
	"testing"
	"time"
)

// Disk is what an initiator opens: a block device to read.
type Disk interface {
	io.ReaderAt
	io.Closer
}

// ReadsWithin opens a disk with open (its login's commands included) and
// reads n blocks of 4 KiB from it; t fails, saying why, unless all of it
// is done within d.
func ReadsWithin(t testing.TB, d time.Duration, n int, open func() (Disk, error), why string) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		disk, err := open()
		if err != nil {
			done <- err
			return
		}
		defer disk.Close()
		buf := make([]byte, 4096)
		for i := range n {
			if _, err := disk.ReadAt(buf, int64(i)*4096); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(d):
		t.Fatal(why)
	}
}
