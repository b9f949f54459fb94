package tcptarget

import (
	"context"
	"sync"
	"testing"

	"github.com/blockwire/blockwire/nvme/tcphost"
)

// benchIO runs b.N commands of size bytes at queue depth qd over one I/O
// queue against a memory namespace, host and target on loopback.
func benchIO(b *testing.B, size, qd int, write bool) {
	f := start(b, Options{}, nil)
	c, err := tcphost.Connect(context.Background(), f.addr, testNQN, tcphost.Options{QueueSize: qd + 1})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	per := b.N / qd
	for g := range qd {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := make([]byte, size)
			ctx := context.Background()
			n := per
			if g == 0 {
				n += b.N % qd
			}
			for i := range n {
				lba := uint64((g*per+i)%(16<<20/size)) * uint64(size/512)
				var err error
				if write {
					err = c.Write(ctx, 1, 512, lba, p, false)
				} else {
					err = c.Read(ctx, 1, 512, lba, p)
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func BenchmarkRead4KQD1(b *testing.B)    { benchIO(b, 4096, 1, false) }
func BenchmarkRead4KQD32(b *testing.B)   { benchIO(b, 4096, 32, false) }
func BenchmarkWrite4KQD32(b *testing.B)  { benchIO(b, 4096, 32, true) }
func BenchmarkRead128KQD8(b *testing.B)  { benchIO(b, 128<<10, 8, false) }
func BenchmarkWrite128KQD8(b *testing.B) { benchIO(b, 128<<10, 8, true) }

// TestNoAllocationsPerIO: a read and a write of 4 KiB and of 128 KiB
// (in the capsule and through R2T) allocate nothing, on the target or
// on the host, once the queue is warm.
func TestNoAllocationsPerIO(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race; .ci/run runs this test without it")
	}
	for _, dg := range []bool{false, true} {
		f := start(t, Options{}, nil)
		c := f.connect(tcphost.Options{HeaderDigest: dg, DataDigest: dg})
		ctx := context.Background()
		small, big, huge := make([]byte, 4096), make([]byte, 128<<10), make([]byte, 512<<10)
		round := func() {
			for _, p := range [][]byte{small, big, huge} {
				if err := c.Write(ctx, 1, 512, 64, p, false); err != nil {
					t.Fatal(err)
				}
				if err := c.Read(ctx, 1, 512, 64, p); err != nil {
					t.Fatal(err)
				}
			}
		}
		round()
		if a := testing.AllocsPerRun(100, round); a > 0 {
			t.Errorf("digests %v: %.1f allocations per round of 6 I/Os", dg, a)
		}
		c.Close()
	}
}
