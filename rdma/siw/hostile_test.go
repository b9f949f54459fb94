package siw

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/iwarp/ddp"
	"github.com/blockwire/blockwire/rdma/iwarp/mpa"
	"github.com/blockwire/blockwire/rdma/iwarp/rdmap"
)

// fpdu frames one DDP segment (header + payload) as an FPDU.
func fpdu(crc bool, seg []byte) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(len(seg)))
	b = append(b, seg...)
	b = append(b, make([]byte, mpa.PadLen(len(seg)))...)
	var c uint32
	if crc {
		c = mpa.CRC(0, b)
	}
	return binary.LittleEndian.AppendUint32(b, c)
}

func seg(h ddp.Header, payload []byte) []byte {
	b := make([]byte, h.Len())
	h.Encode(b)
	return append(b, payload...)
}

func send(msn uint32, payload []byte) []byte {
	return seg(ddp.Header{ULP: rdmap.Ctrl(rdmap.Send), QN: 0, MSN: msn, Last: true}, payload)
}

func write(stag uint32, to uint64, payload []byte) []byte {
	return seg(ddp.Header{Tagged: true, Last: true, ULP: rdmap.Ctrl(rdmap.Write), STag: stag, TO: to}, payload)
}

// victim is a listening end with a registered region (guarded), a
// read-only region, an invalidated region and two posted 64-byte receives.
type victim struct {
	*end
	ro      *rdma.MR
	deadTag uint32
	ln      rdma.Listener
	qps     chan rdma.QP
}

func newVictim(t *testing.T, opt Options) *victim {
	f := New(opt)
	ln, err := f.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	v := &victim{end: newEnd(0x10000), ln: ln, qps: make(chan rdma.QP, 4)}
	v.ro, _ = v.pd.Register(make([]byte, 4096), 0, rdma.RemoteRead)
	dead, _ := v.pd.AllocMR()
	v.deadTag, _ = dead.Map(make([]byte, 4096), 0, rdma.RemoteWrite)
	dead.Invalidate()
	go func() {
		for {
			r, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			p := v.params(nil)
			p.QP.IRD = 2
			p.Recvs = []rdma.RecvWR{{ID: 1, Buf: make([]byte, 64)}, {ID: 2, Buf: make([]byte, 64)}}
			qp, err := r.Accept(p)
			if err != nil {
				continue
			}
			v.qps <- qp
		}
	}()
	return v
}

// raw opens a hand-driven MPA connection to the victim.
func (v *victim) raw(t *testing.T, crc bool) (net.Conn, *bufio.Reader, rdma.QP) {
	t.Helper()
	c, err := net.Dial("tcp", v.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	req := mpa.Frame{Rev: 2, Enhanced: true, IRD: 4, ORD: 1, CRC: crc}
	b, _ := req.Append(nil)
	c.Write(b)
	br := bufio.NewReader(c)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	h := make([]byte, mpa.HeaderLen)
	if _, err := io.ReadFull(br, h); err != nil {
		t.Fatal(err)
	}
	n, err := mpa.PrivateDataLength(h, true)
	if err != nil {
		t.Fatal(err)
	}
	rest := make([]byte, n)
	io.ReadFull(br, rest)
	rep, err := mpa.Decode(append(h, rest...), true)
	if err != nil || rep.Reject || rep.CRC != crc {
		t.Fatalf("reply %+v %v", rep, err)
	}
	select {
	case qp := <-v.qps:
		return c, br, qp
	case <-time.After(10 * time.Second):
		t.Fatal("victim did not accept")
	}
	return nil, nil, nil
}

// terminate reads FPDUs until a Terminate and then expects the close.
func terminate(t *testing.T, br *bufio.Reader) rdmap.Term {
	t.Helper()
	for {
		var l [2]byte
		if _, err := io.ReadFull(br, l[:]); err != nil {
			t.Fatalf("stream ended without a Terminate: %v", err)
		}
		n := int(binary.BigEndian.Uint16(l[:]))
		body := make([]byte, n+mpa.PadLen(n)+mpa.CRCLen)
		if _, err := io.ReadFull(br, body); err != nil {
			t.Fatal(err)
		}
		h, err := ddp.Decode(body[:n])
		if err != nil {
			t.Fatal(err)
		}
		if h.Tagged || h.ULP != rdmap.Ctrl(rdmap.Terminate) {
			continue
		}
		if h.QN != ddp.QNTerminate || h.MSN != 1 || h.MO != 0 || !h.Last {
			t.Errorf("Terminate header %+v (want QN 2, MSN 1, MO 0, L)", h)
		}
		term, err := rdmap.DecodeTerm(body[ddp.UntaggedLen:n])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := br.ReadByte(); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("connection still open after the Terminate (%v)", err)
		}
		return term
	}
}

func TestHostilePeers(t *testing.T) {
	type want struct{ layer, etype, code uint8 }
	for _, tc := range []struct {
		name  string
		crc   bool
		bytes func(v *victim) []byte
		want  want
	}{
		{"bad CRC", true, func(v *victim) []byte {
			b := fpdu(true, send(1, []byte("hello")))
			b[len(b)-1] ^= 0xFF
			return b
		}, want{rdmap.LayerLLP, 0, mpa.CodeCRC}},
		{"unknown opcode", false, func(v *victim) []byte {
			s := send(1, nil)
			s[1] = 0x4F
			return fpdu(false, s)
		}, want{rdmap.LayerRDMAP, rdmap.ETypeRemoteOp, rdmap.CodeUnexpectedOp}},
		{"bad RDMAP version", false, func(v *victim) []byte {
			s := send(1, nil)
			s[1] = 0x83
			return fpdu(false, s)
		}, want{rdmap.LayerRDMAP, rdmap.ETypeRemoteOp, rdmap.CodeBadVersion}},
		{"bad DDP version", false, func(v *victim) []byte {
			s := send(1, nil)
			s[0] = 0x42
			return fpdu(false, s)
		}, want{rdmap.LayerDDP, ddp.ETypeUntagged, ddp.CodeUntaggedVersion}},
		{"write to unregistered STag", false, func(v *victim) []byte {
			return fpdu(false, write(0x12345601, 0, []byte("x")))
		}, want{rdmap.LayerRDMAP, rdmap.ETypeRemoteProtection, rdmap.CodeInvalidSTag}},
		{"write to invalidated STag", false, func(v *victim) []byte {
			return fpdu(false, write(v.deadTag, 0, []byte("x")))
		}, want{rdmap.LayerRDMAP, rdmap.ETypeRemoteProtection, rdmap.CodeInvalidSTag}},
		{"write past the region", false, func(v *victim) []byte {
			return fpdu(false, write(v.mr.STag(), v.va+regSize-2, []byte("four")))
		}, want{rdmap.LayerRDMAP, rdmap.ETypeRemoteProtection, rdmap.CodeBaseBounds}},
		{"write below the region", false, func(v *victim) []byte {
			return fpdu(false, write(v.mr.STag(), v.va-1, []byte("four")))
		}, want{rdmap.LayerRDMAP, rdmap.ETypeRemoteProtection, rdmap.CodeBaseBounds}},
		{"write with wrapping offset", false, func(v *victim) []byte {
			return fpdu(false, write(v.mr.STag(), ^uint64(0)-1, []byte("four")))
		}, want{rdmap.LayerRDMAP, rdmap.ETypeRemoteProtection, rdmap.CodeTOWrap}},
		{"write to a read-only region", false, func(v *victim) []byte {
			return fpdu(false, write(v.ro.STag(), 0, []byte("x")))
		}, want{rdmap.LayerRDMAP, rdmap.ETypeRemoteProtection, rdmap.CodeAccessRights}},
		{"read beyond the region", false, func(v *victim) []byte {
			rr := rdmap.ReadReq{SinkSTag: 1, Size: 100, SrcSTag: v.mr.STag(), SrcTO: v.va + regSize - 10}
			body := make([]byte, rdmap.ReadRequestLen)
			rr.Encode(body)
			return fpdu(false, seg(ddp.Header{ULP: rdmap.Ctrl(rdmap.ReadRequest), QN: 1, MSN: 1, Last: true}, body))
		}, want{rdmap.LayerRDMAP, rdmap.ETypeRemoteProtection, rdmap.CodeBaseBounds}},
		{"send longer than the receive buffer", false, func(v *victim) []byte {
			return fpdu(false, send(1, make([]byte, 65)))
		}, want{rdmap.LayerDDP, ddp.ETypeUntagged, ddp.CodeTooLong}},
		{"send with no receive posted", false, func(v *victim) []byte {
			return append(append(fpdu(false, send(1, nil)), fpdu(false, send(2, nil))...), fpdu(false, send(3, nil))...)
		}, want{rdmap.LayerDDP, ddp.ETypeUntagged, ddp.CodeNoBuffer}},
		{"wrong MSN", false, func(v *victim) []byte {
			return fpdu(false, send(7, nil))
		}, want{rdmap.LayerDDP, ddp.ETypeUntagged, ddp.CodeInvalidMSN}},
		{"wrong MO", false, func(v *victim) []byte {
			return fpdu(false, seg(ddp.Header{ULP: rdmap.Ctrl(rdmap.Send), MSN: 1, MO: 9, Last: true}, nil))
		}, want{rdmap.LayerDDP, ddp.ETypeUntagged, ddp.CodeInvalidMO}},
		{"invalid queue number", false, func(v *victim) []byte {
			return fpdu(false, seg(ddp.Header{ULP: rdmap.Ctrl(rdmap.Send), QN: 9, MSN: 1, Last: true}, nil))
		}, want{rdmap.LayerDDP, ddp.ETypeUntagged, ddp.CodeInvalidQN}},
		{"read response nobody asked for", false, func(v *victim) []byte {
			return fpdu(false, seg(ddp.Header{Tagged: true, Last: true, ULP: rdmap.Ctrl(rdmap.ReadResponse), STag: v.mr.STag(), TO: v.va}, []byte("x")))
		}, want{rdmap.LayerRDMAP, rdmap.ETypeRemoteOp, rdmap.CodeUnexpectedOp}},
		{"FPDU shorter than its header", false, func(v *victim) []byte {
			return []byte{0, 5, 0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
		}, want{rdmap.LayerLLP, 0, mpa.CodeFPDUStart}},
		{"oversize Terminate", false, func(v *victim) []byte {
			return fpdu(false, seg(ddp.Header{ULP: rdmap.Ctrl(rdmap.Terminate), QN: 2, MSN: 1, Last: true}, make([]byte, 2000)))
		}, want{rdmap.LayerDDP, ddp.ETypeUntagged, ddp.CodeInvalidMO}},
		{"more Reads than IRD", false, func(v *victim) []byte {
			var b []byte
			for i := uint32(1); i <= 64; i++ {
				rr := rdmap.ReadReq{SinkSTag: 1, Size: 128 << 10, SrcSTag: v.mr.STag(), SrcTO: v.va}
				body := make([]byte, rdmap.ReadRequestLen)
				rr.Encode(body)
				b = append(b, fpdu(false, seg(ddp.Header{ULP: rdmap.Ctrl(rdmap.ReadRequest), QN: 1, MSN: i, Last: true}, body))...)
			}
			return b
		}, want{rdmap.LayerDDP, ddp.ETypeUntagged, ddp.CodeNoBuffer}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newVictim(t, Options{})
			// A well-behaved connection runs beside the hostile one.
			good, goodEnd := goodPeer(t, v)
			c, br, qp := v.raw(t, tc.crc)
			go c.Write(tc.bytes(v))
			term := terminate(t, br)
			if term.Layer != tc.want.layer || term.EType != tc.want.etype || term.Code != tc.want.code {
				t.Errorf("Terminate %v, want layer %d type %d code %#x", &term, tc.want.layer, tc.want.etype, tc.want.code)
			}
			<-qp.Done()
			var te *rdma.TerminateError
			if !errors.As(qp.Err(), &te) || te.Remote {
				t.Errorf("victim's error %v, want a local Terminate", qp.Err())
			}
			t.Logf("victim: %v", qp.Err())
			v.checkGuards(t)
			if v.mem[guard+regSize-2] != 0xEE || v.mem[guard] != 0xEE {
				t.Error("a refused write was partly placed")
			}
			// The other connection still works.
			buf := make([]byte, 64)
			goodEnd.qp.PostRecv(rdma.RecvWR{Buf: buf})
			good.PostSend(&rdma.SendWR{Op: rdma.OpSend, SG: [][]byte{[]byte("still here")}})
			if c := wait(t, goodEnd.rcq); c.Status != rdma.Success || string(buf[:c.Len]) != "still here" {
				t.Fatalf("the well-behaved connection suffered: %+v", c)
			}
		})
	}
}

// goodPeer connects a normal client to the victim; it returns the
// client's QP and an end whose rcq gets the client's receives.
func goodPeer(t *testing.T, v *victim) (rdma.QP, *end) {
	t.Helper()
	e := newEnd(0)
	qp, _, err := New(Options{}).Dial(context.Background(), v.ln.Addr().String(), e.params(nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qp.Close() })
	vqp := <-v.qps
	e.qp = qp
	// Traffic from the victim's side of the good connection lands in e.
	return vqp, e
}

// TestJunkBeforeMPA: bytes that are not an MPA Request get the connection
// closed without a reply, and the listener keeps serving.
func TestJunkBeforeMPA(t *testing.T) {
	v := newVictim(t, Options{})
	for _, junk := range [][]byte{
		[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		append([]byte("MPA ID Req Frame\x00\x07"), 0, 0),             // revision 7
		append([]byte("MPA ID Req Frame\x00\x02"), 0x10, 0x00),       // 4096 bytes of private data
		append([]byte("MPA ID Req Frame\x80\x02"), 0, 4, 0, 1, 0, 1), // markers
	} {
		c, err := net.Dial("tcp", v.ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write(junk)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("%q: %v", junk, err)
		}
		if junk[16] == 0x80 {
			// Markers: refused with a Reply that has R set.
			if len(got) < mpa.HeaderLen || got[16]&mpa.FlagReject == 0 {
				t.Fatalf("markers request answered with %x", got)
			}
			continue
		}
		if len(got) != 0 {
			t.Fatalf("%q answered with %x", junk, got)
		}
	}
	good, goodEnd := goodPeer(t, v)
	buf := make([]byte, 64)
	goodEnd.qp.PostRecv(rdma.RecvWR{Buf: buf})
	good.PostSend(&rdma.SendWR{Op: rdma.OpSend, SG: [][]byte{[]byte("ok")}})
	if c := wait(t, goodEnd.rcq); c.Status != rdma.Success {
		t.Fatalf("%+v", c)
	}
}
