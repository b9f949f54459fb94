// Package mem is an in-memory backend. Storage is allocated lazily in 1 MiB
// chunks, so a 1 GiB LUN costs nothing until it is written; unwritten and
// unmapped ranges read as zeroes.
package mem

import (
	"fmt"
	"io"
	"slices"
	"sync"
)

const chunkShift = 20
const chunkSize = 1 << chunkShift

// A page holds the chunks of 1 GiB. Pages and chunks are made on the
// first write into them, so what a LUN's size alone costs is one pointer
// per GiB: 8 MiB for MaxSize.
const pageShift = 10
const pageChunks = 1 << pageShift

// MaxSize is the largest memory LUN: 1 PiB. Its page table takes 8 MiB;
// far beyond it the table alone would exhaust the host.
const MaxSize = 1 << 50

type chunk struct {
	mu   sync.RWMutex
	data []byte // nil until written, and again once unmapped
}

type page [pageChunks]*chunk

// Disk is an in-memory backend. It is safe for concurrent use.
type Disk struct {
	mu    sync.RWMutex // guards size, the page table and the pages' entries
	size  int64
	pages []*page
}

// New returns a zero-filled disk of size bytes (at most MaxSize).
func New(size int64) (*Disk, error) {
	if err := checkSize(size); err != nil {
		return nil, err
	}
	d := &Disk{}
	d.setSize(size)
	return d, nil
}

func checkSize(size int64) error {
	switch {
	case size < 0:
		return fmt.Errorf("mem: negative size %d", size)
	case size > MaxSize:
		return fmt.Errorf("mem: %d bytes: a memory LUN holds at most 1 PiB (%d bytes)", size, int64(MaxSize))
	}
	return nil
}

// chunkAt is the chunk holding byte pos, nil when never written. Called
// with d.mu held (either way).
func (d *Disk) chunkAt(pos int64) *chunk {
	i := pos >> chunkShift
	if pg := d.pages[i>>pageShift]; pg != nil {
		return pg[i&(pageChunks-1)]
	}
	return nil
}

// setSize changes the size; called with d.mu held for writing (or before
// d is shared).
func (d *Disk) setSize(size int64) {
	chunks := (size + chunkSize - 1) >> chunkShift
	n := int((chunks + pageChunks - 1) >> pageShift)
	if size < d.size {
		// Shrinking drops what lies past the end, so growing again reads
		// zeroes: the pages past it, the chunks past it in the last page,
		// and the tail of the last chunk.
		clear(d.pages[n:])
		if n > 0 {
			if pg := d.pages[n-1]; pg != nil {
				clear(pg[chunks-int64(n-1)<<pageShift:])
			}
		}
		if size > 0 {
			if c := d.chunkAt(size - 1); c != nil && c.data != nil {
				clear(c.data[size-(chunks-1)<<chunkShift:])
			}
		}
	}
	// Entries past the length are nil (shrinking cleared them), so the
	// table grows into zeroes.
	d.pages = slices.Grow(d.pages, max(0, n-len(d.pages)))[:n]
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
	if err := checkSize(size); err != nil {
		return err
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
		c := d.chunkAt(pos)
		in := int(pos & (chunkSize - 1))
		n := min(len(p)-done, chunkSize-in)
		if c == nil {
			clear(p[done : done+n])
			done += n
			continue
		}
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
		c := d.chunkAt(pos)
		if c == nil {
			// The first write into this MiB: its chunk (and page) are
			// made under the write lock, then the read lock is taken
			// back. The size may have changed meanwhile.
			d.mu.RUnlock()
			d.mu.Lock()
			if pos < d.size {
				d.makeChunk(pos)
			}
			d.mu.Unlock()
			d.mu.RLock()
			if err := d.check(off, len(p)); err != nil {
				return done, err
			}
			c = d.chunkAt(pos)
			if c == nil {
				continue // dropped by a shrink and grow meanwhile: again
			}
		}
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
		c := d.chunkAt(pos)
		in := pos & (chunkSize - 1)
		n := min(end-pos, chunkSize-in)
		if c == nil {
			pos += n
			continue
		}
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
	i := off >> chunkShift
	state := d.chunkMapped(i)
	last := (d.size - 1) >> chunkShift
	for i++; i <= last; i++ {
		if !state && d.pages[i>>pageShift] == nil {
			// A page never written: 1 GiB unmapped at once.
			i |= pageChunks - 1
			continue
		}
		if d.chunkMapped(i) != state {
			break
		}
	}
	return state, min(i<<chunkShift, d.size), nil
}

func (d *Disk) chunkMapped(i int64) bool {
	c := d.chunkAt(i << chunkShift)
	if c == nil {
		return false
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.data != nil
}

// makeChunk makes the chunk holding byte pos (and its page) if need be.
// Called with d.mu held for writing.
func (d *Disk) makeChunk(pos int64) {
	i := pos >> chunkShift
	pg := d.pages[i>>pageShift]
	if pg == nil {
		pg = new(page)
		d.pages[i>>pageShift] = pg
	}
	if pg[i&(pageChunks-1)] == nil {
		pg[i&(pageChunks-1)] = &chunk{}
	}
}
