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
	B []byte
}

// Pool is a set of size-classed buffer pools. The zero value is ready.
type Pool struct {
	classes [maxShift - minShift + 1]sync.Pool
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
	c := class(cap(b.B))
	if c >= len(p.classes) || cap(b.B) != 1<<(c+minShift) {
		return
	}
	p.classes[c].Put(b)
}
