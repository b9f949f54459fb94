package siw

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/blockwire/blockwire/rdma"
)

// The benchmarks compare RDMA Write and RDMA Read through the software
// iWARP device with raw TCP on the same loopback, at 4 KiB and 128 KiB,
// with 16 operations in flight. Ratios between them (in one run) are
// what docs/bench/journal.md reports; -benchmem shows the steady state
// allocates nothing per operation.

const benchDepth = 16

func benchSizes(b *testing.B, run func(b *testing.B, size int)) {
	for _, size := range []int{4 << 10, 128 << 10} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) { run(b, size) })
	}
}

func benchPair(b *testing.B, opt Options) (a, z *end) {
	f := New(opt)
	ln, err := f.Listen("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	a, z = newEndSize(0, 4<<20), newEndSize(0, 4<<20)
	ch := make(chan rdma.QP, 1)
	go func() {
		r, err := ln.Accept(context.Background())
		if err != nil {
			ch <- nil
			return
		}
		p := z.params(nil)
		p.QP.IRD = benchDepth
		qp, _ := r.Accept(p)
		ch <- qp
	}()
	p := a.params(nil)
	p.QP.ORD = benchDepth
	qa, _, err := f.Dial(context.Background(), ln.Addr().String(), p)
	if err != nil {
		b.Fatal(err)
	}
	a.qp, z.qp = qa, <-ch
	b.Cleanup(func() { qa.Close(); z.qp.Close() })
	return a, z
}

// pump keeps benchDepth requests in flight until b.N have completed on
// cq; each completion goes to done (nil: none needed).
func pump(b *testing.B, a *end, wr rdma.SendWR, cq *rdma.CQ, done func(rdma.Completion)) {
	var cs [benchDepth]rdma.Completion
	ctx := context.Background()
	posted, finished := 0, 0
	b.ResetTimer()
	for finished < b.N {
		for posted < b.N && posted-finished < benchDepth {
			if err := a.qp.PostSend(&wr); err != nil {
				b.Fatal(err)
			}
			posted++
		}
		n, err := cq.Wait(ctx, cs[:])
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range cs[:n] {
			if c.Status != rdma.Success {
				b.Fatalf("%+v (%v)", c, a.qp.Err())
			}
			if done != nil {
				done(c)
			}
		}
		finished += n
	}
}

func BenchmarkRDMAWrite(b *testing.B) {
	for _, crc := range []bool{false, true} {
		b.Run(fmt.Sprintf("crc=%v", crc), func(b *testing.B) {
			benchSizes(b, func(b *testing.B, size int) {
				a, z := benchPair(b, Options{CRC: crc})
				b.SetBytes(int64(size))
				b.ReportAllocs()
				src := make([]byte, size)
				sg := [][]byte{src}
				pump(b, a, rdma.SendWR{Op: rdma.OpWrite, SG: sg, RemoteSTag: z.mr.STag(), RemoteTO: 0}, a.scq, nil)
			})
		})
	}
}

func BenchmarkRDMARead(b *testing.B) {
	for _, crc := range []bool{false, true} {
		b.Run(fmt.Sprintf("crc=%v", crc), func(b *testing.B) {
			benchSizes(b, func(b *testing.B, size int) {
				a, z := benchPair(b, Options{CRC: crc})
				b.SetBytes(int64(size))
				b.ReportAllocs()
				pump(b, a, rdma.SendWR{Op: rdma.OpRead, RemoteSTag: z.mr.STag(), Sink: a.mr, Length: size}, a.scq, nil)
			})
		})
	}
}

func BenchmarkSend(b *testing.B) {
	benchSizes(b, func(b *testing.B, size int) {
		a, z := benchPair(b, Options{})
		b.SetBytes(int64(size))
		b.ReportAllocs()
		// A Send completes once it is on the wire, not when the peer has
		// it, so the flow control here is the receiver's: as a credit
		// scheme would, the sender keeps at most benchDepth Sends beyond
		// the receive completions, and the receiver reposts at once.
		for i := 0; i < benchDepth; i++ {
			z.qp.PostRecv(rdma.RecvWR{ID: uint64(i), Buf: z.mem[i*size : (i+1)*size]})
		}
		go func() {
			var cs [benchDepth]rdma.Completion
			for {
				if _, err := a.scq.Wait(context.Background(), cs[:]); err != nil {
					return
				}
			}
		}()
		b.Cleanup(a.scq.Close)
		wr := rdma.SendWR{Op: rdma.OpSend, SG: [][]byte{make([]byte, size)}, Unsignaled: true}
		pump(b, a, wr, z.rcq, func(c rdma.Completion) {
			z.qp.PostRecv(rdma.RecvWR{ID: c.ID, Buf: z.mem[int(c.ID)*size : int(c.ID+1)*size]})
		})
	})
}

// BenchmarkTCP is the ceiling: the same bytes written to a loopback TCP
// connection and read into a buffer on the other side.
func BenchmarkTCP(b *testing.B) {
	benchSizes(b, func(b *testing.B, size int) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		got := make(chan int64, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, size)
			var n int64
			for {
				k, err := io.ReadFull(c, buf)
				n += int64(k)
				if err != nil {
					got <- n
					return
				}
			}
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		src := make([]byte, size)
		b.SetBytes(int64(size))
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := c.Write(src); err != nil {
				b.Fatal(err)
			}
		}
		c.Close()
		<-got
	})
}
