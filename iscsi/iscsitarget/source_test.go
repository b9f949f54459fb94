package iscsitarget

import (
	"sync"
	"testing"
	"time"
)

// A source's receivers wait while its commands on workers exceed the
// limit and all wake when one is done — however a wait and the last done
// interleave (no wake-up lost), and a stopped connection's wait ends.
func TestSourceWaitWakesEveryWaiter(t *testing.T) {
	for round := range 500 {
		src := &source{limit: 4, free: make(chan struct{})}
		for range 5 {
			src.add() // one past the limit
		}
		var wg sync.WaitGroup
		done := make(chan struct{})
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				src.wait(nil)
			}()
		}
		if round%2 == 0 {
			time.Sleep(time.Microsecond) // some waiters block first, some after
		}
		src.done()
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: waiters still blocked with %d of %d working", round, src.working.Load(), src.limit)
		}
	}
	src := &source{limit: 1, free: make(chan struct{})}
	src.add()
	src.add()
	stop := make(chan struct{})
	close(stop)
	if !src.wait(stop) {
		t.Fatal("over the limit, wait did not wait")
	}
	var none *source // a connection without a source never waits
	none.add()
	none.done()
	if none.wait(nil) {
		t.Fatal("a nil source waited")
	}
}
