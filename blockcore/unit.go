package blockcore

import (
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/blockwire/blockwire/backend"
)

// UnitConfig describes a unit: the backend and what every front end
// exports of it.
type UnitConfig struct {
	Backend   backend.Backend
	BlockSize int // 512 to 65536, a power of two; default 512
	ReadOnly  bool
	// WriteThrough starts the write cache off (Store).
	WriteThrough bool
	// Identity names the storage the same everywhere it is served (the
	// backend's backend.Identifier, else the front end's name for it):
	// the identifiers every front end reports (SCSI's NAA designator and
	// serial number, NVMe's NGUID and serial) derive from it.
	Identity string
	// Workers and QueueDepth size the queue (NewQueue).
	Workers, QueueDepth int
	// Logger receives the store's failures; may be nil.
	Logger *slog.Logger
	Attrs  []any
}

// Unit is one block device as every front end sees it — a SCSI logical
// unit and an NVMe namespace on the same image are one Unit: one store
// (the write cache, the flush latch, compare-and-write's lock), one
// queue of commands with its workers, one capacity and its change
// events. The front ends add their protocol's semantics above it.
type Unit struct {
	be        backend.Backend
	store     *Store
	q         *Queue
	blockSize int
	blockBits uint
	readOnly  bool
	fast      bool
	identity  string
	resv      Reservations // set once, before the unit is served

	nblocks atomic.Uint64

	stats     Stats                                        // what every front end did with it
	capWatch  watchList[func()]                            // WatchCapacity's
	resvWatch watchList[func(ReservationNotice, []string)] // WatchReservations'
}

// watchList is the functions a change calls (in no order), until each
// is cancelled. Its lock is taken alone (lock order); the functions are
// called without it.
type watchList[F any] struct {
	mu   sync.Mutex
	next int
	fs   map[int]F
}

// add adds f; cancel removes it.
func (l *watchList[F]) add(f F) (cancel func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fs == nil {
		l.fs = map[int]F{}
	}
	id := l.next
	l.next++
	l.fs[id] = f
	return func() {
		l.mu.Lock()
		delete(l.fs, id)
		l.mu.Unlock()
	}
}

// each calls call with every function, the lock released.
func (l *watchList[F]) each(call func(F)) {
	l.mu.Lock()
	fs := make([]F, 0, len(l.fs))
	for _, f := range l.fs {
		fs = append(fs, f)
	}
	l.mu.Unlock()
	for _, f := range fs {
		call(f)
	}
}

// NewUnit builds a unit on cfg.Backend.
func NewUnit(cfg UnitConfig) (*Unit, error) {
	if cfg.Backend == nil {
		return nil, errors.New("blockcore: a unit needs a backend")
	}
	bs := cfg.BlockSize
	if bs == 0 {
		bs = 512
	}
	if bs < 512 || bs > 65536 || bs&(bs-1) != 0 {
		return nil, fmt.Errorf("blockcore: block size %d is not a power of two in [512, 65536]", bs)
	}
	size := cfg.Backend.Size()
	if size < int64(bs) {
		return nil, fmt.Errorf("blockcore: backend of %d bytes holds no %d-byte block", size, bs)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	u := &Unit{be: cfg.Backend, blockSize: bs, readOnly: cfg.ReadOnly, identity: cfg.Identity,
		store: NewStore(cfg.Backend, !cfg.WriteThrough, log, cfg.Attrs...),
		q:     NewQueue(cfg.Workers, cfg.QueueDepth)}
	if id, ok := cfg.Backend.(backend.Identifier); ok {
		u.identity = id.Identity()
	}
	for 1<<u.blockBits != bs {
		u.blockBits++
	}
	if nb, ok := cfg.Backend.(backend.NonBlocking); ok {
		u.fast = nb.NonBlocking()
	}
	u.nblocks.Store(uint64(size) >> u.blockBits)
	if w, ok := cfg.Backend.(backend.CapacityWatcher); ok {
		w.WatchCapacity(u.capacityChanged)
	}
	return u, nil
}

// Backend is the unit's backend.
func (u *Unit) Backend() backend.Backend { return u.be }

// Store is the unit's write path.
func (u *Unit) Store() *Store { return u.store }

// Queue is the unit's queue of commands.
func (u *Unit) Queue() *Queue { return u.q }

// Blocks is the capacity in logical blocks.
func (u *Unit) Blocks() uint64 { return u.nblocks.Load() }

// BlockSize is the logical block size in bytes; BlockBits its log2.
func (u *Unit) BlockSize() int   { return u.blockSize }
func (u *Unit) BlockBits() uint  { return u.blockBits }
func (u *Unit) ReadOnly() bool   { return u.readOnly }
func (u *Unit) Identity() string { return u.identity }

// NonBlocking reports whether the unit's I/O never waits (a memory
// backend), so a front end may run its commands on the receiving
// goroutine.
func (u *Unit) NonBlocking() bool { return u.fast }

// ID is a 16-byte identifier derived from the identity (stable across
// restarts, the same on every gateway serving shared storage): NVMe's
// NGUID; SCSI makes its NAA designator from the same hash.
func (u *Unit) ID() [16]byte {
	h := fnv.New128a()
	fmt.Fprintf(h, "blockwire\x00%s", u.identity)
	var id [16]byte
	copy(id[:], h.Sum(nil))
	return id
}

// Resize changes the capacity (the backend must be a backend.Resizer)
// to size bytes, whole blocks, and tells every watcher.
func (u *Unit) Resize(size int64) error {
	r, ok := u.be.(backend.Resizer)
	if !ok {
		return errors.New("backend cannot be resized")
	}
	if size <= 0 || size%int64(u.blockSize) != 0 {
		// Whole blocks, at least one: a size between them would leave a
		// tail no command reaches (or no unit at all).
		return fmt.Errorf("%d bytes is not a positive multiple of its %d-byte block", size, u.blockSize)
	}
	if err := r.Resize(size); err != nil {
		return err
	}
	u.nblocks.Store(uint64(u.be.Size()) >> u.blockBits)
	u.notify()
	return nil
}

// capacityChanged takes the backend's new size after a change made
// elsewhere (backend.CapacityWatcher).
func (u *Unit) capacityChanged() {
	n := uint64(u.be.Size()) >> u.blockBits
	if u.nblocks.Swap(n) == n {
		return
	}
	u.notify()
}

// Stats returns the unit's counters, which every front end adds to.
func (u *Unit) Stats() *Stats { return &u.stats }

// WatchCapacity calls changed after every change of the capacity (on
// the changing goroutine; it must not block) until cancel is called.
func (u *Unit) WatchCapacity(changed func()) (cancel func()) { return u.capWatch.add(changed) }

func (u *Unit) notify() { u.capWatch.each(func(f func()) { f() }) }

// ErrNoUnmap: the backend cannot release blocks (backend.Unmapper).
var ErrNoUnmap = errors.New("backend cannot unmap")

// CanUnmap reports whether the backend releases blocks (Unmap).
func (u *Unit) CanUnmap() bool {
	_, ok := u.be.(backend.Unmapper)
	return ok
}

// Unmap releases length bytes at off so that they read back as zeroes
// (ErrNoUnmap when the backend cannot); against compare-and-write as a
// write is.
func (u *Unit) Unmap(off, length int64) error {
	m, ok := u.be.(backend.Unmapper)
	if !ok {
		return ErrNoUnmap
	}
	release := u.store.Shared()
	defer release()
	return m.Unmap(off, length)
}

// WriteZeroes makes length bytes at off read back as zeroes — released
// where the backend can unmap, else written — durably when durable is
// set.
func (u *Unit) WriteZeroes(off, length int64, durable bool) error {
	if err := u.Unmap(off, length); err != ErrNoUnmap {
		if err == nil && durable {
			err = u.store.Flush()
		}
		return err
	}
	zero := make([]byte, min(length, 1<<20))
	for length > 0 {
		n := min(length, int64(len(zero)))
		if err := u.store.WriteAt(zero[:n], off, false); err != nil {
			return err
		}
		off += n
		length -= n
	}
	if durable {
		return u.store.Flush()
	}
	return nil
}

// Close stops the queue (after it drains) and closes the backend (or
// flushes it, when it has nothing to close).
func (u *Unit) Close() error {
	u.q.Close()
	if c, ok := u.be.(backend.Closer); ok {
		return c.Close()
	}
	return u.store.Flush()
}
