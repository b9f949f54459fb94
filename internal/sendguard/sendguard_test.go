package sendguard

import (
	"io"
	"net"
	"testing"
	"testing/synctest"
	"time"
)

// A stretch that moves some bytes, but fewer than MinProgress, fails the
// write with an error that is still a timeout and says what moved; a
// stretch that moves more gets a fresh deadline and the write completes.
func TestStretches(t *testing.T) {
	for _, tc := range []struct {
		name  string
		chunk int // the peer reads this much per 50 ms
		ok    bool
	}{
		{"trickle", 1 << 10, false}, // 20 KiB/s
		{"steady", 128 << 10, true}, // 2.6 MB/s; one read per stretch is enough
	} {
		// On a bubble's clock: the stretches are timed to the tick.
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a, b := net.Pipe()
				done := make(chan struct{})
				defer func() { a.Close(); b.Close(); <-done }()
				go func() {
					defer close(done)
					buf := make([]byte, tc.chunk)
					for {
						time.Sleep(50 * time.Millisecond)
						if _, err := io.ReadFull(b, buf); err != nil {
							return
						}
					}
				}()
				const size = 1 << 20
				bufs := net.Buffers{make([]byte, size/2), make([]byte, size/2)}
				start := time.Now()
				n, err := Write(a, &bufs, time.Second)
				took := time.Since(start)
				if tc.ok {
					if err != nil || n != size {
						t.Fatalf("wrote %d of %d: %v", n, size, err)
					}
					if want := time.Duration(size/tc.chunk) * 50 * time.Millisecond; took != want {
						t.Fatalf("took %v, want %v: the peer's pace", took, want)
					}
					return
				}
				if took != time.Second {
					t.Fatalf("failed after %v, want one stretch, 1s", took)
				}
				if err == nil || !IsTimeout(err) {
					t.Fatalf("wrote %d: want a timeout, got %v", n, err)
				}
				if n == 0 || n >= MinProgress {
					t.Fatalf("wrote %d before failing: want some, under %d", n, MinProgress)
				}
				t.Log(err)
			})
		})
	}
}
