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
