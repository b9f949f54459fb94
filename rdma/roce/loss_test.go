package roce

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blockwire/blockwire/rdma"
)

// dropper loses a fraction of the datagrams a device receives, as a
// lossy network would (netem on a link): a GSO datagram is lost whole.
func dropper(seed uint64, p float64) func() bool {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, 3))
	return func() bool {
		mu.Lock()
		defer mu.Unlock()
		return rng.Float64() < p
	}
}

// Over a network that loses a share of the datagrams both ways, two
// devices keep eight 128 KiB RDMA Writes, Reads and Sends in flight (the
// shape of iSER at queue depth 8) until 240 have completed, each with the
// right bytes — and the losses cost retransmissions, not a stall: the
// whole run stays within a few seconds.
func TestDeviceOverLossyNetwork(t *testing.T) {
	for _, loss := range []float64{0.01, 0.03, 0.10} {
		t.Run(fmt.Sprintf("loss%g", loss), func(t *testing.T) { lossyNetworkRun(t, loss) })
	}
}

func lossyNetworkRun(t *testing.T, loss float64) {
	a, b := devicesWith(t, Options{Port: 14793, dropIn: dropper(1, loss)}, Options{Port: 14793, dropIn: dropper(2, loss)})
	ea, eb := newEnd(a), newEnd(b)
	ea.scq, eb.rcq = rdma.NewCQ(256), rdma.NewCQ(256)
	ln, err := b.Listen("127.0.0.2:3260")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const size, depth, ops = 128 << 10, 8, 240
	region := make([]byte, depth*size)
	for i := range region {
		region[i] = byte(i * 7)
	}
	// What B's region holds, slot by slot, as the operations posted so
	// far leave it (a Read sees the Writes posted before it), taken
	// before B's device may write it.
	model := make([][]byte, depth)
	for i := range model {
		model[i] = append([]byte(nil), region[i*size:(i+1)*size]...)
	}
	mr, _ := eb.pd.Register(region, 0x100000, rdma.RemoteRead|rdma.RemoteWrite)
	recvs := make([]rdma.RecvWR, 64)
	for i := range recvs {
		recvs[i] = rdma.RecvWR{ID: uint64(i), Buf: make([]byte, size)}
	}
	accepted := make(chan rdma.QP, 1)
	go func() {
		r, err := ln.Accept(ctx)
		if err != nil {
			close(accepted)
			return
		}
		q, err := r.Accept(eb.params(nil, recvs...))
		if err != nil {
			close(accepted)
			return
		}
		accepted <- q
	}()
	qa, _, err := a.Dial(ctx, "127.0.0.2:3260", ea.params(nil))
	if err != nil {
		t.Fatal(err)
	}
	qb := <-accepted
	if qb == nil {
		t.Fatal("no connection accepted")
	}
	// B reposts each receive it gets; it counts the Sends' bytes.
	var sendsOK, sendsBad atomic.Int64
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		buf := make([]rdma.Completion, 64)
		for {
			n, err := eb.rcq.Wait(ctx, buf)
			if err != nil {
				return
			}
			for _, c := range buf[:n] {
				if c.Status != rdma.Success {
					return
				}
				if c.Len == size && recvs[c.ID].Buf[0] == byte(c.Len>>10) && recvs[c.ID].Buf[size-1] == 0xee {
					sendsOK.Add(1)
				} else {
					sendsBad.Add(1)
				}
				qb.PostRecv(recvs[c.ID])
			}
		}
	}()

	sinks := make([][]byte, depth)
	sinkMRs := make([]*rdma.MR, depth)
	srcs := make([][]byte, depth)
	for i := range sinks {
		sinks[i] = make([]byte, size)
		sinkMRs[i], _ = ea.pd.Register(sinks[i], 0, rdma.LocalWrite)
		srcs[i] = bytes.Repeat([]byte{byte(i + 1)}, size)
		srcs[i][0], srcs[i][size-1] = byte(size>>10), 0xee
	}
	wantRead := make([][]byte, depth)
	post := func(i int) {
		slot := i % depth
		var wr rdma.SendWR
		switch i % 3 {
		case 0:
			model[slot] = srcs[slot]
			wr = rdma.SendWR{ID: uint64(i), Op: rdma.OpWrite, SG: [][]byte{srcs[slot]}, RemoteSTag: mr.STag(), RemoteTO: 0x100000 + uint64(slot*size)}
		case 1:
			wantRead[slot] = model[slot]
			wr = rdma.SendWR{ID: uint64(i), Op: rdma.OpRead, Sink: sinkMRs[slot], Length: size, RemoteSTag: mr.STag(), RemoteTO: 0x100000 + uint64(slot*size)}
		case 2:
			wr = rdma.SendWR{ID: uint64(i), Op: rdma.OpSend, SG: [][]byte{srcs[slot]}}
		}
		if err := qa.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	for i := range depth {
		post(i)
	}
	buf := make([]rdma.Completion, 64)
	for done, next := 0, depth; done < ops; {
		n, err := ea.scq.Wait(ctx, buf)
		if err != nil {
			t.Fatalf("%d of %d operations done at %g loss after %v: %v (qp %v)", done, ops, loss, time.Since(start).Round(time.Millisecond), err, qa.Err())
		}
		for _, c := range buf[:n] {
			if c.Status != rdma.Success || c.ID != uint64(done) {
				t.Fatalf("completion %d: id %d status %v (qp %v)", done, c.ID, c.Status, qa.Err())
			}
			slot := done % depth
			if done%3 == 1 && !bytes.Equal(sinks[slot], wantRead[slot]) {
				t.Fatalf("Read %d: wrong bytes", done)
			}
			done++
			if next < ops {
				post(next)
				next++
			}
		}
	}
	took := time.Since(start)
	// A Send completes at its acknowledgement, which may come before B
	// has taken its receive completion.
	for deadline := time.Now().Add(5 * time.Second); sendsOK.Load()+sendsBad.Load() < ops/3 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-recvDone
	if ok, bad := sendsOK.Load(), sendsBad.Load(); bad > 0 || ok != ops/3 {
		t.Fatalf("B received %d Sends whole and %d wrong, want %d", ok, bad, ops/3)
	}
	st := qa.(*RC).Stats()
	t.Logf("%g loss: %d × 128 KiB at depth %d in %v (requester: %+v)", loss, ops, depth, took.Round(time.Millisecond), st)
	if took > 20*time.Second {
		t.Errorf("%g loss: %v for %d operations — a stall, not retransmissions", loss, took, ops)
	}
}

// The shape of iSER reads on a lossy link, with the local ACK timeout
// Linux's rxe asks for in its connection requests (4.096 µs × 2^19 ≈
// 2.15 s): each I/O a 4 KiB RDMA Write and a small Send behind it (the
// response), 3 % of the packets from the side that sends them lost, one
// I/O at a time and eight. A lost packet with nothing behind it — the
// response of the last I/O in flight, while the initiator waits for it
// before it sends another command — shows no gap to the responder, which
// then says nothing: only the requester's timer finds the loss. With the
// QP's timeout as that timer each such loss cost 2.15 s, doubled for
// each in a row: the guest lab's reads from Linux rxe timed out after
// 60 s at 3 %, and a capture showed the target's response sent again
// 2.15 s after each loss. An RTT-based timer under the QP's timeout, as
// RDMA NICs on lossy Ethernet have, finds it in milliseconds; only waits
// as long as the QP's timeout count against its retry count.
func TestTailLossUnderALongQPTimeout(t *testing.T) {
	for _, depth := range []int{1, 8} {
		t.Run(fmt.Sprintf("depth%d", depth), func(t *testing.T) { tailLossRun(t, depth) })
	}
}

func tailLossRun(t *testing.T, depth int) {
	const ios, size = 300, 4096
	ab := newLossy(21, 0.03, 0, 0)
	a, b := pair(t, ab, newLossy(22, 0, 0, 0), 1024)
	a.qp.mu.Lock()
	a.qp.cfg.Timeout, a.qp.cfg.RetryCount = serviceTime(19), 7
	a.qp.mu.Unlock()
	region := make([]byte, depth*size)
	mr, _ := b.pd.Register(region, 0x40000, rdma.RemoteWrite)
	for i := range ios {
		b.qp.PostRecv(rdma.RecvWR{ID: uint64(i), Buf: make([]byte, 64)})
	}
	data := bytes.Repeat([]byte("iser"), size/4)
	start := time.Now()
	post := func(i int) {
		slot := uint64(i%depth) * size
		w := rdma.SendWR{ID: uint64(2 * i), Op: rdma.OpWrite, SG: [][]byte{data}, RemoteSTag: mr.STag(), RemoteTO: 0x40000 + slot, Unsignaled: true}
		s := rdma.SendWR{ID: uint64(2*i + 1), Op: rdma.OpSend, SG: [][]byte{[]byte("response")}}
		if err := a.qp.PostSend(&w); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(&s); err != nil {
			t.Fatal(err)
		}
	}
	next := 0
	for ; next < depth; next++ {
		post(next)
	}
	for done := 0; done < ios; {
		for _, c := range waitN(t, a.scq, 1) {
			if c.Status != rdma.Success {
				t.Fatalf("I/O %d: %v", c.ID/2, c.Status)
			}
			done++
			if next < ios {
				post(next)
				next++
			}
		}
	}
	if got := len(waitN(t, b.rcq, ios)); got != ios {
		t.Fatalf("%d Sends received, want %d", got, ios)
	}
	took := time.Since(start)
	s := a.qp.Stats()
	ab.mu.Lock()
	lost := ab.lost
	ab.mu.Unlock()
	t.Logf("%d I/Os in %s, %d packets lost: %+v", ios, took.Round(time.Millisecond), lost, s)
	if took > 5*time.Second {
		t.Errorf("%d I/Os at depth %d took %s over a link losing 3 %%: lost packets waited for the QP's timeout", ios, depth, took.Round(time.Millisecond))
	}
}
