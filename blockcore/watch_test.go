package blockcore

import "testing"

// A watch list calls every function added and not yet cancelled, once a
// change; cancelling one leaves the others.
func TestWatchList(t *testing.T) {
	var l watchList[func(int)]
	got := map[string]int{}
	cancelA := l.add(func(n int) { got["a"] += n })
	l.add(func(n int) { got["b"] += n })
	l.each(func(f func(int)) { f(1) })
	cancelA()
	cancelA() // twice: harmless
	l.each(func(f func(int)) { f(10) })
	if got["a"] != 1 || got["b"] != 11 {
		t.Fatalf("calls %v, want a=1 b=11", got)
	}
}
