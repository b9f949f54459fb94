package nvmetcp

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
)

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEncodeByteLiterals encodes one PDU of every type and compares it
// with bytes written out by hand from the NVMe/TCP transport
// specification's PDU layouts — four bytes a group, every field
// little-endian — not with what an earlier run of the encoder produced.
func TestEncodeByteLiterals(t *testing.T) {
	var sqe [SQELen]byte
	copy(sqe[:], unhex(t, "01400700 01000000 00000000 00000000 00000000 00000000 00000000 00000000 00020000 00000001 10000000"))
	var cqe [CQELen]byte
	copy(cqe[:], unhex(t, "00000000 00000000 03000100 07000681"))
	ic := func(enc func(*[ICLen]byte)) []byte {
		var b [ICLen]byte
		enc(&b)
		return b[:]
	}
	fixed := func(n int, enc func([]byte)) []byte {
		b := make([]byte, n)
		enc(b)
		return b
	}
	for _, c := range []struct {
		name string
		got  []byte
		want string
	}{
		{"ICReq: both digests, MAXR2T 0 (one R2T)", ic((&ICReq{HeaderDigest: true, DataDigest: true}).Encode),
			"00008000 80000000 00000003 00000000" + strings.Repeat("00000000", 28)},
		{"ICResp: data digest, MAXH2CDATA 128 KiB", ic((&ICResp{DataDigest: true, MaxH2CData: 0x20000}).Encode),
			"01008000 80000000 00000002 00000200" + strings.Repeat("00000000", 28)},
		{"CapsuleCmd: a Write of 512 bytes in the capsule, both digests", fixed(CapsuleCmdLen, (&CapsuleCmd{Flags: FlagHDGST | FlagDDGST, PDO: 76, PLen: 76 + 512 + 4, SQE: sqe}).Encode),
			"0403484c 50020000 01400700 01000000 00000000 00000000 00000000 00000000 00000000 00000000 00020000 00000001 10000000" + strings.Repeat("00000000", 5)},
		{"CapsuleResp: header digest, a reservation conflict", fixed(CapsuleRespLen, (&CapsuleResp{Flags: FlagHDGST, CQE: cqe}).Encode),
			"05011800 1c000000 00000000 00000000 03000100 07000681"},
		{"H2CData: the last 4 KiB of an R2T, data digest", fixed(DataLen, (&Data{Type: TypeH2CData, Flags: FlagLastPDU | FlagDDGST, PDO: 24, PLen: 24 + 4096 + 4,
			CCCID: 7, TTag: 3, Offset: 0x1000, Length: 0x1000}).Encode),
			"06061818 1c100000 07000300 00100000 00100000 00000000"},
		{"C2HData: last and successful, 512 bytes", fixed(DataLen, (&Data{Type: TypeC2HData, Flags: FlagLastPDU | FlagSuccess, PDO: 24, PLen: 24 + 512,
			CCCID: 7, Offset: 0, Length: 512}).Encode),
			"070c1818 18020000 07000000 00000000 00020000 00000000"},
		{"R2T: 64 KiB from 8 KiB", fixed(R2TLen, (&R2T{CCCID: 7, TTag: 3, Offset: 0x2000, Length: 0x10000}).Encode),
			"09001800 18000000 07000300 00200000 00000100 00000000"},
		{"C2HTermReq: invalid HLEN, with the offending common header", (&Term{Type: TypeC2HTermReq, FES: FESInvalidHeaderField, FEI: 2}).Append(nil, unhex(t, "04004800 48000000")),
			"03001800 20000000 01000200 00000000 00000000 00000000 04004800 48000000"},
	} {
		if want := unhex(t, c.want); !bytes.Equal(c.got, want) {
			t.Errorf("%s:\n got %x\nwant %x", c.name, c.got, want)
		}
	}
}

// TestDecodeRefuses: what the transport fixes is checked, each refusal
// naming the field (and its offset, the termination request's FEI).
func TestDecodeRefuses(t *testing.T) {
	for _, c := range []struct {
		name, hdr, field string
		decode           func([]byte) error
	}{
		{"unknown type", "08001800 18000000", "PDU-Type", func(b []byte) error { var c Common; return c.Decode(b) }},
		{"R2T with a capsule's HLEN", "09004800 48000000", "HLEN", func(b []byte) error { var c Common; return c.Decode(b) }},
		{"PLEN shorter than the header and its digest", "09011800 18000000", "PLEN", func(b []byte) error { var c Common; return c.Decode(b) }},
		{"PDO inside the header", "06001810 20000000 07000300 00000000 08000000 00000000", "PDO", func(b []byte) error { var d Data; return d.Decode(b) }},
		{"DATAL more than the PDU carries", "06001818 20000000 07000300 00000000 09000000 00000000", "DATAL", func(b []byte) error { var d Data; return d.Decode(b) }},
		{"SUCCESS without LAST_PDU", "07081818 20000000 07000000 00000000 08000000 00000000", "FLAGS", func(b []byte) error { var d Data; return d.Decode(b) }},
		{"SUCCESS on an H2CData", "060c1818 20000000 07000300 00000000 08000000 00000000", "FLAGS", func(b []byte) error { var d Data; return d.Decode(b) }},
		{"R2T for nothing", "09001800 18000000 07000300 00000000 00000000 00000000", "R2TL", func(b []byte) error { var r R2T; return r.Decode(b) }},
		{"response capsule with data", "05001818 1c000000 00000000 00000000 00000000 00000000", "PDO", func(b []byte) error { var r CapsuleResp; return r.Decode(b) }},
		{"termination request too long", "03001800 ff000000 01000000 00000000 00000000 00000000", "PLEN", func(b []byte) error { var r Term; return r.Decode(b) }},
	} {
		err := c.decode(unhex(t, c.hdr))
		fe, ok := err.(*FieldError)
		if !ok || fe.Field != c.field {
			t.Errorf("%s: %v, want an error in %s", c.name, err, c.field)
		}
	}
	var resp ICResp
	var b [ICLen]byte
	(&ICResp{MaxH2CData: 1024}).Encode(&b)
	if err := resp.Decode(&b); err == nil {
		t.Error("ICResp granting MAXH2CDATA 1024 (under 4096) decoded")
	}
}

// TestRoundTrips: what Encode writes, Decode reads back.
func TestRoundTrips(t *testing.T) {
	var b [ICLen]byte
	req := ICReq{PFV: 0, HPDA: 3, HeaderDigest: true, MaxR2T: 7}
	req.Encode(&b)
	var req2 ICReq
	if err := req2.Decode(&b); err != nil || req2 != req {
		t.Errorf("ICReq %+v, %v", req2, err)
	}
	d := Data{Type: TypeC2HData, Flags: FlagHDGST | FlagDDGST | FlagLastPDU, PDO: 32, PLen: 32 + 100 + 4, CCCID: 9, Offset: 4096, Length: 100}
	hb := make([]byte, DataLen)
	d.Encode(hb)
	var d2 Data
	if err := d2.Decode(hb); err != nil || d2 != d {
		t.Errorf("C2HData %+v, %v", d2, err)
	}
	c := CapsuleCmd{PDO: 72, PLen: 72 + 8, SQE: [SQELen]byte{2, 0x40, 1}}
	cb := make([]byte, CapsuleCmdLen)
	c.Encode(cb)
	var c2 CapsuleCmd
	if err := c2.Decode(cb); err != nil || c2 != c {
		t.Errorf("CapsuleCmd %+v, %v", c2, err)
	}
	var h Common
	if err := h.Decode(cb); err != nil || h.DataLength() != 8 {
		t.Errorf("capsule's in-capsule data: %d bytes, %v", h.DataLength(), err)
	}
}

// TestDigest: CRC32C, the digests' polynomial, with its check value
// (the CRC of "123456789"), written little-endian.
func TestDigest(t *testing.T) {
	if d := Digest([]byte("123456789")); d != 0xe3069283 {
		t.Fatalf("CRC32C check value %#x, want 0xe3069283", d)
	}
	var b [DigestLen]byte
	PutDigest(b[:], 0xe3069283)
	if b != [4]byte{0x83, 0x92, 0x06, 0xe3} || GetDigest(b[:]) != 0xe3069283 {
		t.Fatalf("digest bytes %x", b)
	}
}
