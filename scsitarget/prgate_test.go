package scsitarget

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/blockwire/blockwire/scsi"
)

// The write gate: settle waits for the writes of the epoch before, not
// for those that came after; a write checked before the epoch moved is
// checked again; a wait that outlasts its bound gives up and says so.
func TestWriteGate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var g writeGate
		if !g.settle(time.Second) {
			t.Fatal("settle with no write in waited")
		}
		e := g.current()
		if !g.enter(e) {
			t.Fatal("a write of the current epoch refused")
		}
		done := make(chan bool)
		go func() { done <- g.settle(time.Second) }()
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("settle returned with a write of the epoch before still in")
		default:
		}
		if g.enter(e) {
			t.Fatal("a write checked before the epoch moved entered")
		}
		later := g.current()
		if !g.enter(later) {
			t.Fatal("a write of the new epoch refused")
		}
		g.leave(e)
		if !<-done {
			t.Fatal("settle gave up although the write ended")
		}
		// The new epoch's write is in; its settle gives up after the bound.
		start := time.Now()
		if g.settle(time.Second) {
			t.Fatal("settle reported the writes ended while one is in")
		}
		if d := time.Since(start); d != time.Second {
			t.Fatalf("settle gave up after %v, want 1s", d)
		}
		g.leave(later)
	})
}

// Gateways changing the shared state at once while both take writes
// neither deadlock nor lose a write's outcome: each change waits only for
// writes past their check, which never wait for the state's lock.
func TestSharedReservationChangesWhileWriting(t *testing.T) {
	gw, _ := gateways(t, 2)
	var ns []*Nexus
	for i, d := range gw {
		n := nexus(d, "iqn.w"+string(rune('a'+i))+",i,0x1", "iqn.t,t,0x"+string(rune('1'+i)))
		cdb, p := prOut(0, 0, 0, uint64(0x100+i), 0)
		good(t, run(d, n, cdb, p))
		ns = append(ns, n)
	}
	cdb, p := prOut(1, prWERO, 0x100, 0, 0)
	good(t, run(gw[0], ns[0], cdb, p))
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i, d := range gw {
		wg.Go(func() { // writes, registered: never a conflict
			for {
				select {
				case <-done:
					return
				default:
				}
				if c := run(d, ns[i], []byte{scsi.OpWrite10, 0, 0, 0, 0, byte(i), 0, 0, 1, 0}, make([]byte, 512)); c.Status != scsi.StatusGood {
					t.Errorf("a registered nexus's write through gateway %d: status %#x", i, c.Status)
					return
				}
			}
		})
		wg.Go(func() { // registrations of other nexuses, through both
			for k := range 200 {
				n := nexus(d, "iqn.r"+string(rune('a'+i))+",i,0x1", "iqn.t,t,0x"+string(rune('1'+i)))
				cdb, p := prOut(6, 0, 0, uint64(0x1000*(i+1)+k), 0) // REGISTER AND IGNORE EXISTING KEY
				if c := run(d, n, cdb, p); c.Status != scsi.StatusGood {
					t.Errorf("REGISTER through gateway %d: status %#x", i, c.Status)
					return
				}
			}
		})
	}
	finished := make(chan struct{})
	go func() {
		time.Sleep(50 * time.Millisecond)
		close(done)
		wg.Wait()
		close(finished)
	}()
	select {
	case <-finished:
	case <-time.After(time.Minute):
		t.Fatal("gateways changing the shared state while writing did not finish in a minute")
	}
}
