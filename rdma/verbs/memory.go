package verbs

import (
	"fmt"
	"log/slog"
	"math/bits"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/blockwire/blockwire/rdma"
)

// Registered memory. A device registers memory in chunks mapped outside
// the Go heap (mmap), so the garbage collector never sees, moves or frees
// what the hardware may be reading or writing by DMA; each chunk is cut
// into pieces of one power-of-two size class and the pieces are pooled.
// Ownership: a piece belongs to whoever got it from Alloc until it is
// given to Free; a piece posted in a work request belongs to the queue
// pair until the request completes. Chunks are kept until the device
// closes (registration costs a system call and pins pages: it is done
// once, not per I/O) and their total is bounded by Options.MaxMemory.

const (
	minClassShift = 12 // 4 KiB: a page
	maxClassShift = 24 // 16 MiB: the largest task buffer pooled
	chunkSize     = 4 << 20
)

// registrar registers a mapping with the device and deregisters it.
type registrar interface {
	register(b []byte, access rdma.Access) (lkey, rkey uint32, handle any, err error)
	deregister(handle any)
}

type chunk struct {
	start, end uintptr
	mem        []byte
	class      int // piece size shift
	lkey, rkey uint32
	handle     any
}

// memory is a device's registered memory: rdma.Memory for its PD.
type memory struct {
	reg    registrar
	access rdma.Access
	max    int

	log *slog.Logger

	mu     sync.Mutex
	total  int
	warned bool
	out    int  // pieces handed out and not given back
	closed bool // deregistered: Alloc hands out nothing more
	free   [maxClassShift + 1][][]byte
	// chunks, sorted by address, replaced whole on growth so lookups on
	// the I/O path take no lock.
	chunks atomic.Pointer[[]*chunk]
}

func newMemory(reg registrar, access rdma.Access, max int) *memory {
	m := &memory{reg: reg, access: access, max: max}
	m.chunks.Store(&[]*chunk{})
	return m
}

func classOf(n int) int {
	if n <= 1<<minClassShift {
		return minClassShift
	}
	return bits.Len(uint(n - 1))
}

// Alloc implements rdma.Memory.
func (m *memory) Alloc(n int) ([]byte, bool) {
	if n <= 0 {
		n = 1
	}
	c := classOf(n)
	if c > maxClassShift {
		return nil, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, false
	}
	if k := len(m.free[c]); k > 0 {
		b := m.free[c][k-1]
		m.free[c] = m.free[c][:k-1]
		m.out++
		return b[:n], true
	}
	if err := m.growLocked(c); err != nil {
		if !m.warned {
			// Once: the pools fall back to Go memory and bounce copies.
			m.warned = true
			if m.log != nil {
				m.log.Warn("verbs: no more registered memory (rdma_memory): new buffers come from the Go heap and move through bounce copies, "+
					"which need registered memory too — I/O that finds none is answered TASK SET FULL and SRP logins are refused until some is free", "err", err)
			}
		}
		return nil, false
	}
	k := len(m.free[c])
	b := m.free[c][k-1]
	m.free[c] = m.free[c][:k-1]
	m.out++
	return b[:n], true
}

// growLocked registers a new chunk cut into pieces of class c.
func (m *memory) growLocked(c int) error {
	size := max(chunkSize, 1<<c)
	if m.total+size > m.max {
		return fmt.Errorf("verbs: registered memory budget of %d bytes spent", m.max)
	}
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("verbs: mmap %d bytes: %w", size, err)
	}
	lkey, rkey, h, err := m.reg.register(mem, m.access)
	if err != nil {
		syscall.Munmap(mem)
		return err
	}
	m.total += size
	ch := &chunk{mem: mem, class: c, lkey: lkey, rkey: rkey, handle: h}
	ch.start = addrOf(mem)
	ch.end = ch.start + uintptr(size)
	for off := 0; off+1<<c <= size; off += 1 << c {
		m.free[c] = append(m.free[c], mem[off:off+1<<c:off+1<<c])
	}
	old := *m.chunks.Load()
	next := append(append(make([]*chunk, 0, len(old)+1), old...), ch)
	sort.Slice(next, func(i, j int) bool { return next[i].start < next[j].start })
	m.chunks.Store(&next)
	return nil
}

// find returns the chunk holding all of b, or nil.
func (m *memory) find(b []byte) *chunk {
	if len(b) == 0 {
		return nil
	}
	a := addrOf(b)
	cs := *m.chunks.Load()
	i := sort.Search(len(cs), func(i int) bool { return cs[i].end > a })
	if i == len(cs) || a < cs[i].start || a+uintptr(len(b)) > cs[i].end {
		return nil
	}
	return cs[i]
}

// Free implements rdma.Memory.
func (m *memory) Free(b []byte) {
	ch := m.find(b[:min(1, cap(b))])
	if ch == nil {
		return
	}
	a := addrOf(b[:1])
	if (a-ch.start)&(1<<ch.class-1) != 0 {
		return // not the start of a piece
	}
	off := a - ch.start
	m.mu.Lock()
	m.out--
	m.free[ch.class] = append(m.free[ch.class], ch.mem[off:off+1<<ch.class:off+1<<ch.class])
	m.mu.Unlock()
}

// LocalKey is the local key of registered memory holding b.
func (m *memory) LocalKey(b []byte) (uint32, bool) {
	ch := m.find(b)
	if ch == nil {
		return 0, false
	}
	return ch.lkey, true
}

// RemoteKey implements rdma.Memory.
func (m *memory) RemoteKey(b []byte, access rdma.Access) (uint32, uint64, bool) {
	ch := m.find(b)
	if ch == nil || m.access&access != access {
		return 0, 0, false
	}
	return ch.rkey, uint64(addrOf(b)), true
}

// Registered is how many bytes are registered.
func (m *memory) Registered() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.total
}

// close deregisters every chunk: the device reaches none of it any more,
// and Alloc hands out nothing. Pieces still held (a task's buffer while
// the device went away) stay valid memory for their holders: the chunks
// are unmapped only when none is held, otherwise left to the process.
func (m *memory) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.closed = true
	chunks := *m.chunks.Load()
	m.chunks.Store(&[]*chunk{})
	for _, ch := range chunks {
		m.reg.deregister(ch.handle)
		if m.out == 0 {
			syscall.Munmap(ch.mem)
		}
	}
	m.free = [maxClassShift + 1][][]byte{}
	m.total = 0
}

func memlockError(limit uint64, need int, ipcLock bool) error {
	if ipcLock || limit == ^uint64(0) || limit >= uint64(need) {
		return nil
	}
	return fmt.Errorf("verbs: the locked-memory limit RLIMIT_MEMLOCK (ulimit -l) is %d KiB, and registering RDMA buffers may need %d KiB (rdma_memory): "+
		"raise it (ulimit -l %d; LimitMEMLOCK=infinity in the systemd unit; memlock in limits.conf) or lower rdma_memory",
		limit/1024, need/1024, (need+1023)/1024)
}

// addrOf is the address of b's first byte (b is not empty).
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// sendOrder is a send queue's outstanding requests in posting order: what
// a completion says is done. A completion covers its own request and the
// unsignaled ones posted before it (they never complete on their own);
// signaled ones before it keep their place, since an RDMA Read may
// complete after Sends posted behind it (siw does).
type sendOrder struct{ fifo []int }

func (o *sendOrder) post(slot int) { o.fifo = append(o.fifo, slot) }

// complete calls done for each request the completion of slot finishes,
// oldest first; a slot not outstanding finishes nothing.
func (o *sendOrder) complete(slot int, signaled func(int) bool, done func(int)) {
	at := slices.Index(o.fifo, slot)
	if at < 0 {
		return
	}
	kept := o.fifo[:0]
	for k, j := range o.fifo {
		if k > at || (j != slot && signaled(j)) {
			kept = append(kept, j)
			continue
		}
		done(j)
	}
	o.fifo = kept
}
