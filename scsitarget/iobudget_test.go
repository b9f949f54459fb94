package scsitarget

import (
	"sync"
	"testing"
)

func TestIOBudgetBoundsSharesAndTotal(t *testing.T) {
	b := NewIOBudget(100, 40)
	a, c := b.NewShare(), b.NewShare()
	if !a.Take(30) || a.Take(20) || !a.Take(10) {
		t.Fatal("share bound")
	}
	if !c.Take(40) || b.Used() != 80 {
		t.Fatalf("used %d", b.Used())
	}
	d := b.NewShare()
	if d.Take(30) || !d.Take(20) || b.Used() != 100 {
		t.Fatalf("total bound: used %d", b.Used())
	}
	a.Give(40)
	// Larger than a share, alone: admitted when the total has room.
	e := NewIOBudget(100, 10).NewShare()
	if !e.Take(60) || e.Take(1) {
		t.Fatal("a lone large command")
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := b.NewShare()
			for range 1000 {
				if s.Take(7) {
					s.Give(7)
				}
			}
		}()
	}
	wg.Wait()
	if b.Used() != 60 {
		t.Fatalf("after concurrent takes and gives: used %d, want 60", b.Used())
	}
}
