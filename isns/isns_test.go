package isns

import (
	"bytes"
	"net/netip"
	"testing"
)

// TestAttrs: TLVs are padded to 4 bytes with the padding counted in the
// length (RFC 4171 §5.5); strings carry their NUL; addresses are 16 bytes,
// IPv4 mapped.
func TestAttrs(t *testing.T) {
	b := AppendAttrs(nil, String(TagISCSIName, "iqn.x"), Uint32(TagISCSINodeType, NodeTypeTarget),
		IP(TagPortalIP, netip.MustParseAddr("192.0.2.7")), Delimiter())
	want := []byte{0, 0, 0, 32, 0, 0, 0, 8, 'i', 'q', 'n', '.', 'x', 0, 0, 0,
		0, 0, 0, 33, 0, 0, 0, 4, 0, 0, 0, 1,
		0, 0, 0, 16, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 7,
		0, 0, 0, 0, 0, 0, 0, 0}
	if !bytes.Equal(b, want) {
		t.Fatalf("encoded\n% x\nwant\n% x", b, want)
	}
	attrs, err := ParseAttrs(b)
	if err != nil || len(attrs) != 4 || attrs[0].Tag != TagISCSIName || string(attrs[0].Value[:5]) != "iqn.x" || attrs[3].Tag != TagDelimiter {
		t.Fatalf("%+v %v", attrs, err)
	}
	if _, err := ParseAttrs(b[:len(b)-3]); err == nil {
		t.Fatal("a truncated list decoded")
	}
	msg, err := Message(DevAttrReg, FlagReplace, 7, String(TagEntityID, "e"))
	if err != nil {
		t.Fatal(err)
	}
	h, err := DecodeHeader(msg)
	if err != nil || h.Function != DevAttrReg || h.Flags != FlagClient|FlagReplace|FlagFirst|FlagLast || h.XID != 7 || int(h.Length) != len(msg)-HeaderLen {
		t.Fatalf("%+v %v", h, err)
	}
}

func FuzzParseAttrs(f *testing.F) {
	f.Add(AppendAttrs(nil, String(TagEntityID, "blockwire"), Delimiter(), Uint32(TagEntityProtocol, 2)))
	f.Add([]byte{0, 0, 0, 1, 0xff, 0xff, 0xff, 0xfc})
	f.Fuzz(func(t *testing.T, b []byte) {
		attrs, err := ParseAttrs(b)
		if err != nil {
			return
		}
		if got := AppendAttrs(nil, attrs...); !bytes.Equal(got, b) {
			t.Fatalf("re-encoding differs:\n% x\n% x", got, b)
		}
	})
}

func FuzzDecodeResponse(f *testing.F) {
	f.Add([]byte{0, 1, 0x80, 1, 0, 4, 0x48, 0, 0, 1, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(b)
		if err != nil {
			return
		}
		DecodeResponse(h, b[HeaderLen:])
	})
}
