package pdu

import (
	"reflect"
	"testing"
)

// every returns one populated value of every typed PDU.
func every() []interface {
	Encode(*BHS)
	Decode(*BHS) error
} {
	lun := [8]byte{0, 3}
	return []interface {
		Encode(*BHS)
		Decode(*BHS) error
	}{
		&SCSICommand{Immediate: true, Final: true, Read: true, Attr: AttrSimple, LUN: lun, ITT: 7, EDTL: 4096, CmdSN: 9, ExpStatSN: 11, CDB: [16]byte{0x28, 0, 0, 0, 0, 1, 0, 0, 8}},
		&SCSIResponse{Underflow: true, Response: RespCompleted, Status: 2, ITT: 7, StatSN: 3, ExpCmdSN: 4, MaxCmdSN: 5, ExpDataSN: 6, Residual: 512},
		&TaskMgmtReq{Immediate: true, Function: TMFAbortTask, LUN: lun, ITT: 8, RTT: 7, CmdSN: 10, ExpStatSN: 3, RefCmdSN: 9},
		&TaskMgmtResp{Response: TMFRespNoTask, ITT: 8, StatSN: 4, ExpCmdSN: 10, MaxCmdSN: 40},
		&DataOut{Final: true, LUN: lun, ITT: 7, TTT: 0x13, ExpStatSN: 3, DataSN: 2, Offset: 65536},
		&DataIn{Final: true, HasStatus: true, Underflow: true, Status: 0, LUN: lun, ITT: 7, TTT: ReservedTTT, StatSN: 4, ExpCmdSN: 5, MaxCmdSN: 6, DataSN: 1, Offset: 8192, Residual: 100},
		&R2T{LUN: lun, ITT: 7, TTT: 0x13, StatSN: 4, ExpCmdSN: 5, MaxCmdSN: 6, R2TSN: 1, Offset: 327680, Desired: 196608},
		&AsyncMsg{LUN: lun, StatSN: 4, ExpCmdSN: 5, MaxCmdSN: 6, Event: AsyncLogoutRequest, Parameter3: 5},
		&TextReq{Final: true, ITT: 1, TTT: ReservedTTT, CmdSN: 2, ExpStatSN: 3},
		&TextResp{Final: true, ITT: 1, TTT: ReservedTTT, StatSN: 2, ExpCmdSN: 3, MaxCmdSN: 4},
		&LoginReq{Transit: true, CSG: StageOperational, NSG: StageFullFeature, ISID: [6]byte{0, 2, 0x3d, 0, 0, 1}, ITT: 1, CID: 0, CmdSN: 0, ExpStatSN: 0},
		&LoginResp{Transit: true, CSG: StageOperational, NSG: StageFullFeature, ISID: [6]byte{0, 2, 0x3d, 0, 0, 1}, TSIH: 1, ITT: 1, StatSN: 5, ExpCmdSN: 0, MaxCmdSN: 63, StatusClass: 2, StatusDetail: 1},
		&LogoutReq{Immediate: true, Reason: LogoutCloseConnection, ITT: 5, CID: 2, CmdSN: 9, ExpStatSN: 8},
		&LogoutResp{Response: LogoutRespCIDNotFound, ITT: 5, StatSN: 8, ExpCmdSN: 9, MaxCmdSN: 10, Time2Wait: 2, Time2Retain: 20},
		&SNACKReq{Type: SNACKStatus, LUN: lun, ITT: 5, TTT: ReservedTTT, ExpStatSN: 3, BegRun: 1, RunLength: 2},
		&NopOut{Immediate: true, LUN: lun, ITT: 3, TTT: ReservedTTT, CmdSN: 4, ExpStatSN: 5},
		&NopIn{LUN: lun, ITT: ReservedITT, TTT: 9, StatSN: 4, ExpCmdSN: 5, MaxCmdSN: 6},
	}
}

func TestRoundTripEveryOpcode(t *testing.T) {
	seen := map[Opcode]bool{}
	for _, p := range every() {
		var h BHS
		p.Encode(&h)
		if _, ok := p.(*Reject); !ok {
			if err := p.Decode(&h); err != nil {
				t.Fatalf("%T: decode of encoded PDU: %v", p, err)
			}
		}
		fresh := reflect.New(reflect.TypeOf(p).Elem()).Interface().(interface{ Decode(*BHS) error })
		if err := fresh.Decode(&h); err != nil {
			t.Fatalf("%T: %v", p, err)
		}
		if !reflect.DeepEqual(fresh, p) {
			t.Errorf("%T round trip:\n got %+v\nwant %+v", p, fresh, p)
		}
		seen[h.Opcode()] = true
	}
	// Reject needs its data segment length set to be valid.
	var h BHS
	(&Reject{Reason: RejectInvalidPDUField, StatSN: 1}).Encode(&h)
	h.SetDataSegmentLength(BHSLen)
	var r Reject
	if err := r.Decode(&h); err != nil || r.Reason != RejectInvalidPDUField || r.StatSN != 1 {
		t.Fatalf("Reject round trip: %+v %v", r, err)
	}
	seen[h.Opcode()] = true
	for op := Opcode(0); op < 64; op++ {
		if op.Known() && !seen[op] {
			t.Errorf("no round-trip test for %s", op)
		}
	}
	if len(seen) != 18 {
		t.Errorf("%d opcodes round-tripped, RFC 7143 defines 18", len(seen))
	}
}

// TestOneWayNop: a NOP with ITT and TTT both 0xffffffff asks for no
// answer (RFC 7143 §11.18.1, §11.19.1); tgt sends such NOP-Ins, and an
// initiator may send such a NOP-Out to confirm ExpStatSN.
func TestOneWayNop(t *testing.T) {
	var h BHS
	in := NopIn{ITT: ReservedITT, TTT: ReservedTTT, StatSN: 7, ExpCmdSN: 3, MaxCmdSN: 10}
	in.Encode(&h)
	var gotIn NopIn
	if err := gotIn.Decode(&h); err != nil || gotIn != in {
		t.Fatalf("one-way NOP-In: %+v %v", gotIn, err)
	}
	out := NopOut{Immediate: true, ITT: ReservedITT, TTT: ReservedTTT, CmdSN: 3, ExpStatSN: 8}
	out.Encode(&h)
	var gotOut NopOut
	if err := gotOut.Decode(&h); err != nil || gotOut != out {
		t.Fatalf("one-way NOP-Out: %+v %v", gotOut, err)
	}
}

func TestDecodeErrorsNameTheRule(t *testing.T) {
	cases := []struct {
		name string
		p    interface {
			Encode(*BHS)
			Decode(*BHS) error
		}
		mutate func(*BHS)
		reason RejectReason
	}{
		{"R=W=0 with EDTL", &SCSICommand{Final: true, ITT: 1, EDTL: 512}, nil, RejectInvalidPDUField},
		{"reserved ITT", &SCSICommand{Final: true, ITT: ReservedITT}, nil, RejectInvalidPDUField},
		{"login T and C", &LoginReq{Transit: true, NSG: 1, ITT: 1}, func(h *BHS) { h[1] |= 0x40 }, RejectProtocolError},
		{"login stage 2", &LoginReq{Transit: true, CSG: 0, NSG: 2}, nil, RejectProtocolError},
		{"login no advance", &LoginReq{Transit: true, CSG: 1, NSG: 1}, nil, RejectProtocolError},
		{"one-way nop not immediate", &NopOut{ITT: ReservedITT, TTT: ReservedTTT}, nil, RejectProtocolError},
		{"tmf data", &TaskMgmtReq{Function: 1}, func(h *BHS) { h.SetDataSegmentLength(4) }, RejectProtocolError},
		{"logout reason", &LogoutReq{Reason: 3}, nil, RejectInvalidPDUField},
		{"text F and C", &TextReq{Final: true, Continue: true, ITT: 1}, nil, RejectProtocolError},
		{"data-in S without F", &DataIn{HasStatus: true}, func(h *BHS) { h[1] &^= 0x80 }, RejectProtocolError},
	}
	for _, c := range cases {
		var h BHS
		c.p.Encode(&h)
		if c.mutate != nil {
			c.mutate(&h)
		}
		err := c.p.Decode(&h)
		pe, ok := err.(*Error)
		if !ok {
			t.Errorf("%s: got %v, want *pdu.Error", c.name, err)
			continue
		}
		if pe.Reason != c.reason || pe.Rule == "" {
			t.Errorf("%s: reason %#x rule %q, want reason %#x and a rule", c.name, pe.Reason, pe.Rule, c.reason)
		}
	}
}

func TestAHS(t *testing.T) {
	cdb := make([]byte, 32)
	for i := range cdb {
		cdb[i] = byte(i)
	}
	b := AppendExtendedCDB(nil, cdb)
	b = AppendBidiReadLength(b, 12345)
	if len(b)%4 != 0 {
		t.Fatalf("AHS of %d bytes is not padded", len(b))
	}
	a, err := ParseAHS(OpSCSICommand, b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.ExtCDB, cdb[16:]) || !a.HasBidi || a.BidiReadLength != 12345 {
		t.Fatalf("got %+v", a)
	}
	if _, err := ParseAHS(OpSCSICommand, []byte{0, 9, 1, 0, 1, 2, 3, 4}); err == nil {
		t.Fatal("AHS length past the end accepted")
	}
	if _, err := ParseAHS(OpSCSICommand, []byte{0, 1, 9, 0}); err == nil {
		t.Fatal("unknown AHS type accepted")
	}
}

func TestPad(t *testing.T) {
	for n, want := range map[int]int{0: 0, 1: 3, 2: 2, 3: 1, 4: 0, 5: 3, 48: 0} {
		if Pad(n) != want || len(PadFor(n)) != want {
			t.Errorf("Pad(%d) = %d, want %d", n, Pad(n), want)
		}
	}
}

func FuzzDecodeBHS(f *testing.F) {
	for _, p := range every() {
		var h BHS
		p.Encode(&h)
		f.Add(h[:])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < BHSLen {
			return
		}
		h := BHS(b[:BHSLen])
		// Every decoder must return cleanly on any header, and a header
		// that decodes must re-encode to something that decodes equal.
		for _, p := range every() {
			fresh := reflect.New(reflect.TypeOf(p).Elem()).Interface().(interface {
				Encode(*BHS)
				Decode(*BHS) error
			})
			if err := fresh.Decode(&h); err != nil {
				if _, ok := err.(*Error); !ok {
					t.Fatalf("%T: non-pdu error %v", fresh, err)
				}
				continue
			}
			var h2 BHS
			fresh.Encode(&h2)
			h2.SetDataSegmentLength(h.DataSegmentLength())
			again := reflect.New(reflect.TypeOf(p).Elem()).Interface().(interface{ Decode(*BHS) error })
			if err := again.Decode(&h2); err != nil {
				t.Fatalf("%T: re-encoded header fails: %v", fresh, err)
			}
			if !reflect.DeepEqual(again, fresh) {
				t.Fatalf("%T: unstable round trip", fresh)
			}
		}
		_ = h.Opcode().String()
	})
}

func FuzzParseAHS(f *testing.F) {
	f.Add(AppendBidiReadLength(AppendExtendedCDB(nil, make([]byte, 24)), 7))
	f.Add([]byte{0, 1, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseAHS(OpSCSICommand, b)
		if err == nil && len(a.ExtCDB) > len(b) {
			t.Fatal("extended CDB longer than the AHS")
		}
	})
}

func TestDataDigestPad(t *testing.T) {
	for n := 0; n < 9; n++ {
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(0xa5 + i)
		}
		if got, want := DataDigest(data), Digest(data, make([]byte, Pad(n))); got != want {
			t.Errorf("len %d: %#x, want %#x", n, got, want)
		}
	}
}
