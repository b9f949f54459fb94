package siw

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/blockwire/blockwire/rdma"
)

// end is one side of a test connection.
type end struct {
	dev   *rdma.Device
	pd    *rdma.PD
	scq   *rdma.CQ
	rcq   *rdma.CQ
	qp    rdma.QP
	mem   []byte // registered region (with guard bytes around it)
	mr    *rdma.MR
	va    uint64
	model []byte // what mem[guard:guard+size] must hold
}

const (
	guard   = 64
	regSize = 1 << 20
)

func newEnd(va uint64) *end { return newEndSize(va, regSize) }

func newEndSize(va uint64, size int) *end {
	dev := rdma.NewDevice("test")
	e := &end{dev: dev, pd: dev.AllocPD(), scq: rdma.NewCQ(64), rcq: rdma.NewCQ(64), va: va}
	e.mem = bytes.Repeat([]byte{0xEE}, size+2*guard)
	e.model = bytes.Repeat([]byte{0xEE}, size)
	mr, err := e.pd.Register(e.mem[guard:guard+size], va, rdma.LocalWrite|rdma.RemoteRead|rdma.RemoteWrite)
	if err != nil {
		panic(err)
	}
	e.mr = mr
	return e
}

func (e *end) params(pd []byte) rdma.ConnParams {
	return rdma.ConnParams{PD: e.pd, QP: rdma.QPConfig{SendCQ: e.scq, RecvCQ: e.rcq, IRD: 8, ORD: 8, RecvDepth: 256}, PrivateData: pd}
}

// settle remaps the region after the test has read it. Placement into
// registered memory is ordered after our reads by the socket, which the
// race detector cannot see; remapping takes the device lock that every
// later placement takes too, which it can.
func (e *end) settle(t *testing.T) {
	t.Helper()
	if _, err := e.mr.Map(e.mem[guard:guard+regSize], e.va, rdma.LocalWrite|rdma.RemoteRead|rdma.RemoteWrite); err != nil {
		t.Fatal(err)
	}
}

func (e *end) checkGuards(t *testing.T) {
	t.Helper()
	for i := 0; i < guard; i++ {
		if e.mem[i] != 0xEE || e.mem[len(e.mem)-1-i] != 0xEE {
			t.Fatalf("bytes outside the registered region changed")
		}
	}
}

// connect makes a connected pair over loopback TCP.
func connect(t *testing.T, opt Options) (a, b *end) {
	t.Helper()
	f := New(opt)
	ln, err := f.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	a, b = newEnd(0), newEnd(0xff27ed3605690000)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		qp  rdma.QP
		pd  []byte
		err error
	}
	ch := make(chan res, 1)
	go func() {
		r, err := ln.Accept(ctx)
		if err != nil {
			ch <- res{err: err}
			return
		}
		pd := r.PrivateData()
		qp, err := r.Accept(b.params([]byte("reply")))
		ch <- res{qp, pd, err}
	}()
	qa, rpd, err := f.Dial(ctx, ln.Addr().String(), a.params([]byte("hello private data")))
	if err != nil {
		t.Fatal(err)
	}
	rb := <-ch
	if rb.err != nil {
		t.Fatal(rb.err)
	}
	if string(rpd) != "reply" || string(rb.pd) != "hello private data" {
		t.Fatalf("private data: reply %q, request %q", rpd, rb.pd)
	}
	a.qp, b.qp = qa, rb.qp
	t.Cleanup(func() { qa.Close(); rb.qp.Close() })
	return a, b
}

func wait(t *testing.T, cq *rdma.CQ) rdma.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var c [1]rdma.Completion
	if _, err := cq.Wait(ctx, c[:]); err != nil {
		t.Fatalf("waiting for a completion: %v", err)
	}
	return c[0]
}

func fill(r *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

// TestModel runs random sequences of Sends, RDMA Writes and RDMA Reads in
// both directions and checks every byte against a model, for each MPA
// variant: revision 1 and 2, CRC on and off, large and tiny FPDUs.
func TestModel(t *testing.T) {
	for _, opt := range []Options{
		{Revision: 2},
		{Revision: 2, CRC: true},
		{Revision: 1},
		{Revision: 1, CRC: true, MULPDU: 1000},
		{Revision: 2, MULPDU: 77},
	} {
		t.Run(fmt.Sprintf("rev%d-crc%v-mulpdu%d", opt.Revision, opt.CRC, opt.MULPDU), func(t *testing.T) {
			a, b := connect(t, opt)
			r := rand.New(rand.NewPCG(uint64(opt.Revision), uint64(opt.MULPDU)))
			for step := 0; step < 150; step++ {
				from, to := a, b
				if r.IntN(2) == 1 {
					from, to = b, a
				}
				switch r.IntN(3) {
				case 0: // Send, possibly in several gather pieces
					n := r.IntN(200000)
					if r.IntN(4) == 0 {
						n = r.IntN(8)
					}
					msg := make([]byte, n)
					fill(r, msg)
					buf := make([]byte, n+r.IntN(100))
					if err := to.qp.PostRecv(rdma.RecvWR{ID: uint64(step), Buf: buf}); err != nil {
						t.Fatal(err)
					}
					cut := r.IntN(n + 1)
					wr := rdma.SendWR{ID: uint64(step), Op: rdma.OpSend, SG: [][]byte{msg[:cut], msg[cut:]}, Solicited: r.IntN(2) == 0}
					if err := from.qp.PostSend(&wr); err != nil {
						t.Fatal(err)
					}
					sc := wait(t, from.scq)
					rc := wait(t, to.rcq)
					if sc.Status != rdma.Success || sc.ID != uint64(step) || sc.Len != n {
						t.Fatalf("send completion %+v", sc)
					}
					if rc.Status != rdma.Success || rc.ID != uint64(step) || rc.Len != n || rc.Solicited != wr.Solicited {
						t.Fatalf("recv completion %+v (errors %v / %v)", rc, from.qp.Err(), to.qp.Err())
					}
					if !bytes.Equal(buf[:n], msg) {
						t.Fatalf("step %d: received Send differs", step)
					}
				case 1: // RDMA Writes, then a Send that proves they are placed
					for k := r.IntN(4) + 1; k > 0; k-- {
						n := r.IntN(150000)
						off := r.IntN(regSize - n + 1)
						data := make([]byte, n)
						fill(r, data)
						copy(to.model[off:], data)
						wr := rdma.SendWR{ID: 1, Op: rdma.OpWrite, SG: [][]byte{data}, RemoteSTag: to.mr.STag(), RemoteTO: to.va + uint64(off), Unsignaled: r.IntN(2) == 0}
						if err := from.qp.PostSend(&wr); err != nil {
							t.Fatal(err)
						}
					}
					buf := make([]byte, 4)
					to.qp.PostRecv(rdma.RecvWR{ID: 99, Buf: buf})
					from.qp.PostSend(&rdma.SendWR{ID: 2, Op: rdma.OpSend, SG: [][]byte{[]byte("done")}})
					for {
						if c := wait(t, from.scq); c.Status != rdma.Success {
							t.Fatalf("write completion %+v", c)
						} else if c.ID == 2 {
							break
						}
					}
					if c := wait(t, to.rcq); c.Status != rdma.Success || c.Len != 4 {
						t.Fatalf("recv %+v", c)
					}
					if !bytes.Equal(to.mem[guard:guard+regSize], to.model) {
						t.Fatalf("step %d: written region differs from the model", step)
					}
					to.settle(t)
				case 2: // RDMA Read from the peer into our region
					n := r.IntN(300000)
					src := r.IntN(regSize - n + 1)
					dst := r.IntN(regSize - n + 1)
					copy(from.model[dst:], to.model[src:src+n])
					wr := rdma.SendWR{ID: uint64(step), Op: rdma.OpRead, RemoteSTag: to.mr.STag(), RemoteTO: to.va + uint64(src),
						Sink: from.mr, SinkTO: from.va + uint64(dst), Length: n}
					if err := from.qp.PostSend(&wr); err != nil {
						t.Fatal(err)
					}
					if c := wait(t, from.scq); c.Status != rdma.Success || c.Len != n || c.Op != rdma.OpRead {
						t.Fatalf("read completion %+v", c)
					}
					if !bytes.Equal(from.mem[guard:guard+regSize], from.model) {
						t.Fatalf("step %d: read region differs from the model", step)
					}
					from.settle(t)
				}
			}
			a.checkGuards(t)
			b.checkGuards(t)
		})
	}
}

// TestPipelined keeps many operations of every kind in flight at once and
// checks completions come back in posting order with ORD respected.
func TestPipelined(t *testing.T) {
	a, b := connect(t, Options{CRC: true})
	const n = 200
	for i := 0; i < n; i++ {
		if err := b.qp.PostRecv(rdma.RecvWR{ID: uint64(i), Buf: make([]byte, 4096)}); err != nil {
			t.Fatal(err)
		}
	}
	fill(rand.New(rand.NewPCG(1, 2)), b.mem[guard:guard+regSize])
	posted := 0
	next := uint64(0)
	for next < n {
		for posted < n && posted-int(next) < 64 {
			wr := rdma.SendWR{ID: uint64(posted)}
			switch posted % 3 {
			case 0:
				wr.Op, wr.SG = rdma.OpSend, [][]byte{[]byte(fmt.Sprint(posted))}
			case 1:
				wr.Op, wr.SG, wr.RemoteSTag, wr.RemoteTO = rdma.OpWrite, [][]byte{make([]byte, 8192)}, b.mr.STag(), b.va
			case 2:
				wr.Op, wr.Sink, wr.SinkTO, wr.Length = rdma.OpRead, a.mr, uint64(posted)*1000, 8192
				wr.RemoteSTag, wr.RemoteTO = b.mr.STag(), b.va+65536
			}
			if err := a.qp.PostSend(&wr); err != nil {
				t.Fatal(err)
			}
			posted++
		}
		c := wait(t, a.scq)
		if c.ID != next || c.Status != rdma.Success {
			t.Fatalf("completion %+v, want ID %d success", c, next)
		}
		next++
	}
	for i := 0; i < (n+2)/3; i++ {
		c := wait(t, b.rcq)
		if c.ID != uint64(i) || c.Status != rdma.Success {
			t.Fatalf("receive %d: %+v", i, c)
		}
	}
}

// TestInvalidate covers local and remote invalidation: a Send with
// Invalidate kills the named STag (and the receiver learns which), a
// Write through it is then refused with a Terminate, and the region's
// bytes stay untouched.
func TestInvalidate(t *testing.T) {
	a, b := connect(t, Options{})
	buf := make([]byte, 4096)
	mr, err := b.pd.AllocMR()
	if err != nil {
		t.Fatal(err)
	}
	stag, err := mr.Map(buf, 0, rdma.RemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	rbuf := make([]byte, 64)
	b.qp.PostRecv(rdma.RecvWR{ID: 7, Buf: rbuf})
	a.qp.PostSend(&rdma.SendWR{Op: rdma.OpWrite, SG: [][]byte{[]byte("before")}, RemoteSTag: stag})
	a.qp.PostSend(&rdma.SendWR{Op: rdma.OpSend, SG: [][]byte{[]byte("resp")}, Invalidate: true, InvalidateSTag: stag, Solicited: true})
	c := wait(t, b.rcq)
	if !c.Invalidated || c.STag != stag || !c.Solicited || c.Status != rdma.Success {
		t.Fatalf("receive %+v", c)
	}
	if mr.Valid() {
		t.Fatal("region still valid after Send with Invalidate")
	}
	if string(buf[:6]) != "before" {
		t.Fatalf("write before invalidation not placed: %q", buf[:6])
	}
	a.qp.PostSend(&rdma.SendWR{Op: rdma.OpWrite, SG: [][]byte{[]byte("after!")}, RemoteSTag: stag})
	select {
	case <-b.qp.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("write to an invalidated STag did not end the stream")
	}
	select {
	case <-a.qp.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the writer was not terminated")
	}
	if string(buf[:6]) != "before" {
		t.Fatalf("write through an invalidated STag was placed: %q", buf[:6])
	}
	var te *rdma.TerminateError
	if err := a.qp.Err(); err == nil || !asTerm(err, &te) || !te.Remote || te.Layer != "RDMAP" || te.EType != 1 || te.Code != 0 {
		t.Fatalf("writer's error %v, want a peer Terminate RDMAP/remote protection/invalid STag", a.qp.Err())
	}
	// Remapping gives a new STag; the old one stays dead.
	stag2, _ := mr.Map(buf, 0, rdma.RemoteWrite)
	if stag2 == stag {
		t.Fatal("remap reused the STag")
	}
}

// TestRejectAndPrivateData: the responder refuses with private data and
// the dialer sees a RejectError carrying it.
func TestRejectAndPrivateData(t *testing.T) {
	f := New(Options{})
	ln, err := f.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		r, err := ln.Accept(context.Background())
		if err == nil {
			r.Reject([]byte("go away"))
		}
	}()
	e := newEnd(0)
	_, _, err = f.Dial(context.Background(), ln.Addr().String(), e.params(bytes.Repeat([]byte{1}, 300)))
	re, ok := err.(*rdma.RejectError)
	if !ok || string(re.PrivateData) != "go away" {
		t.Fatalf("dial: %v", err)
	}
	if _, _, err := f.Dial(context.Background(), ln.Addr().String(), e.params(make([]byte, 600))); err == nil {
		t.Fatal("600 bytes of private data accepted (RFC 5044 allows 512)")
	}
}

// TestPair runs the in-memory loopback device.
func TestPair(t *testing.T) {
	a, b := newEnd(0), newEnd(0)
	qa, qb, err := New(Options{CRC: true}).Pair(a.params(nil), b.params(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer qa.Close()
	defer qb.Close()
	buf := make([]byte, 10)
	qb.PostRecv(rdma.RecvWR{Buf: buf})
	qa.PostSend(&rdma.SendWR{Op: rdma.OpSend, SG: [][]byte{[]byte("in memory")}})
	if c := wait(t, b.rcq); c.Len != 9 || string(buf[:9]) != "in memory" {
		t.Fatalf("%+v %q", c, buf)
	}
}

// TestCloseFlushes: work still queued when the QP closes completes with
// Flushed, in order, and nothing is left behind.
func TestCloseFlushes(t *testing.T) {
	a, b := connect(t, Options{})
	for i := 0; i < 5; i++ {
		a.qp.PostRecv(rdma.RecvWR{ID: uint64(i), Buf: make([]byte, 10)})
	}
	b.qp.Close()
	<-a.qp.Done()
	if err := a.qp.Err(); err != rdma.ErrDisconnected {
		t.Fatalf("peer close: %v", err)
	}
	for i := 0; i < 5; i++ {
		if c := wait(t, a.rcq); c.Status != rdma.Flushed || c.ID != uint64(i) {
			t.Fatalf("flush %d: %+v", i, c)
		}
	}
	if err := a.qp.PostSend(&rdma.SendWR{Op: rdma.OpSend}); err != rdma.ErrClosed {
		t.Fatalf("post after close: %v", err)
	}
}

func asTerm(err error, te **rdma.TerminateError) bool {
	t, ok := err.(*rdma.TerminateError)
	if ok {
		*te = t
	}
	return ok
}
