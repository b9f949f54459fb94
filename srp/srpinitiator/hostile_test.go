package srpinitiator

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/blockwire/blockwire/internal/servetest"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/siw"
	"github.com/blockwire/blockwire/srp"
)

// FuzzHostileTarget: a scripted SRP target over loopback iWARP logs the
// channel in, takes one command (the first input byte: bit 0 clear a READ
// of 8 KiB, set a WRITE of 16 KiB; bit 1 set writes the command's tag
// into the IU, so a response can match it), sends the rest of the input
// as one IU, and drops the channel. The command must end — with an error
// or a result within its buffer — and the channel close: no panic, no
// hang, whatever the target sent.
func FuzzHostileTarget(f *testing.F) {
	ln, err := siw.New(siw.Options{}).Listen("127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { ln.Close() })
	addr := ln.Addr().String()
	pd := rdma.NewDevice("fake-srpt").AllocPD()

	withTag := func(mode byte, iu []byte) []byte { return append([]byte{mode | 2}, iu...) }
	f.Add(withTag(0, (&srp.Rsp{ReqLimDelta: 1}).Append(nil)))
	f.Add(withTag(1, (&srp.Rsp{ReqLimDelta: 1}).Append(nil)))
	f.Add(withTag(0, (&srp.Rsp{Flags: srp.DataInUnder, DataInRes: 1 << 30, Status: 0x02,
		Sense: []byte{0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0}}).Append(nil)))
	f.Add(withTag(0, (&srp.Rsp{Flags: srp.DataInOver, DataInRes: 0xffffffff, ReqLimDelta: -1}).Append(nil)))
	long := (&srp.Rsp{Sense: make([]byte, 900)}).Append(nil)
	binary.BigEndian.PutUint32(long[28:], 0xfffffff0) // a sense length past the IU
	f.Add(withTag(0, long))
	f.Add([]byte{0, 0, 0, 0})
	f.Add(append([]byte{0}, (&srp.CredReq{ReqLimDelta: 4, Tag: 9}).Append(nil)...))
	f.Add(append([]byte{0}, (&srp.AerReq{Tag: 9, Sense: []byte{0x70, 0, 0x06, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x29, 0}}).Append(nil)...))
	f.Add(append([]byte{1}, (&srp.TLogout{Reason: srp.LogoutNoReason, Tag: 3}).Append(nil)...))

	f.Fuzz(func(t *testing.T, in []byte) {
		// The initiator's receive buffers hold 1024 bytes: a longer IU
		// only ends the channel, and minimizing long inputs is slow.
		if len(in) == 0 || len(in) > 1100 {
			return
		}
		mode, iu := in[0], in[1:]
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		type dialed struct {
			ch  *Channel
			err error
		}
		dc := make(chan dialed, 1)
		go func() {
			ch, err := Dial(ctx, addr, srp.MakePortID(idExt, idExt), Options{Fabric: siw.New(siw.Options{})})
			dc <- dialed{ch, err}
		}()
		req, err := ln.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var lr srp.LoginReq
		if err := lr.DecodeCM(req.PrivateData()); err != nil {
			t.Fatal(err)
		}
		cq := rdma.NewCQ(16)
		var bufs [4][8260]byte
		var recvs []rdma.RecvWR
		for i := range bufs {
			recvs = append(recvs, rdma.RecvWR{ID: uint64(i), Buf: bufs[i][:]})
		}
		rsp := srp.LoginRsp{ReqLimDelta: 16, Tag: lr.Tag, MaxITIULen: 8260, MaxTIIULen: 1024,
			BufFormats: srp.BufDirect | srp.BufIndirect, Immediate: true}
		qp, err := req.Accept(rdma.ConnParams{PD: pd, QP: rdma.QPConfig{SendCQ: cq, RecvCQ: cq},
			PrivateData: rsp.Append(nil), Recvs: recvs})
		if err != nil {
			t.Fatal(err)
		}
		defer qp.Close()
		d := <-dc
		if d.err != nil {
			t.Fatalf("login: %v", d.err)
		}
		ch := d.ch
		wait := servetest.OneCommand(ch.Do, mode&1 == 1)
		// The command, then the fuzzed IU in answer.
		var comps [4]rdma.Completion
		n, err := cq.Wait(ctx, comps[:])
		if err != nil || n == 0 || comps[0].Op != rdma.OpRecv {
			t.Fatalf("no command from the initiator: %v %+v", err, comps[0])
		}
		if mode&2 != 0 && len(iu) >= 16 {
			iu = append([]byte(nil), iu...)
			copy(iu[8:16], bufs[comps[0].ID][8:16])
		}
		if qp.PostSend(&rdma.SendWR{ID: 1, Op: rdma.OpSend, SG: [][]byte{iu}}) == nil {
			// Its completion: the IU has left (or the channel has ended).
			for waited := false; !waited; {
				n, err := cq.Wait(ctx, comps[:])
				if err != nil {
					break
				}
				for _, c := range comps[:n] {
					waited = waited || c.ID == 1 && c.Op != rdma.OpRecv
				}
			}
		}
		qp.Close()
		wait(t)
		servetest.Closes(t, ch.Close, 10*time.Second)
	})
}
