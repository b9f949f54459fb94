// Command hostile is a hostile RDMA peer for the guest lab. It connects to
// a blockwire portal on a kernel RDMA device (rxe, siw) the way an
// initiator does — an iSER CM header, or with -srp an SRP_LOGIN_REQ, in the
// private data — and then, instead of speaking the protocol, posts RDMA
// Writes and RDMA Reads against the target's memory under keys the target
// never advertised. A target advertises none: its memory is registered
// for local access only, so the kernel must refuse every such operation
// (a remote access error here) and the target must end the connection.
//
// One connection per attempt, since a refused RDMA operation ends it.
// Keys tried: 0, small indexes with every key byte a driver might start
// from, and random keys, at random addresses. Exit status 0 only when
// every attempt was refused; 1 when any RDMA operation succeeded (a hole)
// or the tool could not connect.
//
// It needs the verbs build (go build -tags verbs); without it, it says so.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/blockwire/blockwire/datamover/iser"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/verbs"
	"github.com/blockwire/blockwire/srp"
)

func main() {
	device := flag.String("device", "auto", "kernel RDMA device")
	addr := flag.String("a", "", "portal address:port")
	tries := flag.Int("n", 12, "attempts (one connection each)")
	srpTarget := flag.String("srp", "", "speak SRP to this target port ID (hex, as ib_srp's id_ext) instead of iSER")
	seed := flag.Uint64("seed", 1, "random seed for keys and addresses")
	hold := flag.Duration("hold", 10*time.Second, "after a refused operation, how long to keep the connection (the target must end it on its own)")
	flag.Parse()
	if err := run(*device, *addr, *tries, *srpTarget, *seed, *hold); err != nil {
		fmt.Fprintln(os.Stderr, "hostile:", err)
		os.Exit(1)
	}
}

func run(device, addr string, tries int, srpTarget string, seed uint64, hold time.Duration) error {
	if addr == "" {
		return errors.New("-a address:port is required")
	}
	if device == "auto" {
		name, err := verbs.DeviceFor(addr)
		if err != nil || name == "" {
			return fmt.Errorf("no kernel RDMA device for %s (%v)", addr, err)
		}
		device = name
	}
	d, err := verbs.Open(device, verbs.Options{})
	if err != nil {
		return err
	}
	defer d.Close()
	pdata := iser.CMHeader{ZBVANotSupported: true, SendInvNotSupported: true}.Append(nil)
	if srpTarget != "" {
		tgt, err := srp.ParsePortID(srpTarget)
		if err != nil {
			return err
		}
		lr := srp.LoginReq{MaxITIULen: 4096, BufFormats: srp.BufDirect, MultiChannel: srp.MultiChannelSingle,
			Initiator: srp.MakePortID(0x0badbadbadbadbad, uint64(os.Getpid())), Target: tgt}
		pdata = lr.AppendCM(nil)
	}
	rng := rand.New(rand.NewPCG(seed, 0x686f7374696c65))
	refused := 0
	for i := range tries {
		key := keyFor(i, rng)
		va := rng.Uint64() &^ 0xfff
		op := rdma.OpWrite
		if i%2 == 1 {
			op = rdma.OpRead
		}
		why, err := attempt(d, addr, pdata, op, key, va, hold)
		if err != nil {
			return fmt.Errorf("attempt %d: %w", i, err)
		}
		if why == "" {
			return fmt.Errorf("attempt %d: the target's memory was reachable: RDMA %v under rkey %#x at %#x succeeded", i, op, key, va)
		}
		fmt.Printf("attempt %d: RDMA %v rkey %#08x va %#x: refused (%s)\n", i, op, key, va, why)
		refused++
	}
	fmt.Printf("hostile: %d of %d RDMA operations refused\n", refused, tries)
	return nil
}

// keyFor picks the i-th key: 0, then the lowest indexes with a driver's
// likely key bytes, then random keys.
func keyFor(i int, rng *rand.Rand) uint32 {
	switch {
	case i == 0:
		return 0
	case i < 5:
		return uint32(i)<<8 | uint32(rng.IntN(256))
	default:
		return rng.Uint32()
	}
}

// attempt connects, posts one RDMA operation, holds the connection hold
// long and says how the operation was refused ("" when it was not).
// InfiniBand and RoCE refuse a bad RDMA Write with a NAK (a remote access
// error here); iWARP Writes are not acknowledged: their completion is
// local, and the refusal is the target's TERMINATE, which ends the
// connection.
func attempt(d *verbs.Device, addr string, pdata []byte, op rdma.Op, key uint32, va uint64, hold time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pd := d.PD()
	scq, rcq := rdma.NewCQ(8), rdma.NewCQ(8)
	recv := pd.Alloc(8192)
	defer pd.Free(recv)
	qp, _, err := d.Dial(ctx, addr, rdma.ConnParams{PD: pd, PrivateData: pdata,
		QP:    rdma.QPConfig{SendCQ: scq, RecvCQ: rcq, SendDepth: 4, RecvDepth: 4, IRD: 1, ORD: 1},
		Recvs: []rdma.RecvWR{{ID: 1, Buf: recv}}})
	if err != nil {
		return "", err
	}
	defer qp.Close()
	buf := pd.Alloc(4096)
	defer pd.Free(buf)
	for i := range buf {
		buf[i] = 0xEE // what a successful Write would leave in the target
	}
	wr := &rdma.SendWR{ID: 7, Op: op, RemoteSTag: key, RemoteTO: va}
	if op == rdma.OpWrite {
		wr.SG = [][]byte{buf}
	} else {
		sink, err := pd.Register(buf, 0, rdma.LocalWrite)
		if err != nil {
			return "", err
		}
		defer sink.Deregister()
		wr.Sink, wr.Length = sink, len(buf)
	}
	if err := qp.PostSend(wr); err != nil {
		return "", err
	}
	var c [1]rdma.Completion
	if _, err := scq.Wait(ctx, c[:]); err != nil {
		return "", fmt.Errorf("no completion for the RDMA %v: %w (queue pair: %v)", op, err, qp.Err())
	}
	if c[0].Status != rdma.Success {
		time.Sleep(hold) // the target must end its side on its own
		return c[0].Status.String(), nil
	}
	// A local completion (an iWARP Write): the refusal is the target's
	// TERMINATE and its end of the connection, which may take a while in
	// an emulated guest under load — a Write counts as having reached the
	// target's memory only if the connection still stands after 10 s.
	select {
	case <-qp.Done():
		return fmt.Sprintf("the target ended the connection: %v", qp.Err()), nil
	case <-time.After(max(hold, 10*time.Second)):
		return "", nil
	}
}
