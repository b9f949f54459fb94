package scsitarget

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend/mem"
)

// gate is Work that runs until released, counting how many run at once.
type gate struct {
	running, most *atomic.Int32
	release       chan struct{}
	done          *sync.WaitGroup
}

func (g gate) Run() {
	n := g.running.Add(1)
	for {
		m := g.most.Load()
		if n <= m || g.most.CompareAndSwap(m, n) {
			break
		}
	}
	<-g.release
	g.running.Add(-1)
	g.done.Done()
}

// TestLUQueueBound: an LU runs at most Workers commands at once and
// queues at most QueueDepth more; beyond that Submit refuses (the fabric
// answers TASK SET FULL). Close lets the queued commands run, and a
// command submitted after Close still runs (issue 21).
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
