package iscsitarget

import (
	"sync"
	"testing"
	"time"
)

// TestInflightAddWhileWaiting: tasks are added and done while others
// wait (what a WaitGroup forbids); every Wait returns once the count is
// zero, and not before (run with -race).
func TestInflightAddWhileWaiting(t *testing.T) {
	var f inflight
	f.Add()
	returned := make(chan struct{})
	go func() { f.Wait(); close(returned) }()
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 1000; j++ {
				f.Add()
				f.Done()
			}
		}()
	}
	wg.Wait()
	select {
	case <-returned:
		t.Fatal("Wait returned with a task still counted")
	case <-time.After(20 * time.Millisecond):
	}
	f.Done()
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return at zero")
	}
	f.Wait() // nothing counted: returns at once
}

// TestInflightNoLostWakeup: a Wait that races the count's fall to zero
// returns (Done skips the lock when nobody waits; run with -race).
func TestInflightNoLostWakeup(t *testing.T) {
	var f inflight
	for i := 0; i < 20000; i++ {
		f.Add()
		done := make(chan struct{})
		go func() { f.Wait(); close(done) }()
		if i%100 == 0 {
			time.Sleep(200 * time.Microsecond) // the waiter most likely blocked
		}
		f.Done()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: Wait missed the zero", i)
		}
	}
}
