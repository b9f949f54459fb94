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

type source struct {
	out  map[*byte]bool
	left int
}

func (s *source) Alloc(n int) ([]byte, bool) {
	if s.left == 0 {
		return nil, false
	}
	s.left--
	b := make([]byte, n)
	s.out[&b[0]] = true
	return b, true
}

func (s *source) Free(b []byte) { delete(s.out, &b[0]) }

func TestSourceFirstThenHeap(t *testing.T) {
	src := &source{out: map[*byte]bool{}, left: 1}
	p := Pool{Source: src}
	a := p.Get(4096)
	if !src.out[&a.B[0]] {
		t.Fatal("the first buffer did not come from the source")
	}
	b := p.Get(4096) // the source is spent: Go memory
	if src.out[&b.B[0]] || len(b.B) != 4096 {
		t.Fatal("the second buffer should come from the heap")
	}
	p.Put(a)
	p.Put(b)
	if len(src.out) != 0 {
		t.Fatal("a source buffer was not given back to the source")
	}
}
