package sendguard

import (
	"io"
	"net"
	"testing"
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
		t.Run(tc.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			go func() {
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
			n, err := Write(a, &bufs, time.Second)
			if tc.ok {
				if err != nil || n != size {
					t.Fatalf("wrote %d of %d: %v", n, size, err)
				}
				return
			}
			if err == nil || !IsTimeout(err) {
				t.Fatalf("wrote %d: want a timeout, got %v", n, err)
			}
			if n == 0 || n >= MinProgress {
				t.Fatalf("wrote %d before failing: want some, under %d", n, MinProgress)
			}
			t.Log(err)
		})
	}
}
