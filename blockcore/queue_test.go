package blockcore

import (
	"testing"
	"testing/synctest"
)

type workFunc func()

func (f workFunc) Run() { f() }

// TestQueueBoundsAndDrains: a queue of one worker and depth one runs one
// command, holds one, refuses a third; a detached worker lets another
// start; Close runs what is queued and ends every worker, and a command
// submitted after it still runs.
func TestQueueBoundsAndDrains(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := NewQueue(1, 1)
		release, ran := make(chan struct{}), make(chan int, 4)
		hold := func(id int) Work {
			return workFunc(func() { <-release; ran <- id })
		}
		if !q.Submit(hold(1)) {
			t.Fatal("the first command refused")
		}
		synctest.Wait() // the worker holds it
		if !q.Submit(hold(2)) {
			t.Fatal("a command refused with room for one waiting")
		}
		if q.Submit(hold(3)) {
			t.Fatal("a third command taken: depth 1 and one worker")
		}
		if q.Live() != 1 || q.Waiting() != 1 {
			t.Fatalf("%d workers, %d waiting; want 1 and 1", q.Live(), q.Waiting())
		}
		// A detached worker is counted out: another starts for the
		// command waiting.
		if !q.Detach() {
			t.Fatal("Detach refused")
		}
		synctest.Wait()
		if q.Live() != 2 || q.Waiting() != 0 {
			t.Fatalf("after Detach: %d workers, %d waiting; want 2 and 0", q.Live(), q.Waiting())
		}
		q.Reattach()
		close(release)
		<-ran
		<-ran
		synctest.Wait()
		if q.Live() != 1 {
			t.Fatalf("%d workers once the detached one is back and idle, want 1", q.Live())
		}
		q.Close()
		synctest.Wait()
		if q.Live() != 0 {
			t.Fatalf("%d workers after Close", q.Live())
		}
		done := make(chan struct{})
		q.Submit(workFunc(func() { close(done) }))
		<-done
	})
}
