package waitfor

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestWithin: a condition that comes true is seen within a poll's pause
// of it; one that never does is given up at the bound, not before.
func TestWithin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		at := start.Add(300 * time.Millisecond)
		if !Within(time.Second, func() bool { return !time.Now().Before(at) }) {
			t.Fatal("a condition true after 300ms was not seen within 1s")
		}
		if late := time.Since(at); late > 50*time.Millisecond {
			t.Fatalf("seen %v after it came true: the pause is at most 50ms", late)
		}
		start = time.Now()
		if Within(200*time.Millisecond, func() bool { return false }) {
			t.Fatal("a false condition reported true")
		}
		if d := time.Since(start); d != 200*time.Millisecond {
			t.Fatalf("gave up after %v, want the bound, 200ms", d)
		}
	})
}
