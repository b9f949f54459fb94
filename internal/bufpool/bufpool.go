// Package bufpool hands out byte buffers in power-of-two size classes from
// sync.Pools, so the I/O path reuses buffers instead of allocating one per
// command. Ownership is explicit: whoever Gets a Buf Puts it back exactly
// once, and nobody touches its bytes afterwards.
package bufpool

import (
	"math/bits"
	"sync"
)

const (
	minShift = 9  // 512 bytes
	maxShift = 24 // 16 MiB
)

// Buf is a pooled buffer. B has the requested length; its capacity is the
// size class.
type Buf struct {
	B   []byte
	src bool // B is the Source's
}

// Source is memory kept outside the Go heap — an RDMA device's registered
// memory (rdma.Memory), which moves by DMA without a copy. Its buffers
// must go back to it: a sync.Pool would drop them at a collection.
type Source interface {
	Alloc(n int) ([]byte, bool)
	Free(b []byte)
}

// Pool is a set of size-classed buffer pools. The zero value is ready.
type Pool struct {
	// Source, when set, supplies buffers first (until its budget is
	// spent; then the Go heap does).
	Source  Source
	classes [maxShift - minShift + 1]sync.Pool
	shells  sync.Pool // *Buf of Source buffers, so Get does not allocate
}

func class(n int) int {
	if n <= 1<<minShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minShift
}

// Get returns a buffer of length n (contents undefined). Buffers above
// 16 MiB are allocated directly and not pooled.
func (p *Pool) Get(n int) *Buf {
	if p.Source != nil {
		if b, ok := p.Source.Alloc(n); ok {
			sh, _ := p.shells.Get().(*Buf)
			if sh == nil {
				sh = &Buf{}
			}
			sh.B, sh.src = b, true
			return sh
		}
	}
	c := class(n)
	if c >= len(p.classes) {
		return &Buf{B: make([]byte, n)}
	}
	if v := p.classes[c].Get(); v != nil {
		b := v.(*Buf)
		b.B = b.B[:n]
		return b
	}
	return &Buf{B: make([]byte, n, 1<<(c+minShift))}
}

// Put returns a buffer obtained from Get.
func (p *Pool) Put(b *Buf) {
	if b == nil {
		return
	}
	if b.src {
		p.Source.Free(b.B)
		b.B, b.src = nil, false
		p.shells.Put(b)
		return
	}
	c := class(cap(b.B))
	if c >= len(p.classes) || cap(b.B) != 1<<(c+minShift) {
		return
	}
	p.classes[c].Put(b)
}
