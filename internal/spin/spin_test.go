package spin

import (
	"testing"
	"time"
)

// A wait polls from its first empty read until its time has passed, and
// each Start begins a new one; no time never polls.
func TestBudget(t *testing.T) {
	b := New(30 * time.Millisecond)
	b.Start()
	if b.Polled() {
		t.Fatal("data found at the first read counted as polled")
	}
	for range 2 { // the empty read that starts the time, and the next
		if !b.Again() {
			t.Fatal("no polling within the time")
		}
	}
	if !b.Polled() {
		t.Fatal("a read within the time not counted as polled")
	}
	time.Sleep(40 * time.Millisecond)
	if b.Again() || b.Polled() {
		t.Fatal("polling past the time")
	}
	b.Start()
	if !b.Again() {
		t.Fatal("a new wait did not poll")
	}
	var none Budget
	none.Start()
	if none.Again() || none.Polled() {
		t.Fatal("a budget of no time polled")
	}
}

// The polling time follows the peer: it doubles while the receiver
// sleeps through waits it could have bridged, stays once it bridges
// them, and halves to none over idle waits (past the most and 1 ms).
func TestBudgetAdapts(t *testing.T) {
	var now time.Duration = 1
	b := New(time.Millisecond)
	b.clock = func() time.Duration { return now }
	// wait runs one wait in which the data comes after gap: the receiver
	// polls (reading the empty socket every µs) while Again says so,
	// then sleeps until the data. It reports whether polling caught it.
	wait := func(gap time.Duration) bool {
		b.Start()
		start := now
		for b.Again() {
			now += time.Microsecond
			if now-start >= gap {
				if !b.Polled() {
					t.Fatal("data found while polling not counted as polled")
				}
				return true
			}
		}
		now = start + gap
		b.Woke()
		return false
	}
	if b.Current() != time.Millisecond {
		t.Fatalf("starts at %v, want the most", b.Current())
	}
	// A peer idle for 5 ms each time: halved to none.
	for range 7 {
		wait(5 * time.Millisecond)
	}
	if b.Current() != 0 {
		t.Fatalf("after long idle waits: %v, want no polling", b.Current())
	}
	// Then it answers in 150 µs: missed while the time grows from 10 µs
	// (10, 20, 40, 80), caught from 160 µs on, and the time stays there.
	misses := 0
	for range 10 {
		if !wait(150 * time.Microsecond) {
			misses++
		}
	}
	if misses != 5 || b.Current() != 160*time.Microsecond {
		t.Fatalf("150 µs answers: %d missed, polling %v; want 5 and 160µs", misses, b.Current())
	}
	// Never beyond the most.
	for range 10 {
		wait(900 * time.Microsecond)
	}
	if b.Current() != time.Millisecond {
		t.Fatalf("900 µs answers: polling %v, want the most (1ms)", b.Current())
	}
	if !wait(900 * time.Microsecond) {
		t.Fatal("a 900 µs answer missed with 1 ms of polling")
	}
	// A small most keeps polling for a peer that answers within a
	// millisecond, though beyond the most; idleness still ends it.
	b = New(50 * time.Microsecond)
	b.clock = func() time.Duration { return now }
	for range 10 {
		wait(150 * time.Microsecond)
	}
	if b.Current() != 50*time.Microsecond {
		t.Fatalf("most 50µs, 150 µs answers: polling %v, want 50µs", b.Current())
	}
	if !wait(40 * time.Microsecond) {
		t.Fatal("a 40 µs answer missed with 50 µs of polling")
	}
	for range 3 {
		wait(2 * time.Millisecond)
	}
	if b.Current() != 0 {
		t.Fatalf("most 50µs, idle waits: polling %v, want none", b.Current())
	}
	// Without a most it never polls nor adapts.
	var none Budget
	none.Start()
	if none.Again() {
		t.Fatal("a budget of no time polled")
	}
	none.Woke()
	if none.Current() != 0 {
		t.Fatalf("a budget of no time adapted to %v", none.Current())
	}
}
