// Package mem is an in-memory backend. Storage is allocated lazily in 1 MiB
// chunks, so a 1 GiB LUN costs nothing until it is written; unwritten and
// unmapped ranges read as zeroes.
package mem

import (
	"fmt"
	"io"
	"sync"
)

const chunkShift = 20
const chunkSize = 1 << chunkShift

type chunk struct {
	mu   sync.RWMutex
	data []byte // nil until first written
}

// Disk is an in-memory backend. It is safe for concurrent use.
type Disk struct {
	mu     sync.RWMutex // guards size and the chunks slice itself
	size   int64
	chunks []*chunk
}

// New returns a zero-filled disk of size bytes.
func New(size int64) (*Disk, error) {
	if size < 0 {
		return nil, fmt.Errorf("mem: negative size %d", size)
	}
	d := &Disk{}
	d.setSize(size)
	return d, nil
}

func (d *Disk) setSize(size int64) {
	n := int((size + chunkSize - 1) >> chunkShift)
	for len(d.chunks) < n {
		d.chunks = append(d.chunks, &chunk{})
	}
	// Shrinking drops the chunks past the end so growing again reads zeroes.
	for i := n; i < len(d.chunks); i++ {
		d.chunks[i] = &chunk{}
	}
	d.chunks = d.chunks[:n]
	if size < d.size && n > 0 {
		// Zero the tail of the last chunk past the new end.
		c := d.chunks[n-1]
		if c.data != nil {
			clear(c.data[size-int64(n-1)<<chunkShift:])
		}
	}
	d.size = size
}

// NonBlocking implements backend.NonBlocking: reads and writes are
// memory copies.
func (d *Disk) NonBlocking() bool { return true }

// Size returns the capacity in bytes.
func (d *Disk) Size() int64 {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.size
}

// Resize changes the capacity; new space reads as zeroes.
func (d *Disk) Resize(size int64) error {
	if size < 0 {
		return fmt.Errorf("mem: negative size %d", size)
	}
	d.mu.Lock()
	d.setSize(size)
	d.mu.Unlock()
	return nil
}

func (d *Disk) check(off int64, n int) error {
	if off < 0 || off+int64(n) > d.size {
		return fmt.Errorf("mem: range [%d,%d) outside disk of %d bytes", off, off+int64(n), d.size)
	}
	return nil
}

// ReadAt implements io.ReaderAt.
func (d *Disk) ReadAt(p []byte, off int64) (int, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if off >= d.size && len(p) > 0 {
		return 0, io.EOF
	}
	if err := d.check(off, len(p)); err != nil {
		return 0, err
	}
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		c := d.chunks[pos>>chunkShift]
		in := int(pos & (chunkSize - 1))
		n := min(len(p)-done, chunkSize-in)
		c.mu.RLock()
		if c.data == nil {
			clear(p[done : done+n])
		} else {
			copy(p[done:done+n], c.data[in:])
		}
		c.mu.RUnlock()
		done += n
	}
	return done, nil
}

// WriteAt implements io.WriterAt.
func (d *Disk) WriteAt(p []byte, off int64) (int, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if err := d.check(off, len(p)); err != nil {
		return 0, err
	}
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		c := d.chunks[pos>>chunkShift]
		in := int(pos & (chunkSize - 1))
		n := min(len(p)-done, chunkSize-in)
		c.mu.Lock()
		if c.data == nil {
			c.data = make([]byte, chunkSize)
		}
		copy(c.data[in:], p[done:done+n])
		c.mu.Unlock()
		done += n
	}
	return done, nil
}

// Unmap releases [off, off+length): whole chunks are freed, partial ones
// zeroed.
func (d *Disk) Unmap(off, length int64) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if off < 0 || length < 0 || off+length > d.size {
		return fmt.Errorf("mem: unmap [%d,%d) outside disk of %d bytes", off, off+length, d.size)
	}
	end := off + length
	for pos := off; pos < end; {
		c := d.chunks[pos>>chunkShift]
		in := pos & (chunkSize - 1)
		n := min(end-pos, chunkSize-in)
		c.mu.Lock()
		if c.data != nil {
			if n == chunkSize {
				c.data = nil
			} else {
				clear(c.data[in : in+n])
			}
		}
		c.mu.Unlock()
		pos += n
	}
	return nil
}

// Flush is a no-op: memory has no volatile cache above it.
func (d *Disk) Flush() error { return nil }

// Mapped implements backend.Mapper: a chunk never written (or fully
// unmapped) is deallocated.
func (d *Disk) Mapped(off int64) (bool, int64, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if off < 0 || off >= d.size {
		return false, off, fmt.Errorf("mem: offset %d outside disk of %d bytes", off, d.size)
	}
	i := int(off >> chunkShift)
	state := d.chunkMapped(i)
	for i++; i < len(d.chunks) && d.chunkMapped(i) == state; i++ {
	}
	return state, min(int64(i)<<chunkShift, d.size), nil
}

func (d *Disk) chunkMapped(i int) bool {
	c := d.chunks[i]
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.data != nil
}
