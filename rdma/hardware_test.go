package rdma

import (
	"bytes"
	"testing"
	"unsafe"
)

// arena is a Memory over one Go slice standing in for registered memory:
// enough to check what the hardware PD does with regions and bounces.
type arena struct {
	mem   []byte
	used  map[uintptr]int
	rkey  uint32
	right Access
}

func (a *arena) Alloc(n int) ([]byte, bool) {
	for off := 0; off+n <= len(a.mem); off += 4096 {
		p := uintptr(unsafe.Pointer(&a.mem[off]))
		if _, busy := a.used[p]; !busy {
			a.used[p] = n
			return a.mem[off : off+n], true
		}
	}
	return nil, false
}

func (a *arena) Free(b []byte) { delete(a.used, uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

func (a *arena) inside(b []byte) bool {
	p, lo := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(&a.mem[0]))
	return len(b) > 0 && p >= lo && p+uintptr(len(b)) <= lo+uintptr(len(a.mem))
}

func (a *arena) RemoteKey(b []byte, access Access) (uint32, uint64, bool) {
	if !a.inside(b) || a.right&access != access {
		return 0, 0, false
	}
	return a.rkey, uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))), true
}

func TestHardwareRegions(t *testing.T) {
	a := &arena{mem: make([]byte, 64<<10), used: map[uintptr]int{}, rkey: 0x1234, right: LocalWrite | RemoteRead | RemoteWrite}
	pd := NewHardwarePD("hw0", a)
	mr, err := pd.AllocMR()
	if err != nil {
		t.Fatal(err)
	}
	// Registered memory: the R_Key, the buffer's own address, no copy.
	reg := pd.Alloc(1000)
	stag, err := mr.Map(reg, 0x7000, RemoteWrite)
	if err != nil || stag != 0x1234 || mr.STag() != 0x1234 {
		t.Fatalf("Map = %#x, %v", stag, err)
	}
	if mr.VA() != uint64(uintptr(unsafe.Pointer(&reg[0]))) {
		t.Fatalf("VA %#x is not the buffer's address", mr.VA())
	}
	if len(a.used) != 1 {
		t.Fatalf("registered memory was bounced: %d pieces in use", len(a.used))
	}
	mr.Invalidate()

	// Go memory the peer writes: a bounce, copied out at Invalidate.
	user := make([]byte, 3000)
	if _, err := mr.Map(user, 0, RemoteWrite|LocalWrite); err != nil {
		t.Fatal(err)
	}
	if !a.inside(mr.Buf()) || len(a.used) != 2 {
		t.Fatal("Go memory was not bounced through registered memory")
	}
	copy(mr.Buf(), bytes.Repeat([]byte{0xab}, 3000)) // what the peer's RDMA Write put there
	mr.Invalidate()
	if !bytes.Equal(user, bytes.Repeat([]byte{0xab}, 3000)) {
		t.Fatal("the peer's data did not reach the Go buffer at Invalidate")
	}
	if len(a.used) != 1 {
		t.Fatal("the bounce buffer was not given back")
	}

	// Go memory the peer reads: copied in at Map.
	src := bytes.Repeat([]byte{0x5c}, 2000)
	if _, err := mr.Map(src, 0, RemoteRead); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mr.Buf(), src) {
		t.Fatal("the data to read was not copied into the bounce")
	}
	mr.Deregister()
	if len(a.used) != 1 {
		t.Fatal("Deregister kept the bounce buffer")
	}

	// Rights the memory was not registered with are refused, not faked.
	ro := &arena{mem: make([]byte, 8192), used: map[uintptr]int{}, rkey: 1, right: LocalWrite}
	mr2, _ := NewHardwarePD("hw1", ro).AllocMR()
	if _, err := mr2.Map(make([]byte, 10), 0, RemoteWrite); err == nil {
		t.Fatal("remote write granted on local-only memory")
	}
	// A local region needs no key: the queue pair finds it at post time.
	if _, err := mr2.Map(make([]byte, 10), 0, LocalWrite); err != nil {
		t.Fatal(err)
	}
	// Budget spent: a clear error, nothing mapped.
	full := &arena{mem: make([]byte, 4096), used: map[uintptr]int{}, right: RemoteWrite | LocalWrite}
	mr3, _ := NewHardwarePD("hw2", full).AllocMR()
	if _, err := mr3.Map(make([]byte, 8192), 0, RemoteWrite); err == nil || mr3.Valid() {
		t.Fatalf("an unbackable region was mapped: %v", err)
	}
	// The software PD is untouched by all this.
	if NewDevice("soft").AllocPD().Memory() != nil {
		t.Fatal("a software PD has registered memory")
	}
}

// fakeQP is a queue pair whose device has memory windows: it records the
// bindings and invalidations a region asks for.
type fakeQP struct {
	QP
	next  uint32
	bound map[uint32][]byte // live keys
	freed [][]byte          // memory handed back through Invalidate
}

type fakeWindow struct {
	q    *fakeQP
	key  uint32
	addr uint64
}

func (q *fakeQP) Windows() Windows { return q }

func (q *fakeQP) BindWindow(b []byte, access Access) (Window, error) {
	q.next++
	k := 0x500<<8 | q.next
	q.bound[k] = b
	return &fakeWindow{q: q, key: k, addr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))}, nil
}

func (w *fakeWindow) RKey() uint32 { return w.key }
func (w *fakeWindow) VA() uint64   { return w.addr }
func (w *fakeWindow) Invalidate(free []byte) {
	delete(w.q.bound, w.key)
	if free != nil {
		w.q.freed = append(w.q.freed, free)
	}
}

// With memory windows, each mapping gets a key of its own over just the
// buffer, ended by Invalidate; a bounce buffer goes back through the
// window (freed once the key is dead), never straight to the memory.
func TestHardwareRegionsWithWindows(t *testing.T) {
	// The memory itself grants no remote rights: only windows do.
	a := &arena{mem: make([]byte, 64<<10), used: map[uintptr]int{}, rkey: 0x1234, right: LocalWrite}
	pd := NewHardwarePD("hw0", a)
	q := &fakeQP{bound: map[uint32][]byte{}}
	mr, err := pd.AllocMROn(q)
	if err != nil {
		t.Fatal(err)
	}
	reg := pd.Alloc(1000)
	k1, err := mr.Map(reg, 0, RemoteWrite)
	if err != nil || k1 == 0x1234 || q.bound[k1] == nil || &q.bound[k1][0] != &reg[0] {
		t.Fatalf("Map = %#x, %v; bound %v", k1, err, q.bound)
	}
	if mr.VA() != uint64(uintptr(unsafe.Pointer(&reg[0]))) {
		t.Fatalf("VA %#x is not the buffer's address", mr.VA())
	}
	mr.Invalidate()
	if len(q.bound) != 0 || len(q.freed) != 0 {
		t.Fatalf("after Invalidate: bound %v, freed %d", q.bound, len(q.freed))
	}
	// A Go buffer: bounced, the peer's data copied out at Invalidate,
	// the bounce freed by the window, a new key each time.
	user := make([]byte, 3000)
	k2, err := mr.Map(user, 0, RemoteWrite)
	if err != nil || k2 == k1 {
		t.Fatalf("second Map = %#x (first %#x), %v", k2, k1, err)
	}
	copy(q.bound[k2], "from the peer")
	busy := len(a.used)
	mr.Invalidate()
	if !bytes.HasPrefix(user, []byte("from the peer")) {
		t.Fatalf("the peer's data was not copied out: %q", user[:13])
	}
	if len(q.freed) != 1 || len(a.used) != busy {
		t.Fatalf("the bounce buffer went back %d times through the window, memory pieces %d→%d", len(q.freed), busy, len(a.used))
	}
	// Local access needs no window.
	if _, err := mr.Map(user, 0, LocalWrite); err != nil || len(q.bound) != 0 {
		t.Fatalf("a local mapping bound a window: %v %v", err, q.bound)
	}
	mr.Deregister()
	// Without a queue pair offering windows, remote access needs rights
	// the memory does not have here.
	plain, _ := pd.AllocMR()
	if _, err := plain.Map(reg, 0, RemoteWrite); err == nil {
		t.Fatal("a region without windows mapped memory that grants no remote rights")
	}
}

// TestSettleCopiesOutOnce: Settle puts what the peer wrote into a bounce
// in the caller's buffer at once and gives the bounce back; the
// Invalidate that follows copies nothing more (a bounce reused by another
// region meanwhile does not reach this buffer). Registered memory, never
// bounced, is left as it is.
func TestSettleCopiesOutOnce(t *testing.T) {
	a := &arena{mem: make([]byte, 64<<10), used: map[uintptr]int{}, rkey: 0x77, right: LocalWrite | RemoteRead | RemoteWrite}
	pd := NewHardwarePD("hw3", a)
	mr, _ := pd.AllocMR()
	user := make([]byte, 3000)
	if _, err := mr.Map(user, 0, RemoteWrite|LocalWrite); err != nil {
		t.Fatal(err)
	}
	bounce := mr.Buf()
	copy(bounce, bytes.Repeat([]byte{0xcd}, 3000))
	mr.Settle()
	if !bytes.Equal(user, bytes.Repeat([]byte{0xcd}, 3000)) {
		t.Fatal("Settle did not copy the peer's data out of the bounce")
	}
	if len(a.used) != 0 {
		t.Fatal("Settle kept the bounce buffer")
	}
	copy(bounce, bytes.Repeat([]byte{0xee}, 3000)) // the bounce, reused
	mr.Invalidate()
	if !bytes.Equal(user, bytes.Repeat([]byte{0xcd}, 3000)) {
		t.Fatal("Invalidate after Settle copied a reused bounce into the buffer")
	}
	reg := pd.Alloc(1000)
	if _, err := mr.Map(reg, 0, RemoteWrite); err != nil {
		t.Fatal(err)
	}
	mr.Settle()
	if len(a.used) != 1 || !mr.Valid() {
		t.Fatalf("Settle on registered memory: %d pieces in use, valid %v", len(a.used), mr.Valid())
	}
}
