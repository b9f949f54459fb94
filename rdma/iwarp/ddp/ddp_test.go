package ddp

import (
	"bytes"
	"testing"
)

func TestHeaders(t *testing.T) {
	// RDMA Write, last, from shared/captures/srp-siw.pcap frame 21:
	// c1 40, STag c4ab0d01, TO ff27ed3605695c00.
	b := []byte{0xc1, 0x40, 0xc4, 0xab, 0x0d, 0x01, 0xff, 0x27, 0xed, 0x36, 0x05, 0x69, 0x5c, 0x00}
	h, err := Decode(b)
	if err != nil || !h.Tagged || !h.Last || h.STag != 0xc4ab0d01 || h.TO != 0xff27ed3605695c00 || h.ULP != 0x40 {
		t.Fatalf("%+v %v", h, err)
	}
	out := make([]byte, h.Len())
	h.Encode(out)
	if !bytes.Equal(out, b) {
		t.Fatalf("%x", out)
	}
	u := Header{ULP: 0x43, QN: 0, MSN: 7, MO: 32748, ULPWord: 0xabc}
	out = make([]byte, u.Len())
	u.Encode(out)
	g, err := Decode(out)
	if err != nil || g != u {
		t.Fatalf("%+v %v", g, err)
	}
	if _, err := Decode([]byte{0x42, 0x43}); err == nil {
		t.Fatal("short / bad version accepted")
	}
	bad := append([]byte(nil), out...)
	bad[0] = 0x40 // version 0
	if _, err := Decode(bad); err == nil {
		t.Fatal("version 0 accepted")
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte{0xc1, 0x40, 0xc4, 0xab, 0x0d, 0x01, 0xff, 0x27, 0xed, 0x36, 0x05, 0x69, 0x5c, 0x00})
	f.Add([]byte{0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := Decode(b)
		if err != nil {
			return
		}
		out := make([]byte, h.Len())
		if n := h.Encode(out); n != HeaderLen(b[0]) {
			t.Fatalf("length %d vs %d", n, HeaderLen(b[0]))
		}
		// Reserved control bits are dropped; everything else survives.
		want := append([]byte(nil), b[:h.Len()]...)
		want[0] &^= reservedMask
		if !bytes.Equal(out, want) {
			t.Fatalf("%x -> %x", want, out)
		}
	})
}
