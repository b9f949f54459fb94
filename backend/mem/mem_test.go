package mem

import (
	"bytes"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestSizeCostsLittle: a LUN's size alone costs a pointer per GiB — a
// 1 PiB LUN takes megabytes, not the tens of gigabytes one chunk header per MiB
// took (a resize to 2^62 bytes through the admin API killed the process)
// — and a size past MaxSize is refused, leaving the disk as it was.
func TestSizeCostsLittle(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	d, err := New(MaxSize)
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if grew := after.HeapAlloc - before.HeapAlloc; grew > 64<<20 { // 8 MiB of page table (twice that under -race)
		t.Fatalf("a %d-byte disk took %d bytes of heap", int64(MaxSize), grew)
	}
	if _, err := New(MaxSize + 1); err == nil {
		t.Fatal("New past MaxSize accepted")
	}
	if err := d.Resize(1 << 62); err == nil || d.Size() != MaxSize {
		t.Fatalf("Resize(2^62): %v, size %d", err, d.Size())
	}
	// Writes far apart make only their own chunks; what lies between
	// reads as zeroes and is reported unmapped in one extent.
	p := bytes.Repeat([]byte{7}, 4096)
	for _, off := range []int64{0, 1 << 40, MaxSize - 4096} {
		if _, err := d.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	mapped, end, err := d.Mapped(1 << 20)
	if err != nil || mapped || end != 1<<40 {
		t.Fatalf("Mapped(1 MiB) = %v, %d, %v; want unmapped to 1 TiB", mapped, end, err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Mapped over 1 TiB unwritten took %v", took)
	}
	q := make([]byte, 8192)
	d.ReadAt(q, 1<<40-4096)
	if !bytes.Equal(q[:4096], make([]byte, 4096)) || !bytes.Equal(q[4096:], p) {
		t.Fatal("read across an unwritten and a written chunk")
	}
}

// TestShrinkThenGrowReadsZeroes: what lay past a shrunk end — in the last
// chunk, later chunks of its page, later pages — reads as zeroes once the
// disk grows again.
func TestShrinkThenGrowReadsZeroes(t *testing.T) {
	d, _ := New(3 << 30)
	p := bytes.Repeat([]byte{9}, 3<<20)
	for _, off := range []int64{0, 1<<30 - 1<<20, 2<<30 + 5} {
		if _, err := d.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Resize(1<<30 - 1<<19); err != nil { // mid-chunk, in the first page
		t.Fatal(err)
	}
	if err := d.Resize(3 << 30); err != nil {
		t.Fatal(err)
	}
	q := make([]byte, 3<<20)
	d.ReadAt(q, 1<<30-1<<20)
	if !bytes.Equal(q[:1<<19], p[:1<<19]) || !bytes.Equal(q[1<<19:], make([]byte, len(q)-1<<19)) {
		t.Fatal("data past the shrunk end came back in its last chunk or page")
	}
	d.ReadAt(q, 2<<30+5)
	if !bytes.Equal(q, make([]byte, len(q))) {
		t.Fatal("data past the shrunk end came back in a later page")
	}
	d.ReadAt(q, 0)
	if !bytes.Equal(q, p) {
		t.Fatal("data before the shrunk end lost")
	}
	// Unmapping a whole chunk frees it; a partial one is zeroed.
	if err := d.Unmap(0, 1<<20+4096); err != nil {
		t.Fatal(err)
	}
	if m, end, _ := d.Mapped(0); m || end != 1<<20 {
		t.Fatalf("after unmap: Mapped(0) = %v, %d", m, end)
	}
	d.ReadAt(q[:8192], 1<<20)
	if !bytes.Equal(q[:4096], make([]byte, 4096)) || !bytes.Equal(q[4096:8192], p[:4096]) {
		t.Fatal("partial unmap")
	}
}

// TestConcurrentFirstWrites: writers racing into chunks and a page never
// written before, with a resize beside them, all land (run with -race).
func TestConcurrentFirstWrites(t *testing.T) {
	d, _ := New(4 << 30)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := bytes.Repeat([]byte{byte(g + 1)}, 512)
			for i := range 64 {
				off := int64(3<<30) + int64(i)<<20 + int64(g)*512
				if _, err := d.WriteAt(b, off); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 32 {
			d.Resize(5 << 30)
			d.Resize(4 << 30)
		}
	}()
	wg.Wait()
	q := make([]byte, 512)
	for g := range 8 {
		for i := range 64 {
			d.ReadAt(q, int64(3<<30)+int64(i)<<20+int64(g)*512)
			if !bytes.Equal(q, bytes.Repeat([]byte{byte(g + 1)}, 512)) {
				t.Fatalf("writer %d, chunk %d: lost", g, i)
			}
		}
	}
}

// BenchmarkReadAt4K and BenchmarkWriteAt4K: the memory LUN's per-I/O cost
// (the page table lookup on every chunk).
func BenchmarkReadAt4K(b *testing.B) {
	d, _ := New(1 << 30)
	p := make([]byte, 4096)
	for off := int64(0); off < 1<<30; off += 1 << 20 {
		d.WriteAt(p, off)
	}
	b.SetBytes(4096)
	var i int64
	for b.Loop() {
		d.ReadAt(p, (i*7919%262144)*4096)
		i++
	}
}

func BenchmarkWriteAt4K(b *testing.B) {
	d, _ := New(1 << 30)
	p := make([]byte, 4096)
	b.SetBytes(4096)
	var i int64
	for b.Loop() {
		d.WriteAt(p, (i*7919%262144)*4096)
		i++
	}
}
