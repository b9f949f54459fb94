package nvme

import (
	"testing"
)

// FuzzCommand: any 64 bytes decode without a panic, and an entry that
// decodes encodes back to the same bytes, reserved bits aside (CDW0 bits
// 13:10, the SGL descriptor's bytes 12 to 14).
func FuzzCommand(f *testing.F) {
	f.Add(make([]byte, SQELen))
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < SQELen {
			return
		}
		b := (*[SQELen]byte)(in[:SQELen])
		var c Command
		if c.Decode(b) != nil {
			return
		}
		var out [SQELen]byte
		c.Encode(&out)
		want := *b
		want[1] &^= 0x3c
		want[36], want[37], want[38] = 0, 0, 0
		if out != want {
			t.Fatalf("%x encodes back as %x", want, out)
		}
	})
}
