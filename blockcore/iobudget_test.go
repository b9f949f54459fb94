package blockcore

import (
	"sync"
	"testing"
)

func TestIOBudgetBoundsSharesAndTotal(t *testing.T) {
	b := NewIOBudget(100, 40)
	a, c := b.NewShare(""), b.NewShare("")
	if !a.Take(30) || a.Take(20) || !a.Take(10) {
		t.Fatal("share bound")
	}
	if !c.Take(40) || b.Used() != 80 {
		t.Fatalf("used %d", b.Used())
	}
	d := b.NewShare("")
	if d.Take(30) || !d.Take(20) || b.Used() != 100 {
		t.Fatalf("total bound: used %d", b.Used())
	}
	a.Give(40)
	// Larger than a share, alone: admitted when the total has room.
	e := NewIOBudget(100, 10).NewShare("")
	if !e.Take(60) || e.Take(1) {
		t.Fatal("a lone large command")
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := b.NewShare("")
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

// TestIOBudgetPerSource: the shares of one source (a host: an address,
// or an IPv6 network) hold half the budget at most together, so one host
// with many sessions cannot leave the others TASK SET FULL; another
// source still takes its part; a source whose shares are all closed is
// forgotten; each refusal is counted by the bound it met.
func TestIOBudgetPerSource(t *testing.T) {
	b := NewIOBudget(100, 20)
	if b.SourceLimit() != 50 {
		t.Fatalf("source limit %d, want half the budget", b.SourceLimit())
	}
	var hosts []*IOShare
	for range 5 {
		hosts = append(hosts, b.NewShare("192.0.2.1"))
	}
	taken := 0
	for _, s := range hosts {
		if s.Take(20) {
			taken++
		}
	}
	if taken != 2 || b.Used() != 40 {
		t.Fatalf("one source's five shares took %d of 20 (used %d), want 2 (its half of the budget: 50)", taken, b.Used())
	}
	other := b.NewShare("192.0.2.2")
	if !other.Take(20) || !other.Take(0) {
		t.Fatal("another source was refused while the first held its half")
	}
	if r := b.Refusals(); r["source_io_budget"] != 3 || r["io_budget"] != 0 || r["session_io_budget"] != 0 {
		t.Errorf("refusals %v, want 3 at the source bound", r)
	}
	hosts[0].Give(20)
	hosts[1].Give(20)
	for _, s := range hosts {
		s.Close()
	}
	if n := b.sourceCount(); n != 1 {
		t.Errorf("%d sources remembered after one closed all its shares, want 1", n)
	}
	// A command larger than the source's part, alone: admitted.
	big := b.NewShare("192.0.2.3")
	if !big.Take(60) {
		t.Error("a lone command larger than the source's part was refused")
	}
}
