package scsitarget

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/blockcore"
)

// gate is Work that runs until released, counting how many run at once.
type gate struct {
	running, most *atomic.Int32
	release       chan struct{}
	done          *sync.WaitGroup
}

func (g gate) Run() {
	enter(g.running, g.most)
	<-g.release
	g.running.Add(-1)
	g.done.Done()
}

// enter counts one more running and keeps the most seen at once.
func enter(running, most *atomic.Int32) {
	n := running.Add(1)
	for {
		m := most.Load()
		if n <= m || most.CompareAndSwap(m, n) {
			return
		}
	}
}

// TestLUQueueBound: an LU runs at most Workers commands at once and
// queues at most QueueDepth more; beyond that Submit refuses (the fabric
// answers TASK SET FULL). Close lets the queued commands run, and a
// command submitted after Close still runs.
func TestLUQueueBound(t *testing.T) {
	be, _ := mem.New(1 << 20)
	lu, err := NewLU("iqn.2026-11.org.example:q", LUConfig{Backend: be, Workers: 2, QueueDepth: 3})
	if err != nil {
		t.Fatal(err)
	}
	var running, most atomic.Int32
	var done sync.WaitGroup
	release := make(chan struct{})
	g := gate{&running, &most, release, &done}
	done.Add(2)
	lu.Submit(g)
	lu.Submit(g)
	deadline := time.Now().Add(5 * time.Second)
	for running.Load() != 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if running.Load() != 2 {
		t.Fatalf("%d commands running, want the 2 workers busy", running.Load())
	}
	for i := range 3 {
		done.Add(1)
		if !lu.Submit(g) {
			t.Fatalf("queued command %d refused with %d of 3 queued", i+1, i)
		}
	}
	if lu.Submit(g) {
		t.Fatal("a command beyond workers + queue depth was taken")
	}
	close(release)
	done.Wait()
	if m := most.Load(); m != 2 {
		t.Fatalf("%d commands ran at once, want at most the 2 workers", m)
	}
	lu.Close()
	done.Add(1)
	if !lu.Submit(g) {
		t.Fatal("a command after Close was refused")
	}
	done.Wait()
}

// detaching is Work that uses the backend (counted in backend), then
// detaches and waits for its answer to be taken (until release).
type detaching struct {
	lu               *LU
	backend, most    *atomic.Int32
	detached, refuse *atomic.Int32
	release          chan struct{}
	done             *sync.WaitGroup
}

func (d detaching) Run() {
	enter(d.backend, d.most)
	time.Sleep(time.Millisecond)
	d.backend.Add(-1)
	if d.lu.Detach() {
		d.detached.Add(1)
		<-d.release
		d.lu.Reattach()
	} else {
		d.refuse.Add(1)
		<-d.release
	}
	d.done.Done()
}

// TestDetachedWorkersLeaveTheLUToOthers: commands whose answers wait on a
// peer that takes none detach their workers, and the LU goes on running
// the other commands with its 2 workers — never more than 2 in the
// backend at once; past 16 detached per worker, and no fewer than
// blockcore.MinDetached (1024), Detach refuses, and the workers left over end once
// the answers are taken.
func TestDetachedWorkersLeaveTheLUToOthers(t *testing.T) {
	be, _ := mem.New(1 << 20)
	lu, err := NewLU("iqn.2026-11.org.example:q", LUConfig{Backend: be, Workers: 2, QueueDepth: 2048})
	if err != nil {
		t.Fatal(err)
	}
	var backend, most, detached, refused atomic.Int32
	var done sync.WaitGroup
	release := make(chan struct{})
	d := detaching{lu, &backend, &most, &detached, &refused, release, &done}
	const stuck = blockcore.MinDetached + 2 // 2 beyond the bound (2 workers: 32 would be 16 each)
	for range stuck {
		done.Add(1)
		if !lu.Submit(d) {
			t.Fatal("refused")
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for detached.Load()+refused.Load() < stuck && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if detached.Load() != blockcore.MinDetached || refused.Load() != 2 {
		t.Fatalf("%d detached, %d refused; want %d and 2 (live %d detached %d queued %d)", detached.Load(), refused.Load(), blockcore.MinDetached, lu.q.Live(), lu.q.Detached(), lu.q.Waiting())
	}
	if m := most.Load(); m > 2 {
		t.Fatalf("%d commands in the backend at once, want at most the 2 workers", m)
	}
	// The two refused hold both workers now: a new command waits.
	var ran atomic.Bool
	done.Add(1)
	lu.Submit(runFunc(func() { ran.Store(true); done.Done() }))
	time.Sleep(50 * time.Millisecond)
	if ran.Load() {
		t.Fatal("a command ran past the bound of detached workers")
	}
	close(release)
	done.Wait()
	if !ran.Load() {
		t.Fatal("the waiting command never ran")
	}
	// The workers left over end: 2 remain.
	deadline = time.Now().Add(5 * time.Second)
	for lu.q.Live() != 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if l := lu.q.Live(); l != 2 {
		t.Fatalf("%d workers after the answers were taken, want 2", l)
	}
}

// TestDetachedWorkerIsReplaced: with its one worker detached, an LU runs
// the next command at once.
func TestDetachedWorkerIsReplaced(t *testing.T) {
	be, _ := mem.New(1 << 20)
	lu, err := NewLU("iqn.2026-11.org.example:q", LUConfig{Backend: be, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	var backend, most, detached, refused atomic.Int32
	var done sync.WaitGroup
	release := make(chan struct{})
	done.Add(1)
	lu.Submit(detaching{lu, &backend, &most, &detached, &refused, release, &done})
	ran := make(chan struct{})
	lu.Submit(runFunc(func() { close(ran) }))
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("the command behind a detached worker did not run")
	}
	close(release)
	done.Wait()
}

type runFunc func()

func (f runFunc) Run() { f() }
