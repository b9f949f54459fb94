// Package waitfor is what a test uses instead of a sleep when it waits
// for something a real peer or a goroutine of the code under test does —
// a count to settle, a line in a log: it polls the condition, every
// millisecond at first and less often as the wait goes on, until it
// holds or the bound passes. Where time itself is the subject (timeouts,
// intervals), tests use testing/synctest instead.
package waitfor

import (
	"testing"
	"time"
)

// True polls cond until it reports true; if it has not within d, it
// fails t with what says — called then, so it can tell the state the
// wait ended in — and how long it waited.
func True(t testing.TB, d time.Duration, cond func() bool, says func() string) {
	t.Helper()
	if !Within(d, cond) {
		t.Fatalf("%s (waited %v)", says(), d)
	}
}

// Within polls cond until it reports true, for at most d; it reports
// whether cond held.
func Within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		if cond() {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		time.Sleep(min(pause, left))
	}
}
