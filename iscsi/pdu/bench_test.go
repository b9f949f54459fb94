package pdu

import "testing"

func BenchmarkEncodeDecodeSCSICommand(b *testing.B) {
	cmd := SCSICommand{Final: true, Read: true, Attr: AttrSimple, ITT: 7, EDTL: 4096, CmdSN: 9, CDB: [16]byte{0x28, 0, 0, 0, 0, 1, 0, 0, 8}}
	var h BHS
	var out SCSICommand
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		cmd.ITT = uint32(i)
		cmd.Encode(&h)
		if err := out.Decode(&h); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDataDigest8K(b *testing.B) {
	data := make([]byte, 8192)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		DataDigest(data)
	}
}

func BenchmarkHeaderDigest(b *testing.B) {
	var h BHS
	b.SetBytes(BHSLen)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		Digest(h[:])
	}
}
