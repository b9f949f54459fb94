package srp

import (
	"bytes"
	"testing"
)

// FuzzDecode feeds arbitrary bytes to every IU decoder: none may panic or
// read past the IU, and what decodes must encode back to an IU that
// decodes to the same thing.
func FuzzDecode(f *testing.F) {
	c := Cmd{Tag: 1, CDB: []byte{0x28}, In: Direct(Desc{1, 2, 512})}
	b, _ := c.Append(nil, 0)
	f.Add(b, uint16(0))
	c = Cmd{Tag: 2, CDB: make([]byte, 32), Out: Indirect(Desc{}, []Desc{{1, 2, 3}, {4, 5, 6}}), In: Direct(Desc{7, 8, 9})}
	b, _ = c.Append(nil, 0)
	f.Add(b, uint16(0))
	c = Cmd{Tag: 3, CDB: []byte{0x2a}, Out: Immediate([]byte("hello"))}
	b, _ = c.Append(nil, 68)
	f.Add(b, uint16(68))
	lr := LoginReq{MaxITIULen: 8260, BufFormats: BufDirect | BufIndirect, Immediate: true, ImmDataOffset: 68}
	f.Add(lr.Append(nil), uint16(0))
	f.Add(lr.AppendCM(nil), uint16(1))
	r := Rsp{Tag: 4, Status: 2, Sense: []byte{0x70, 0, 5}, RespData: []byte{0, 0, 0, 9}}
	f.Add(r.Append(nil), uint16(0))
	tm := TskMgmt{Tag: 5, Function: TMFLUNReset}
	f.Add(tm.Append(nil), uint16(0))
	ar := AerReq{Tag: 6, Sense: []byte{0x70}}
	f.Add(ar.Append(nil), uint16(0))
	f.Fuzz(func(t *testing.T, b []byte, imm uint16) {
		var lr LoginReq
		if lr.DecodeCM(b) == nil {
			var again LoginReq
			if err := again.DecodeCM(lr.AppendCM(nil)); err != nil || again != lr {
				t.Fatalf("CM login round trip: %+v %v", again, err)
			}
		}
		switch Op(b) {
		case OpCmd:
			var c Cmd
			if c.Decode(b, int(imm)) != nil {
				return
			}
			for _, x := range []*Buffer{&c.Out, &c.In} {
				for i := 0; i < x.InIU(); i++ {
					_ = x.Desc(i)
				}
				if x.Format == FmtImmediate && uint32(len(x.Imm)) != x.Total {
					t.Fatalf("immediate data of %d bytes, length %d", len(x.Imm), x.Total)
				}
			}
			enc, err := c.Append(nil, int(imm))
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			var again Cmd
			if err := again.Decode(enc, int(imm)); err != nil {
				t.Fatalf("re-decode: %v", err)
			}
			if again.Tag != c.Tag || again.LUN != c.LUN || !bytes.Equal(again.CDB, c.CDB) ||
				again.Out.Total != c.Out.Total || again.In.Total != c.In.Total || !bytes.Equal(again.Out.Imm, c.Out.Imm) {
				t.Fatalf("round trip: %+v vs %+v", again, c)
			}
		case OpLoginReq:
			var r LoginReq
			if r.Decode(b) == nil {
				var again LoginReq
				if err := again.Decode(r.Append(nil)); err != nil || again != r {
					t.Fatalf("login round trip: %+v %v", again, err)
				}
			}
		case OpLoginRsp:
			var r LoginRsp
			_ = r.Decode(b)
		case OpLoginRej:
			var r LoginRej
			_ = r.Decode(b)
		case OpRsp:
			var r Rsp
			if r.Decode(b) == nil {
				var again Rsp
				if err := again.Decode(r.Append(nil)); err != nil || !bytes.Equal(again.Sense, r.Sense) || !bytes.Equal(again.RespData, r.RespData) {
					t.Fatalf("response round trip: %v", err)
				}
			}
		case OpTskMgmt:
			var r TskMgmt
			if r.Decode(b) == nil {
				var again TskMgmt
				if err := again.Decode(r.Append(nil)); err != nil || again != r {
					t.Fatalf("TMF round trip: %+v %v", again, err)
				}
			}
		case OpAerReq:
			var r AerReq
			_ = r.Decode(b)
		case OpCredReq:
			var r CredReq
			_ = r.Decode(b)
		case OpTLogout:
			var r TLogout
			_ = r.Decode(b)
		case OpILogout, OpCredRsp, OpAerRsp:
			_, _ = DecodeTagOnly(Op(b), b)
		}
	})
}
