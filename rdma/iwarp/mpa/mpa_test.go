package mpa

import (
	"bytes"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	for _, f := range []Frame{
		{Rev: 2, Enhanced: true, IRD: 1, ORD: 1},
		{Rev: 2, Enhanced: true, IRD: 128, ORD: 1, PrivateData: []byte{0x80, 0, 0, 0}},
		{Reply: true, Rev: 2, Enhanced: true, CRC: true, IRD: 4, ORD: 4, PeerToPeer: true, WriteRTR: true},
		{Rev: 1, CRC: true, PrivateData: []byte("rev one")},
		{Reply: true, Reject: true, Rev: 1},
	} {
		b, err := f.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != f.Len() {
			t.Fatalf("Len %d, encoded %d", f.Len(), len(b))
		}
		g, err := Decode(b, f.Reply)
		if err != nil {
			t.Fatal(err)
		}
		if !equal(f, g) {
			t.Fatalf("round trip:\n%+v\n%+v", f, g)
		}
	}
	// The rping Request from shared/captures/siw-rping.pcap frame 4.
	rping := append([]byte(KeyRequest), 0x10, 2, 0, 4, 0, 1, 0, 1)
	f, err := Decode(rping, false)
	if err != nil || !f.Enhanced || f.IRD != 1 || f.ORD != 1 || f.CRC || f.PrivateData != nil {
		t.Fatalf("%+v %v", f, err)
	}
}

func equal(a, b Frame) bool {
	return a.Reply == b.Reply && a.Markers == b.Markers && a.CRC == b.CRC && a.Reject == b.Reject &&
		a.Enhanced == b.Enhanced && a.Rev == b.Rev && a.IRD == b.IRD && a.ORD == b.ORD &&
		a.PeerToPeer == b.PeerToPeer && a.ZeroLenRTR == b.ZeroLenRTR && a.WriteRTR == b.WriteRTR &&
		a.ReadRTR == b.ReadRTR && bytes.Equal(a.PrivateData, b.PrivateData)
}

func TestBadFrames(t *testing.T) {
	for name, b := range map[string][]byte{
		"wrong key":        append([]byte("MPA ID Rep Frame"), 0, 1, 0, 0),
		"revision 3":       append([]byte(KeyRequest), 0, 3, 0, 0),
		"too much data":    append([]byte(KeyRequest), 0, 1, 2, 1),
		"short enhanced":   append([]byte(KeyRequest), 0x10, 2, 0, 2, 0, 1),
		"reject in req":    append([]byte(KeyRequest), 0x20, 1, 0, 0),
		"trailing bytes":   append([]byte(KeyRequest), 0, 1, 0, 0, 9),
		"header too short": []byte(KeyRequest),
	} {
		if _, err := Decode(b, false); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := (&Frame{Rev: 1, PrivateData: make([]byte, 513)}).Append(nil); err == nil {
		t.Error("513 bytes of private data encoded")
	}
}

func TestFraming(t *testing.T) {
	for n, pad := range map[int]int{0: 2, 1: 1, 2: 0, 14: 0, 18: 0, 15: 3, 65534: 0} {
		if PadLen(n) != pad || (2+n+PadLen(n))%4 != 0 {
			t.Errorf("PadLen(%d) = %d", n, PadLen(n))
		}
	}
	if got := MULPDU(1460); got != 1460-6-0 {
		t.Errorf("MULPDU(1460) = %d", got)
	}
	if got := MULPDU(1 << 20); got > MaxULPDU || (2+got)%4 != 0 {
		t.Errorf("MULPDU capped at %d", got)
	}
	// CRC byte order: the iSCSI digest test vector of RFC 3720 B.4 (32
	// zero bytes → 0x8a9136aa) goes on the wire least-significant first.
	var b [4]byte
	PutCRC(b[:], CRC(0, make([]byte, 32)))
	if b != [4]byte{0xaa, 0x36, 0x91, 0x8a} {
		t.Errorf("CRC bytes %x", b)
	}
}

func FuzzDecode(f *testing.F) {
	for _, fr := range []Frame{
		{Rev: 2, Enhanced: true, IRD: 128, ORD: 1, PrivateData: []byte{0x80, 0, 0, 0}},
		{Reply: true, Rev: 1, CRC: true, Reject: true, PrivateData: []byte("x")},
	} {
		b, _ := fr.Append(nil)
		f.Add(b, fr.Reply)
	}
	f.Fuzz(func(t *testing.T, b []byte, reply bool) {
		fr, err := Decode(b, reply)
		if err != nil {
			return
		}
		again, err := fr.Append(nil)
		if err != nil {
			if len(fr.PrivateData)+4 > MaxPrivateData {
				return
			}
			t.Fatalf("decoded frame does not encode: %v", err)
		}
		g, err := Decode(again, reply)
		if err != nil || !equal(fr, g) {
			t.Fatalf("re-decode %+v %v", g, err)
		}
	})
}
