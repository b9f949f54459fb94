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

// FuzzConnect: any Connect data decodes without a panic, and what decodes
// encodes back to the same names and identifiers.
func FuzzConnect(f *testing.F) {
	seed := make([]byte, ConnectDataLen)
	copy(seed[256:], "nqn.2014-08.org.nvmexpress.discovery")
	copy(seed[512:], "nqn.host")
	f.Add(seed)
	f.Fuzz(func(t *testing.T, data []byte) {
		c := Command{Opcode: AdminFabrics, NSID: FabricsConnect}
		k, err := DecodeConnect(&c, data)
		if err != nil {
			return
		}
		out := make([]byte, ConnectDataLen)
		k.Encode(&c, out)
		back, err := DecodeConnect(&c, out)
		if err != nil || back != k {
			t.Fatalf("%+v encodes and decodes as %+v, %v", k, back, err)
		}
	})
}
