package main

import (
	"errors"
	"sync"
	"time"

	"github.com/blockwire/blockwire/backend"
)

// errPowerLost is what a crashed incarnation's storage answers.
var errPowerLost = errors.New("torture: power lost")

// volatileDisk is storage with a volatile write cache, so that a crash
// can lose what was not flushed: writes land in the cache; Flush (what
// the SCSI core calls for SYNCHRONIZE CACHE) copies every dirty block to
// the durable image; a durable write (WriteAtDurable: FUA, or the write
// cache off — RWF_DSYNC on a file) makes its own blocks durable and no
// other; Crash throws the cache away. With fuaFlushesAll the disk has no
// durable write, so the SCSI core answers FUA with a write and a Flush of
// everything, as on storage without one (the earlier double, kept as a
// second mode: it makes every FUA a SYNCHRONIZE CACHE, which hides a
// SYNCHRONIZE CACHE that lies). lie is a deliberate bug the checker must
// catch: "flush", Flush and durable writes acknowledge without making
// anything durable; "sync", Flush does (SYNCHRONIZE CACHE answers GOOD
// without flushing) while durable writes are honest.
type volatileDisk struct {
	blockSize     int
	lie           string
	fuaFlushesAll bool
	// writeDelay is how long a write takes before it lands (storage
	// latency: writes are then in flight when a preemption comes).
	writeDelay time.Duration

	mu      sync.Mutex // guards what follows; no I/O under it but memory copies
	cur     []byte     // what reads see
	durable []byte     // what survives a crash
	dirty   map[int64]bool
	epoch   int // the incarnation whose views may use the disk
}

func newVolatileDisk(size int64, blockSize int, lie string, fuaFlushesAll bool, writeDelay time.Duration) *volatileDisk {
	return &volatileDisk{blockSize: blockSize, lie: lie, fuaFlushesAll: fuaFlushesAll, writeDelay: writeDelay, cur: make([]byte, size),
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

// Backend is the current incarnation's handle as its LU's backend: with
// a durable write unless fuaFlushesAll.
func (d *volatileDisk) Backend() backend.Backend {
	if d.fuaFlushesAll {
		return d.View()
	}
	return durableView{d.View()}
}

// durableView is a view with a durable write (backend.DurableWriter).
type durableView struct{ *view }

// WriteAtDurable writes p and makes those blocks durable, no others.
func (v durableView) WriteAtDurable(p []byte, off int64) (int, error) {
	return v.write(p, off, v.d.lie != "flush")
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

func (v *view) WriteAt(p []byte, off int64) (int, error) { return v.write(p, off, false) }

// write lands p after the disk's write delay: in the cache, or with
// durable in the durable image too — whole blocks, so any earlier
// unflushed bytes of them may survive as well (the model allows an
// unsynced write to).
func (v *view) write(p []byte, off int64, durable bool) (int, error) {
	d := v.d
	time.Sleep(d.writeDelay)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.epoch != v.epoch {
		return 0, errPowerLost
	}
	n := copy(d.cur[off:], p)
	bs := int64(d.blockSize)
	for b := off / bs; b*bs < off+int64(n); b++ {
		if !durable {
			d.dirty[b] = true
			continue
		}
		copy(d.durable[b*bs:(b+1)*bs], d.cur[b*bs:(b+1)*bs])
		delete(d.dirty, b)
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
	if d.lie != "" {
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
