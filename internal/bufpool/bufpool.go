// Package bufpool hands out byte buffers in power-of-two size classes from
// sync.Pools, so the I/O path reuses buffers instead of allocating one per
// command. Ownership is explicit: whoever Gets a buffer Puts it back exactly
// once, and nobody touches it afterwards.
package bufpool

import (
	"math/bits"
	"sync"
)

const (
	minShift = 9  // 512 bytes
	maxShift = 24 // 16 MiB
)

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
func (p *Pool) Get(n int) []byte {
	c := class(n)
	if c >= len(p.classes) {
		return make([]byte, n)
	}
	if v := p.classes[c].Get(); v != nil {
		b := v.(*[]byte)
		return (*b)[:n]
	}
	return make([]byte, n, 1<<(c+minShift))
}

// Put returns a buffer obtained from Get.
func (p *Pool) Put(b []byte) {
	c := class(cap(b))
	if c >= len(p.classes) || cap(b) != 1<<(c+minShift) {
		return
	}
	b = b[:cap(b)]
	p.classes[c].Put(&b)
}
