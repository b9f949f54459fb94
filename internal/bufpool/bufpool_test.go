package bufpool

import "testing"

func TestClasses(t *testing.T) {
	var p Pool
	for _, n := range []int{1, 511, 512, 513, 4096, 65536, 1 << 20, 1<<24 + 1} {
		b := p.Get(n)
		if len(b.B) != n {
			t.Fatalf("Get(%d) has length %d", n, len(b.B))
		}
		if cap(b.B) < n {
			t.Fatalf("Get(%d) has capacity %d", n, cap(b.B))
		}
		p.Put(b)
	}
	b := p.Get(4000)
	if cap(b.B) != 4096 {
		t.Fatalf("Get(4000) capacity %d, want the 4096 class", cap(b.B))
	}
}

func TestReuseDoesNotAllocate(t *testing.T) {
	var p Pool
	p.Put(p.Get(65536))
	allocs := testing.AllocsPerRun(100, func() { p.Put(p.Get(65536)) })
	if allocs != 0 {
		t.Fatalf("%.1f allocations per Get/Put, want 0", allocs)
	}
}
