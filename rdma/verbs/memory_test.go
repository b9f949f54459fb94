package verbs

import (
	"fmt"
	"strings"
	"testing"

	"github.com/blockwire/blockwire/rdma"
)

// keys is a registrar that hands out keys without a device.
type keys struct {
	n     uint32
	live  map[any]bool
	sizes []int
}

func (k *keys) register(b []byte, _ rdma.Access) (uint32, uint32, any, error) {
	k.n++
	h := k.n
	k.live[h] = true
	k.sizes = append(k.sizes, len(b))
	return 0x100 + h, 0x200 + h, h, nil
}

func (k *keys) deregister(h any) { delete(k.live, h) }

func TestMemoryPoolsAndBounds(t *testing.T) {
	reg := &keys{live: map[any]bool{}}
	m := newMemory(reg, rdma.LocalWrite|rdma.RemoteWrite, 8<<20)
	a, ok := m.Alloc(5000) // the 8 KiB class: one 4 MiB chunk
	if !ok || len(a) != 5000 || cap(a) != 8192 {
		t.Fatalf("Alloc(5000) = len %d cap %d ok %v", len(a), cap(a), ok)
	}
	if k, ok := m.LocalKey(a[100:200]); !ok || k != 0x101 {
		t.Fatalf("LocalKey inside = %#x %v", k, ok)
	}
	if _, _, ok := m.RemoteKey(a, rdma.RemoteRead); ok {
		t.Fatal("remote read granted on memory registered without it")
	}
	rk, va, ok := m.RemoteKey(a[8:], rdma.RemoteWrite)
	if !ok || rk != 0x201 || va != uint64(addrOf(a))+8 {
		t.Fatalf("RemoteKey = %#x %#x %v", rk, va, ok)
	}
	if _, ok := m.LocalKey(make([]byte, 10)); ok {
		t.Fatal("Go memory reported registered")
	}
	// A piece comes back and is handed out again, not a new one.
	m.Free(a)
	b, _ := m.Alloc(8000)
	if addrOf(b) != addrOf(a) {
		t.Fatal("a freed piece was not reused")
	}
	// The budget: a 4 MiB chunk of 4 MiB pieces fits, the next does not.
	if _, ok := m.Alloc(4 << 20); !ok {
		t.Fatal("second chunk refused within the budget")
	}
	if _, ok := m.Alloc(4 << 20); ok {
		t.Fatal("the budget was exceeded")
	}
	if got := m.Registered(); got != 8<<20 {
		t.Fatalf("registered %d", got)
	}
	if _, ok := m.Alloc(32 << 20); ok {
		t.Fatal("a piece above 16 MiB was handed out")
	}
	m.Free(make([]byte, 64)) // not ours: ignored
	held, ok := m.Alloc(5000)
	if !ok {
		t.Fatal("no piece of a class with free pieces")
	}
	m.close()
	if len(reg.live) != 0 {
		t.Fatalf("%d registrations left after close", len(reg.live))
	}
	// The device went away while a task held a piece: the piece stays
	// memory its holder may use; nothing more is handed out.
	held[0], held[99] = 1, 2
	m.Free(held)
	if _, ok := m.Alloc(100); ok {
		t.Fatal("Alloc after close")
	}
}

func TestMemlockReportedAtStart(t *testing.T) {
	err := memlockError(64<<10, 256<<20, false)
	if err == nil || !strings.Contains(err.Error(), "RLIMIT_MEMLOCK") || !strings.Contains(err.Error(), "262144 KiB") || !strings.Contains(err.Error(), "64 KiB") {
		t.Fatalf("err = %v", err)
	}
	for _, c := range []struct {
		limit uint64
		ipc   bool
	}{{^uint64(0), false}, {1 << 30, false}, {64 << 10, true}} {
		if err := memlockError(c.limit, 256<<20, c.ipc); err != nil {
			t.Errorf("limit %d ipc %v: %v", c.limit, c.ipc, err)
		}
	}
}

// A Send's completion finishes the unsignaled requests before it, not a
// signaled RDMA Read before it: siw completes Reads after later Sends, and
// a Read taken for done there handed out a buffer the data had not reached.
func TestSendOrderReadsCompleteOnTheirOwn(t *testing.T) {
	var o sendOrder
	sig := map[int]bool{0: true, 1: false, 2: true, 3: false, 4: true}
	for i := 0; i < 5; i++ { // read, write, send, write, send
		o.post(i)
	}
	var got []int
	done := func(j int) { got = append(got, j) }
	o.complete(2, func(j int) bool { return sig[j] }, done)
	if fmt.Sprint(got) != "[1 2]" || fmt.Sprint(o.fifo) != "[0 3 4]" {
		t.Fatalf("send 2 done: finished %v, left %v", got, o.fifo)
	}
	got = nil
	o.complete(0, func(j int) bool { return sig[j] }, done)
	if fmt.Sprint(got) != "[0]" || fmt.Sprint(o.fifo) != "[3 4]" {
		t.Fatalf("read 0 done: finished %v, left %v", got, o.fifo)
	}
	got = nil
	o.complete(4, func(j int) bool { return sig[j] }, done)
	o.complete(4, func(j int) bool { return sig[j] }, done) // again: nothing
	if fmt.Sprint(got) != "[3 4]" || len(o.fifo) != 0 {
		t.Fatalf("send 4 done: finished %v, left %v", got, o.fifo)
	}
}
