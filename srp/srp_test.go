package srp

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
)

func TestLoginReqForms(t *testing.T) {
	r := LoginReq{Tag: 0x1122334455667788, MaxITIULen: 8260, BufFormats: BufDirect | BufIndirect,
		MultiChannel: MultiChannelMulti, Immediate: true, ImmDataOffset: 68,
		Initiator: MakePortID(0, 0xc8995efffe09646d), Target: MakePortID(0xc8995efffe09646d, 0xc8995efffe09646d)}
	iu := r.Append(nil)
	if len(iu) != LoginReqLen || iu[0] != 0 || iu[26] != 0x81 || iu[29] != 68 {
		t.Fatalf("IU form: % x", iu)
	}
	var got LoginReq
	if err := got.Decode(iu); err != nil || got != r {
		t.Fatalf("IU round trip: %+v %v", got, err)
	}
	cm := r.AppendCM(nil)
	// struct srp_login_req_rdma: tag, req_buf_fmt, req_flags, opcode,
	// req_it_iu_len, initiator port id, target port id, imm_data_offset.
	want := "1122334455667788" + "0006" + "81" + "00" + "00002044" +
		"0000000000000000c8995efffe09646d" + "c8995efffe09646dc8995efffe09646d" + "0044" + "000000000000"
	if hex.EncodeToString(cm) != want {
		t.Fatalf("CM form:\n got %x\nwant %s", cm, want)
	}
	got = LoginReq{}
	if err := got.DecodeCM(cm); err != nil || got != r {
		t.Fatalf("CM round trip: %+v %v", got, err)
	}
	if err := got.DecodeCM(cm[:40]); err == nil {
		t.Fatal("short CM login decoded")
	}
	cm[11] = 0x02
	if err := got.DecodeCM(cm); err == nil {
		t.Fatal("CM login with the wrong type decoded")
	}
}

func TestLoginRspRej(t *testing.T) {
	r := LoginRsp{ReqLimDelta: 128, Tag: 9, MaxITIULen: 8260, MaxTIIULen: 292,
		BufFormats: BufDirect | BufIndirect | BufImmediate, MultiChannel: MultiChanMaintained, Immediate: true}
	b := r.Append(nil)
	if len(b) != LoginRspLen || b[0] != 0xC0 || b[26] != 0x82 {
		t.Fatalf("% x", b)
	}
	var got LoginRsp
	if err := got.Decode(b); err != nil || got != r {
		t.Fatalf("%+v %v", got, err)
	}
	j := LoginRej{Reason: RejectChannelLimit, Tag: 9, BufFormats: BufDirect}
	b = j.Append(nil)
	var gj LoginRej
	if err := gj.Decode(b); err != nil || gj != j || len(b) != LoginRejLen {
		t.Fatalf("%+v %v", gj, err)
	}
	if gj.Error() != "srp: login rejected: RDMA channel limit reached" {
		t.Fatal(gj.Error())
	}
}

func TestSmallIUs(t *testing.T) {
	tl := TLogout{SolNT: true, Reason: LogoutMultiChannel, Tag: 5}
	var gtl TLogout
	if err := gtl.Decode(tl.Append(nil)); err != nil || gtl != tl {
		t.Fatalf("T_LOGOUT %+v %v", gtl, err)
	}
	il := ILogout{Tag: 6}
	var gil ILogout
	if err := gil.Decode(il.Append(nil)); err != nil || gil != il {
		t.Fatalf("I_LOGOUT %+v %v", gil, err)
	}
	tm := TskMgmt{SolNT: SolFailure, Tag: 7, LUN: 0x0001000000000000, Function: TMFAbortTask, TaskTag: 3}
	b := tm.Append(nil)
	if len(b) != TskMgmtLen || b[30] != 1 || b[20] != 0 || b[21] != 1 {
		t.Fatalf("TSK_MGMT % x", b)
	}
	var gtm TskMgmt
	if err := gtm.Decode(b); err != nil || gtm != tm {
		t.Fatalf("TSK_MGMT %+v %v", gtm, err)
	}
	cr := CredReq{ReqLimDelta: 4, Tag: 8}
	var gcr CredReq
	if err := gcr.Decode(cr.Append(nil)); err != nil || gcr != cr {
		t.Fatalf("CRED_REQ %+v %v", gcr, err)
	}
	if tag, err := DecodeTagOnly(OpCredRsp, AppendCredRsp(nil, 8)); err != nil || tag != 8 {
		t.Fatalf("CRED_RSP %d %v", tag, err)
	}
	if _, err := DecodeTagOnly(OpAerRsp, AppendCredRsp(nil, 8)); err == nil {
		t.Fatal("CRED_RSP decoded as AER_RSP")
	}
	ar := AerReq{ReqLimDelta: 1, Tag: 9, LUN: 0x0002000000000000, Sense: []byte{0x70, 0, 6, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x2a, 9}}
	b = ar.Append(nil)
	if b[21] != 2 || b[31] != 14 || len(b) != AerReqLen+14 {
		t.Fatalf("AER_REQ % x", b)
	}
	var gar AerReq
	if err := gar.Decode(b); err != nil || gar.LUN != ar.LUN || !bytes.Equal(gar.Sense, ar.Sense) {
		t.Fatalf("AER_REQ %+v %v", gar, err)
	}
	if err := gar.Decode(b[:AerReqLen+2]); err == nil {
		t.Fatal("AER_REQ with truncated sense decoded")
	}
}

func TestRsp(t *testing.T) {
	r := Rsp{ReqLimDelta: 1, Tag: 0xabc, Flags: DataInUnder, Status: 2, DataInRes: 512,
		RespData: []byte{0, 0, 0, 0}, Sense: []byte{0x70, 0, 5}}
	b := r.Append(nil)
	if b[18] != DataInUnder|RspValid|SenseValid || len(b) != RspLen+7 {
		t.Fatalf("% x", b)
	}
	var g Rsp
	if err := g.Decode(b); err != nil || g.DataInResidual() != 512 || g.DataOutResidual() != 0 ||
		!bytes.Equal(g.RespData, r.RespData) || !bytes.Equal(g.Sense, r.Sense) {
		t.Fatalf("%+v %v", g, err)
	}
	b[31] = 200 // sense length past the IU
	if err := g.Decode(b); err == nil {
		t.Fatal("sense length past the IU decoded")
	}
	b[18] = 0 // …but it does not count when SNSVALID is clear
	if err := g.Decode(b); err != nil || len(g.Sense) != 0 {
		t.Fatalf("lengths without valid bits: %v", err)
	}
}

func TestCmdDirectAndIndirect(t *testing.T) {
	cdb := []byte{0x2a, 0, 0, 0, 0, 8, 0, 0, 8, 0}
	c := Cmd{Tag: 42, LUN: 0x0001000000000000, CDB: cdb,
		Out: Direct(Desc{VA: 0x7f0000001000, Key: 0x1234, Len: 4096})}
	b, err := c.Append(nil, 0)
	if err != nil || len(b) != CmdLen+DirectLen || b[5] != 0x10 || b[6] != 0 {
		t.Fatalf("% x %v", b, err)
	}
	var g Cmd
	if err := g.Decode(b, 0); err != nil {
		t.Fatal(err)
	}
	if g.Tag != 42 || g.LUN != c.LUN || !bytes.Equal(g.CDB[:10], cdb) || len(g.CDB) != 16 ||
		g.Out.Format != FmtDirect || g.Out.Total != 4096 || g.Out.Desc(0) != (Desc{0x7f0000001000, 0x1234, 4096}) || g.In.Format != FmtNone {
		t.Fatalf("%+v", g)
	}
	// Bidirectional: indirect data-out (two descriptors), direct data-in,
	// a 32-byte CDB (16 additional bytes).
	long := make([]byte, 32)
	long[0] = 0x7f
	c = Cmd{Tag: 1, CDB: long,
		Out: Indirect(Desc{VA: 0x5000, Key: 7}, []Desc{{0x1000, 1, 512}, {0x3000, 2, 1024}}),
		In:  Direct(Desc{VA: 0x9000, Key: 3, Len: 8192})}
	b, err = c.Append(nil, 0)
	if err != nil || len(b) != CmdLen+16+IndirectLen+32+DirectLen || b[31] != 16 || b[5] != 0x21 || b[6] != 2 || b[7] != 0 {
		t.Fatalf("% x %v", b, err)
	}
	g = Cmd{}
	if err := g.Decode(b, 0); err != nil {
		t.Fatal(err)
	}
	if len(g.CDB) != 32 || g.Out.Total != 1536 || g.Out.Count() != 2 || g.Out.External() || g.Out.Desc(1) != (Desc{0x3000, 2, 1024}) ||
		g.Out.Table != (Desc{0x5000, 7, 32}) || g.In.Total != 8192 {
		t.Fatalf("%+v", g)
	}
	// A table with more descriptors than the IU carries is external.
	b[48+16+12+3] = 48 // table length 48: three descriptors, two in the IU
	if err := g.Decode(b, 0); err != nil || !g.Out.External() || g.Out.Count() != 3 {
		t.Fatalf("external: %v %+v", err, g.Out)
	}
	b[48+16+16+3] = 0xff // TOTAL LENGTH no longer matters: not checkable
	if err := g.Decode(b, 0); err != nil {
		t.Fatal(err)
	}
	b[48+16+12+3] = 32
	if err := g.Decode(b, 0); err == nil {
		t.Fatal("indirect TOTAL LENGTH that disagrees with the descriptors decoded")
	}
}

func TestCmdImmediate(t *testing.T) {
	data := bytes.Repeat([]byte{0xa5}, 1024)
	c := Cmd{Tag: 3, CDB: []byte{0x2a}, Out: Immediate(data)}
	// Linux ib_srp puts immediate data at 68 (48 + an indirect header).
	b, err := c.Append(nil, 68)
	if err != nil || len(b) != 68+1024 || b[5] != 0x30 {
		t.Fatalf("%d % x %v", len(b), b[:8], err)
	}
	var g Cmd
	if err := g.Decode(b, 68); err != nil || !bytes.Equal(g.Out.Imm, data) || g.Out.Total != 1024 {
		t.Fatalf("%v %d", err, len(g.Out.Imm))
	}
	var e *Error
	if err := g.Decode(b, 0); !errors.As(err, &e) || e.Logout != LogoutDataOutFormat {
		t.Fatalf("immediate data without agreement: %v", err)
	}
	if err := g.Decode(b[:500], 68); !errors.As(err, &e) || e.Logout != LogoutInvalidIULength {
		t.Fatalf("truncated immediate data: %v", err)
	}
	if _, err := c.Append(nil, 50); err != ErrImmediateOffset {
		t.Fatalf("overlapping offset: %v", err)
	}
	b[5] = 0x03 // immediate data-in does not exist
	if err := g.Decode(b, 68); !errors.As(err, &e) || e.Logout != LogoutDataInFormat {
		t.Fatalf("immediate data-in: %v", err)
	}
}

func TestCmdRejects(t *testing.T) {
	c := Cmd{Tag: 1, CDB: []byte{0x28}, In: Direct(Desc{1, 2, 512})}
	b, _ := c.Append(nil, 0)
	var g Cmd
	var e *Error
	for _, tc := range []struct {
		name   string
		mut    func(b []byte) []byte
		reason LogoutReason
	}{
		{"short", func(b []byte) []byte { return b[:40] }, LogoutInvalidIULength},
		{"descriptor cut", func(b []byte) []byte { return b[:CmdLen+8] }, LogoutInvalidIULength},
		{"additional CDB past the end", func(b []byte) []byte { b[31] = 0xfc; return b }, LogoutInvalidIULength},
		{"format 5 data-in", func(b []byte) []byte { b[5] = 0x05; return b }, LogoutDataInFormat},
		{"format 7 data-out", func(b []byte) []byte { b[5] = 0x71; return b }, LogoutDataOutFormat},
		{"wrong type", func(b []byte) []byte { b[0] = 0x01; return b }, LogoutInvalidIUType},
		{"indirect table not whole", func(b []byte) []byte {
			b[5] = 0x02
			b = append(b, make([]byte, 4)...)
			b[CmdLen+15] = 17
			return b
		}, LogoutDataInFormat},
	} {
		bb := tc.mut(append([]byte(nil), b...))
		err := g.Decode(bb, 0)
		if !errors.As(err, &e) || e.Logout != tc.reason {
			t.Errorf("%s: %v, want logout reason %v", tc.name, err, tc.reason)
		}
	}
}

func TestDecodeAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	c := Cmd{Tag: 1, CDB: []byte{0x28}, In: Direct(Desc{1, 2, 512})}
	b, _ := c.Append(nil, 0)
	var g Cmd
	if n := testing.AllocsPerRun(100, func() { _ = g.Decode(b, 0) }); n != 0 {
		t.Fatalf("%v allocations per SRP_CMD decode", n)
	}
	r := Rsp{Tag: 1, Status: 0}
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() { buf = r.Append(buf[:0]) }); n != 0 {
		t.Fatalf("%v allocations per SRP_RSP encode", n)
	}
}

func TestEncodeCmdAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	buf := make([]byte, 0, 128)
	cdb := make([]byte, 16)
	if n := testing.AllocsPerRun(100, func() {
		c := Cmd{Tag: 1, CDB: cdb, In: Direct(Desc{1, 2, 512})}
		buf, _ = c.Append(buf[:0], 0)
	}); n != 0 {
		t.Fatalf("%v allocations per SRP_CMD encode", n)
	}
}

func TestParsePortID(t *testing.T) {
	want := MakePortID(0x1, 0xc8995efffe09646d)
	for _, s := range []string{want.String(), "0000000000000001c8995efffe09646d", "1:c8995efffe09646d", "0x0000000000000001:0xc8995efffe09646d"} {
		if got, err := ParsePortID(s); err != nil || got != want {
			t.Errorf("%q: %v %v", s, got, err)
		}
	}
	for _, s := range []string{"", "1", "0x1", "g:1", "1:", ":1", "1:2:3", "+1:2", "00000000000000000000000000000001ff", "11111111111111111:1"} {
		if _, err := ParsePortID(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}

func FuzzParsePortID(f *testing.F) {
	f.Add("0x0000000000000001c8995efffe09646d")
	f.Add("1:c8995efffe09646d")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePortID(s)
		if err != nil {
			return
		}
		if q, err := ParsePortID(p.String()); err != nil || q != p {
			t.Fatalf("%q -> %v does not round-trip: %v %v", s, p, q, err)
		}
	})
}
