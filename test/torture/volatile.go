package main

import (
	"errors"
	"sync"
)

// errPowerLost is what a crashed incarnation's storage answers.
var errPowerLost = errors.New("torture: power lost")

// volatileDisk is storage with a volatile write cache, so that a crash
// can lose what was not flushed: writes land in the cache; Flush (what
// the SCSI core calls for FUA and SYNCHRONIZE CACHE) copies every dirty
// block to the durable image; Crash throws the cache away. With
// lieAboutFlush set, Flush acknowledges without copying: the deliberate
// bug the checker must catch.
type volatileDisk struct {
	blockSize     int
	lieAboutFlush bool

	mu      sync.Mutex // guards what follows; no I/O under it but memory copies
	cur     []byte     // what reads see
	durable []byte     // what survives a crash
	dirty   map[int64]bool
	epoch   int // the incarnation whose views may use the disk
}

func newVolatileDisk(size int64, blockSize int, lie bool) *volatileDisk {
	return &volatileDisk{blockSize: blockSize, lieAboutFlush: lie, cur: make([]byte, size),
		durable: make([]byte, size), dirty: map[int64]bool{}}
}

// view is one incarnation's handle on the disk (what its LU gets as
// backend): once the disk crashed, the views of before fail every call,
// so nothing of a crashed target reaches the disk again.
type view struct {
	d     *volatileDisk
	epoch int
}

// View returns the current incarnation's handle.
func (d *volatileDisk) View() *view {
	d.mu.Lock()
	defer d.mu.Unlock()
	return &view{d: d, epoch: d.epoch}
}

func (v *view) Size() int64 { return int64(len(v.d.cur)) }

func (v *view) ReadAt(p []byte, off int64) (int, error) {
	d := v.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.epoch != v.epoch {
		return 0, errPowerLost
	}
	return copy(p, d.cur[off:]), nil
}

func (v *view) WriteAt(p []byte, off int64) (int, error) {
	d := v.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.epoch != v.epoch {
		return 0, errPowerLost
	}
	n := copy(d.cur[off:], p)
	bs := int64(d.blockSize)
	for b := off / bs; b*bs < off+int64(n); b++ {
		d.dirty[b] = true
	}
	return n, nil
}

// Flush implements backend.Flusher.
func (v *view) Flush() error {
	d := v.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.epoch != v.epoch {
		return errPowerLost
	}
	if d.lieAboutFlush {
		return nil
	}
	bs := int64(d.blockSize)
	for b := range d.dirty {
		copy(d.durable[b*bs:(b+1)*bs], d.cur[b*bs:(b+1)*bs])
	}
	clear(d.dirty)
	return nil
}

// Crash loses power: the cache is gone, and every view handed out so
// far fails from now on.
func (d *volatileDisk) Crash() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.epoch++
	copy(d.cur, d.durable)
	clear(d.dirty)
}
