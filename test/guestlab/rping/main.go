// Command rping speaks the protocol of rdma-core's rping example over
// blockwire's software iWARP device (or, with -roce, its software RoCEv2
// device), in either role, so the guest lab can pit our MPA/DDP/RDMAP
// against the Linux kernel's siw — or our InfiniBand RC transport and CM
// against its rdma_rxe — with a program nobody here wrote on the other
// side:
//
//	client: Send(start buffer's address, STag, size); the server RDMA-Reads
//	        it, Sends a go-ahead; Send(sink buffer's address, STag, size);
//	        the server RDMA-Writes the data back and Sends again; the client
//	        compares. Repeated -C times.
//	server: the other half.
//
// Messages are rping's struct rping_rdma_info: buf (be64), rkey (be32),
// size (be32). Exit status 0 only when every iteration moved the right
// bytes.
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/roce"
	"github.com/blockwire/blockwire/rdma/siw"
)

func main() {
	server := flag.Bool("s", false, "server")
	addr := flag.String("a", "127.0.0.1:7471", "address:port")
	count := flag.Int("C", 10, "iterations")
	size := flag.Int("S", 64, "buffer size")
	roceIP := flag.String("roce", "", "use the software RoCEv2 device on this local IPv4 address (default: software iWARP)")
	flag.Parse()
	var fab rdma.Fabric = siw.New(siw.Options{})
	if *roceIP != "" {
		d, err := roce.Open(*roceIP, roce.Options{})
		if err != nil {
			fmt.Fprintln(os.Stderr, "rping:", err)
			os.Exit(1)
		}
		defer d.Close()
		fab = d
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var err error
	if *server {
		err = serve(ctx, fab, *addr, *count, *size)
	} else {
		err = client(ctx, fab, *addr, *count, *size)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rping:", err)
		os.Exit(1)
	}
}

type ep struct {
	pd       *rdma.PD
	scq, rcq *rdma.CQ
	qp       rdma.QP
	recv     []byte
}

func newEP() *ep {
	return &ep{pd: rdma.NewDevice("rping").AllocPD(), scq: rdma.NewCQ(8), rcq: rdma.NewCQ(8), recv: make([]byte, 16)}
}

func (e *ep) params() rdma.ConnParams {
	return rdma.ConnParams{PD: e.pd, QP: rdma.QPConfig{SendCQ: e.scq, RecvCQ: e.rcq, IRD: 1, ORD: 1},
		Recvs: []rdma.RecvWR{{ID: 1, Buf: e.recv}}}
}

func (e *ep) wait(ctx context.Context, cq *rdma.CQ) (rdma.Completion, error) {
	var c [1]rdma.Completion
	if _, err := cq.Wait(ctx, c[:]); err != nil {
		return rdma.Completion{}, fmt.Errorf("%w (queue pair: %v)", err, e.qp.Err())
	}
	if c[0].Status != rdma.Success {
		return c[0], fmt.Errorf("%v %v (queue pair: %v)", c[0].Op, c[0].Status, e.qp.Err())
	}
	return c[0], nil
}

// info is rping's struct rping_rdma_info.
func info(va uint64, stag uint32, size int) []byte {
	b := binary.BigEndian.AppendUint64(nil, va)
	b = binary.BigEndian.AppendUint32(b, stag)
	return binary.BigEndian.AppendUint32(b, uint32(size))
}

// recvInfo waits for the peer's next Send and reposts the buffer.
func (e *ep) recvInfo(ctx context.Context) (uint64, uint32, uint32, error) {
	if _, err := e.wait(ctx, e.rcq); err != nil {
		return 0, 0, 0, err
	}
	va, stag, size := binary.BigEndian.Uint64(e.recv), binary.BigEndian.Uint32(e.recv[8:]), binary.BigEndian.Uint32(e.recv[12:])
	// After the last message the peer may already have closed; a failed
	// repost shows up in the next wait.
	_ = e.qp.PostRecv(rdma.RecvWR{ID: 1, Buf: e.recv})
	return va, stag, size, nil
}

func (e *ep) send(ctx context.Context, msg []byte) error {
	if err := e.qp.PostSend(&rdma.SendWR{Op: rdma.OpSend, SG: [][]byte{msg}}); err != nil {
		return err
	}
	_, err := e.wait(ctx, e.scq)
	return err
}

func client(ctx context.Context, fab rdma.Fabric, addr string, count, size int) error {
	e := newEP()
	start, sink := make([]byte, size), make([]byte, size)
	const startVA, sinkVA = 0x7f1000000000, 0x7f2000000000
	smr, err := e.pd.Register(start, startVA, rdma.RemoteRead)
	if err != nil {
		return err
	}
	kmr, err := e.pd.Register(sink, sinkVA, rdma.RemoteWrite|rdma.LocalWrite)
	if err != nil {
		return err
	}
	if e.qp, _, err = fab.Dial(ctx, addr, e.params()); err != nil {
		return err
	}
	defer e.qp.Close()
	c := byte(65)
	for ping := 0; ping < count; ping++ {
		n := copy(start, fmt.Sprintf("rdma-ping-%d: ", ping))
		for i, ch := n, c; i < size; i++ {
			start[i] = ch
			if ch++; ch > 122 {
				ch = 65
			}
		}
		if c++; c > 122 {
			c = 65
		}
		start[size-1] = 0
		clear(sink)
		if err := e.send(ctx, info(startVA, smr.STag(), size)); err != nil {
			return fmt.Errorf("ping %d: sending the start buffer: %w", ping, err)
		}
		if _, _, _, err := e.recvInfo(ctx); err != nil { // the server read it
			return fmt.Errorf("ping %d: waiting for the go-ahead: %w", ping, err)
		}
		if err := e.send(ctx, info(sinkVA, kmr.STag(), size)); err != nil {
			return fmt.Errorf("ping %d: sending the sink buffer: %w", ping, err)
		}
		if _, _, _, err := e.recvInfo(ctx); err != nil { // the server wrote it
			return fmt.Errorf("ping %d: waiting for the write: %w", ping, err)
		}
		if !bytes.Equal(bytes.TrimRight(start, "\x00"), bytes.TrimRight(sink, "\x00")) {
			return fmt.Errorf("ping %d: data mismatch: sent %q, got back %q", ping, start, sink)
		}
		fmt.Printf("ping data: %s\n", bytes.TrimRight(sink, "\x00"))
	}
	return nil
}

func serve(ctx context.Context, fab rdma.Fabric, addr string, count, size int) error {
	e := newEP()
	buf := make([]byte, size)
	mr, err := e.pd.Register(buf, 0, rdma.LocalWrite)
	if err != nil {
		return err
	}
	ln, err := fab.Listen(addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	req, err := ln.Accept(ctx)
	if err != nil {
		return err
	}
	if e.qp, err = req.Accept(e.params()); err != nil {
		return err
	}
	defer e.qp.Close()
	zero := make([]byte, 16)
	for ping := 0; ping < count; ping++ {
		va, stag, n, err := e.recvInfo(ctx)
		if err != nil {
			return fmt.Errorf("ping %d: waiting for the start buffer: %w", ping, err)
		}
		n = min(n, uint32(size))
		if err := e.qp.PostSend(&rdma.SendWR{Op: rdma.OpRead, Sink: mr, Length: int(n), RemoteSTag: stag, RemoteTO: va}); err != nil {
			return err
		}
		if _, err := e.wait(ctx, e.scq); err != nil {
			return fmt.Errorf("ping %d: RDMA Read: %w", ping, err)
		}
		fmt.Printf("server ping data: %s\n", bytes.TrimRight(buf[:n], "\x00"))
		if err := e.send(ctx, zero); err != nil {
			return err
		}
		va, stag, _, err = e.recvInfo(ctx)
		if err != nil {
			return fmt.Errorf("ping %d: waiting for the sink buffer: %w", ping, err)
		}
		l := bytes.IndexByte(buf[:n], 0) + 1
		if l <= 0 {
			l = int(n)
		}
		if err := e.qp.PostSend(&rdma.SendWR{Op: rdma.OpWrite, SG: [][]byte{buf[:l]}, RemoteSTag: stag, RemoteTO: va}); err != nil {
			return err
		}
		if _, err := e.wait(ctx, e.scq); err != nil {
			return fmt.Errorf("ping %d: RDMA Write: %w", ping, err)
		}
		if err := e.send(ctx, zero); err != nil {
			return err
		}
	}
	// Like rping's server, leave the disconnect to the client: our send
	// completing means its bytes were written, not that the peer has
	// taken them, and rping's client loses its last completion if the
	// disconnect event overtakes it.
	select {
	case <-e.qp.Done():
	case <-time.After(10 * time.Second):
		return errors.New("the client did not disconnect after the last ping")
	case <-ctx.Done():
	}
	return nil
}
