package nvmetcp

import (
	"bytes"
	"testing"
)

// FuzzDecode feeds every header parser the same bytes: none panics, and
// a header one accepts encodes back to the bytes it read (reserved bytes
// aside: a C2HData's TTAG).
func FuzzDecode(f *testing.F) {
	for _, s := range [][]byte{
		{0x06, 0x06, 0x18, 0x18, 0x1c, 0x10, 0, 0, 7, 0, 3, 0, 0, 0x10, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0},
		{0x09, 0, 0x18, 0, 0x18, 0, 0, 0, 7, 0, 3, 0, 0, 0x20, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0},
		{0x05, 0, 0x18, 0, 0x18, 0, 0, 0},
		{0x03, 0, 0x18, 0, 0x20, 0, 0, 0, 1, 0, 2, 0},
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var c Common
		_ = c.Decode(b)
		_ = c.DataLength()
		var d Data
		if d.Decode(b) == nil {
			out := make([]byte, DataLen)
			d.Encode(out)
			in := bytes.Clone(b[:20])
			if d.Type == TypeC2HData {
				in[10], in[11] = 0, 0 // TTAG is reserved in a C2HData
			}
			if !bytes.Equal(out[:20], in) {
				t.Fatalf("data header %x encodes back as %x", b[:20], out[:20])
			}
		}
		var r R2T
		if r.Decode(b) == nil {
			out := make([]byte, R2TLen)
			r.Encode(out)
			if !bytes.Equal(out[8:20], b[8:20]) {
				t.Fatalf("R2T %x encodes back as %x", b[:20], out[:20])
			}
		}
		var tr Term
		_ = tr.Decode(b)
		var cc CapsuleCmd
		_ = cc.Decode(b)
		var cr CapsuleResp
		_ = cr.Decode(b)
		if len(b) >= ICLen {
			ic := (*[ICLen]byte)(b[:ICLen])
			var q ICReq
			_ = q.Decode(ic)
			var p ICResp
			_ = p.Decode(ic)
		}
	})
}
