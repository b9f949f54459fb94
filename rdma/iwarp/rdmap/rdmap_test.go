package rdmap

import (
	"bytes"
	"testing"
)

func TestCtrl(t *testing.T) {
	for op := Write; op <= Terminate; op++ {
		got, err := ParseCtrl(Ctrl(op), op.Tagged())
		if err != nil || got != op {
			t.Fatalf("%v: %v %v", op, got, err)
		}
		if _, err := ParseCtrl(Ctrl(op), !op.Tagged()); err == nil {
			t.Fatalf("%v accepted in the wrong DDP model", op)
		}
	}
	for _, c := range []byte{0x48, 0x4F, 0x03, 0x83} {
		if _, err := ParseCtrl(c, false); err == nil {
			t.Fatalf("%#x accepted", c)
		}
	}
}

func TestReadRequest(t *testing.T) {
	// shared/captures/siw-rping.pcap frame 9.
	r := ReadReq{SinkSTag: 0xab44f100, SinkTO: 0x00005606f6330ae0, Size: 64, SrcSTag: 0x5852f300, SrcTO: 0x000056188e6de440}
	var b [ReadRequestLen]byte
	r.Encode(b[:])
	g, err := DecodeReadReq(b[:])
	if err != nil || g != r {
		t.Fatalf("%+v %v", g, err)
	}
}

func TestTerminate(t *testing.T) {
	hdr := []byte{0xc1, 0x40, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 9}
	tm := Term{Layer: LayerRDMAP, EType: ETypeRemoteProtection, Code: CodeBaseBounds, SegLenValid: true, DDPSegLen: 18, DDPHeader: hdr}
	b := tm.Append(nil)
	if len(b) != tm.Len() || b[0] != 0x01 || b[1] != 0x01 || b[2] != 0xC0 {
		t.Fatalf("%x", b)
	}
	g, err := DecodeTerm(b)
	if err != nil || g.Layer != 0 || g.EType != 1 || g.Code != 1 || !g.SegLenValid || g.DDPSegLen != 18 || !bytes.Equal(g.DDPHeader, hdr) {
		t.Fatalf("%+v %v", g, err)
	}
	if _, err := DecodeTerm([]byte{0, 0, 0x40, 0}); err == nil {
		t.Fatal("D bit without header accepted")
	}
}

func FuzzDecodeTerm(f *testing.F) {
	f.Add((&Term{Layer: 1, EType: 2, Code: 3}).Append(nil))
	f.Add((&Term{Layer: 0, EType: 1, Code: 0, SegLenValid: true, DDPSegLen: 42,
		DDPHeader: []byte{0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0}, RDMAPHeader: make([]byte, 28)}).Append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		tm, err := DecodeTerm(b)
		if err != nil {
			return
		}
		again := tm.Append(nil)
		g, err := DecodeTerm(again)
		if err != nil || g.Layer != tm.Layer || g.EType != tm.EType || g.Code != tm.Code ||
			!bytes.Equal(g.DDPHeader, tm.DDPHeader) || !bytes.Equal(g.RDMAPHeader, tm.RDMAPHeader) {
			t.Fatalf("round trip %+v -> %+v %v", tm, g, err)
		}
	})
}

func FuzzParseCtrl(f *testing.F) {
	f.Add(byte(0x43), false)
	f.Add(byte(0x40), true)
	f.Fuzz(func(t *testing.T, c byte, tagged bool) {
		op, err := ParseCtrl(c, tagged)
		// The reserved bits 0x30 are not checked on receipt (RFC 5040
		// §4.2), so they do not survive a round trip.
		if err == nil && (Ctrl(op) != c&^0x30 || op.Tagged() != tagged) {
			t.Fatalf("%#x -> %v", c, op)
		}
		if err == nil && !op.Tagged() {
			_ = op.QN()
		}
	})
}
