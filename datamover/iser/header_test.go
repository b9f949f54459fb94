package iser

import (
	"bytes"
	"net/netip"
	"testing"
)

func TestHeaderBothProfiles(t *testing.T) {
	// The first SCSI Command of shared/captures/tgt-iser-siw.pcap (frame
	// 26): flags 0x14 (control, RSV), read STag 0x6cd4e101, read VA
	// 0xff390ea94a0ffa00.
	linux := []byte{0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
		0x6c, 0xd4, 0xe1, 0x01, 0xff, 0x39, 0x0e, 0xa9, 0x4a, 0x0f, 0xfa, 0x00}
	msg := append(append([]byte(nil), linux...), make([]byte, 48)...)
	h, err := Decode(msg, HeaderLenLinux)
	if err != nil || !h.RSV || h.WSV || h.ReadSTag != 0x6cd4e101 || h.ReadVA != 0xff390ea94a0ffa00 {
		t.Fatalf("%+v %v", h, err)
	}
	out := make([]byte, HeaderLenLinux)
	h.Encode(out, HeaderLenLinux)
	if !bytes.Equal(out, linux) {
		t.Fatalf("%x", out)
	}
	// RFC 5046: 12 bytes, no base offsets; fields whose valid bit is
	// clear go out as zero.
	w := Header{WSV: true, WriteSTag: 0x1234, WriteVA: 99, ReadSTag: 0x5678}
	out = make([]byte, HeaderLenRFC5046)
	w.Encode(out, HeaderLenRFC5046)
	if !bytes.Equal(out, []byte{0x18, 0, 0, 0, 0, 0, 0x12, 0x34, 0, 0, 0, 0}) {
		t.Fatalf("%x", out)
	}
	if _, err := Decode(out, HeaderLenRFC5046); err == nil {
		t.Fatal("a header without a BHS accepted")
	}
	for _, op := range []byte{0x40, 0x00, 0xF0} {
		if _, err := Decode(append([]byte{op}, make([]byte, 80)...), HeaderLenLinux); err == nil {
			t.Fatalf("opcode %#x accepted", op)
		}
	}
	if _, err := Decode(nil, HeaderLenLinux); err == nil {
		t.Fatal("empty message accepted")
	}
}

func TestHello(t *testing.T) {
	h := Hello{MaxVer: 1, MinVer: 1, IRD: 16}
	b := h.Append(nil)
	if !bytes.Equal(b, []byte{0x20, 0x11, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0}) {
		t.Fatalf("%x", b)
	}
	g, err := DecodeHello(b)
	if err != nil || g != h {
		t.Fatalf("%+v %v", g, err)
	}
	if _, err := DecodeHello(b[:11]); err == nil {
		t.Fatal("short Hello accepted")
	}
	for _, tc := range []struct {
		h    Hello
		ord  uint16
		want HelloReply
	}{
		{Hello{1, 1, 16}, 8, HelloReply{MaxVer: 1, CurVer: 1, ORD: 8}},
		{Hello{1, 1, 4}, 8, HelloReply{MaxVer: 1, CurVer: 1, ORD: 4}},
		{Hello{3, 2, 4}, 8, HelloReply{Reject: true, MaxVer: 1, ORD: 4}}, // no common version
		{Hello{1, 1, 4}, 0, HelloReply{Reject: true, MaxVer: 1, ORD: 0}}, // IRD > 0, ORD 0
		{Hello{1, 1, 0}, 0, HelloReply{MaxVer: 1, CurVer: 1, ORD: 0}},
	} {
		if got := AnswerHello(tc.h, 1, 1, tc.ord); got != tc.want {
			t.Errorf("%+v ord %d: %+v, want %+v", tc.h, tc.ord, got, tc.want)
		}
	}
	r := HelloReply{Reject: true, MaxVer: 1, CurVer: 0, ORD: 2}
	rb := r.Append(nil)
	if rb[0] != 0x31 {
		t.Fatalf("%x", rb)
	}
	if g, err := DecodeHelloReply(rb); err != nil || g != r {
		t.Fatalf("%+v %v", g, err)
	}
}

func TestCMHeader(t *testing.T) {
	// tgt-iser-siw.pcap frame 4: 0x80 after the IRD/ORD words.
	if c := DecodeCMHeader([]byte{0x80, 0, 0, 0}); !c.ZBVANotSupported || c.SendInvNotSupported {
		t.Fatalf("%+v", c)
	}
	if b := (CMHeader{ZBVANotSupported: true, SendInvNotSupported: true}).Append(nil); !bytes.Equal(b, []byte{0xC0, 0, 0, 0}) {
		t.Fatalf("%x", b)
	}
	if c := DecodeCMHeader(nil); c != (CMHeader{}) {
		t.Fatalf("%+v", c)
	}
}

func FuzzDecodeHeader(f *testing.F) {
	f.Add(append([]byte{0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x6c, 0xd4, 0xe1, 0x01, 0xff, 0x39, 0x0e, 0xa9, 0x4a, 0x0f, 0xfa, 0x00}, make([]byte, 48)...), true)
	f.Add(append([]byte{0x18, 0, 0, 0, 0, 0, 0x12, 0x34, 0, 0, 0, 0}, make([]byte, 48)...), false)
	f.Fuzz(func(t *testing.T, b []byte, long bool) {
		hl := HeaderLenRFC5046
		if long {
			hl = HeaderLenLinux
		}
		h, err := Decode(b, hl)
		if err != nil || h.Opcode != OpControl {
			return
		}
		out := make([]byte, hl)
		h.Encode(out, hl)
		g, err := Decode(append(out, b[hl:]...), hl)
		if err != nil || g != h {
			t.Fatalf("round trip %+v -> %+v %v", h, g, err)
		}
	})
}

func FuzzDecodeHello(f *testing.F) {
	f.Add((&Hello{MaxVer: 1, MinVer: 1, IRD: 16}).Append(nil))
	f.Add((&HelloReply{MaxVer: 10, CurVer: 10, ORD: 4}).Append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		if h, err := DecodeHello(b); err == nil {
			if g, err := DecodeHello(h.Append(nil)); err != nil || g != h {
				t.Fatalf("Hello round trip %+v -> %+v", h, g)
			}
			r := AnswerHello(h, 1, 10, 8)
			if !r.Reject && (r.CurVer < max(1, h.MinVer) || r.CurVer > min(10, h.MaxVer) || r.ORD > h.IRD) {
				t.Fatalf("answer %+v to %+v", r, h)
			}
		}
		if r, err := DecodeHelloReply(b); err == nil {
			if g, err := DecodeHelloReply(r.Append(nil)); err != nil || g != r {
				t.Fatalf("HelloReply round trip %+v -> %+v", r, g)
			}
		}
	})
}

// TestCMHeaderIBDraft: the iSER-on-InfiniBand draft form carries the preference flags and
// the addresses after the 4-byte header Linux uses; 4 bytes alone read as
// "either".
func TestCMHeaderIBDraft(t *testing.T) {
	c := CMHeader{ZBVANotSupported: true, IBDraft: true, MajVer: 1, Pref: PreferGateway, LocalPort: 40000}
	c.SetAddrs(netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"))
	b := c.Append(nil)
	if len(b) != CMIBDraftLen || b[0] != CMZBVANotSupported || b[4] != 0x10 || b[5] != 0x02 || b[8] != 0x9c || b[27] != 1 || b[43] != 2 {
		t.Fatalf("encoded % x", b)
	}
	if g := DecodeCMHeader(b); g != c {
		t.Fatalf("round trip %+v -> %+v", c, g)
	}
	c.SetAddrs(netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2"))
	if g := DecodeCMHeader(c.Append(nil)); g != c || g.IPVer != 1 {
		t.Fatalf("IPv6 round trip %+v -> %+v", c, g)
	}
	if g := DecodeCMHeader([]byte{CMSendInvNotSupported, 0, 0, 0}); g.IBDraft || g.Pref != PreferEither || !g.SendInvNotSupported {
		t.Fatalf("4-byte form: %+v", g)
	}
}

func FuzzDecodeCMHeader(f *testing.F) {
	f.Add([]byte{0x80, 0, 0, 0})
	long := CMHeader{IBDraft: true, MajVer: 1, Pref: PreferEndNode}
	f.Add(long.Append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		c := DecodeCMHeader(b)
		if len(b) < CMIBDraftLen {
			return
		}
		// What the long form holds survives re-encoding.
		if g := DecodeCMHeader(c.Append(nil)); g != c {
			t.Fatalf("round trip %+v -> %+v", c, g)
		}
	})
}
