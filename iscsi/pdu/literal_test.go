package pdu

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
)

// encoder is every PDU type's Encode.
type encoder interface{ Encode(*BHS) }

// TestEncodeByteLiterals encodes one PDU of every opcode and compares the
// header with bytes written out by hand from the layouts of RFC 7143 §11.3
// to §11.19 — four bytes a group, as the RFC draws them — not with what an
// earlier run of the encoder produced. DataSegmentLength and
// TotalAHSLength stay zero: the sender sets them.
func TestEncodeByteLiterals(t *testing.T) {
	lun1 := [8]byte{0, 1}
	isid := [6]byte{0x80, 0, 0, 0, 0, 1}
	for _, c := range []struct {
		name string
		pdu  encoder
		want string
	}{
		{"SCSI Command §11.3", &SCSICommand{Immediate: true, Final: true, Read: true, Attr: AttrSimple, LUN: lun1, ITT: 0x11223344,
			EDTL: 0x10000, CmdSN: 0x0a0b0c0d, ExpStatSN: 0x01020304, CDB: [16]byte{0x28, 0, 0, 0, 0, 0x10, 0, 0, 0x80}},
			"41c10000 00000000 00010000 00000000 11223344 00010000 0a0b0c0d 01020304 28000000 00100000 80000000 00000000"},
		{"SCSI Response §11.4", &SCSIResponse{Underflow: true, Status: 0x02, ITT: 0x11223344, StatSN: 5, ExpCmdSN: 6, MaxCmdSN: 0x25,
			ExpDataSN: 1, Residual: 0x200},
			"21820002 00000000 00000000 00000000 11223344 00000000 00000005 00000006 00000025 00000001 00000000 00000200"},
		{"Task Management Request §11.5", &TaskMgmtReq{Immediate: true, Function: 1, LUN: [8]byte{0, 2}, ITT: 0x10, RTT: 0x0f,
			CmdSN: 7, ExpStatSN: 8, RefCmdSN: 6},
			"42810000 00000000 00020000 00000000 00000010 0000000f 00000007 00000008 00000006 00000000 00000000 00000000"},
		{"Task Management Response §11.6", &TaskMgmtResp{Response: 5, ITT: 0x10, StatSN: 9, ExpCmdSN: 8, MaxCmdSN: 0x27},
			"22800500 00000000 00000000 00000000 00000010 00000000 00000009 00000008 00000027 00000000 00000000 00000000"},
		{"SCSI Data-Out §11.7", &DataOut{Final: true, LUN: lun1, ITT: 0x11223344, TTT: 0x55667788, ExpStatSN: 3, DataSN: 2, Offset: 0x2000},
			"05800000 00000000 00010000 00000000 11223344 55667788 00000000 00000003 00000000 00000002 00002000 00000000"},
		{"SCSI Data-In with status §11.7", &DataIn{Final: true, Underflow: true, HasStatus: true, LUN: lun1, ITT: 0x11223344,
			TTT: ReservedTTT, StatSN: 9, ExpCmdSN: 10, MaxCmdSN: 0x29, DataSN: 3, Offset: 0x6000, Residual: 0x200},
			"25830000 00000000 00010000 00000000 11223344 ffffffff 00000009 0000000a 00000029 00000003 00006000 00000200"},
		{"R2T §11.8", &R2T{LUN: lun1, ITT: 0x11223344, TTT: 0x55667788, StatSN: 9, ExpCmdSN: 10, MaxCmdSN: 0x29, R2TSN: 1,
			Offset: 0x10000, Desired: 0x40000},
			"31800000 00000000 00010000 00000000 11223344 55667788 00000009 0000000a 00000029 00000001 00010000 00040000"},
		{"Asynchronous Message §11.9", &AsyncMsg{StatSN: 9, ExpCmdSN: 10, MaxCmdSN: 0x29, Event: 1, Parameter3: 3},
			"32800000 00000000 00000000 00000000 ffffffff 00000000 00000009 0000000a 00000029 01000000 00000003 00000000"},
		{"Text Request §11.10", &TextReq{Immediate: true, Final: true, ITT: 1, TTT: ReservedTTT, CmdSN: 2, ExpStatSN: 3},
			"44800000 00000000 00000000 00000000 00000001 ffffffff 00000002 00000003 00000000 00000000 00000000 00000000"},
		{"Text Response §11.11", &TextResp{Continue: true, ITT: 1, TTT: 7, StatSN: 4, ExpCmdSN: 3, MaxCmdSN: 0x22},
			"24400000 00000000 00000000 00000000 00000001 00000007 00000004 00000003 00000022 00000000 00000000 00000000"},
		{"Login Request §11.12", &LoginReq{Transit: true, CSG: 1, NSG: 3, ISID: isid, CID: 1, CmdSN: 1},
			"43870000 00000000 80000000 00010000 00000000 00010000 00000001 00000000 00000000 00000000 00000000 00000000"},
		{"Login Response §11.13", &LoginResp{Transit: true, CSG: 1, NSG: 3, ISID: isid, TSIH: 5, StatSN: 0x100, ExpCmdSN: 1,
			MaxCmdSN: 0x80, StatusClass: 2, StatusDetail: 1},
			"23870000 00000000 80000000 00010005 00000000 00000000 00000100 00000001 00000080 02010000 00000000 00000000"},
		{"Logout Request §11.14", &LogoutReq{Immediate: true, ITT: 9, CmdSN: 0x20, ExpStatSN: 0x30},
			"46800000 00000000 00000000 00000000 00000009 00000000 00000020 00000030 00000000 00000000 00000000 00000000"},
		{"Logout Response §11.15", &LogoutResp{ITT: 9, StatSN: 0x31, ExpCmdSN: 0x21, MaxCmdSN: 0xa0, Time2Wait: 2, Time2Retain: 20},
			"26800000 00000000 00000000 00000000 00000009 00000000 00000031 00000021 000000a0 00000000 00020014 00000000"},
		{"SNACK Request (DataACK) §11.16", &SNACKReq{Type: 2, LUN: lun1, ITT: ReservedITT, TTT: 0x55667788, ExpStatSN: 4, BegRun: 5},
			"10820000 00000000 00010000 00000000 ffffffff 55667788 00000000 00000004 00000000 00000000 00000005 00000000"},
		{"Reject §11.17", &Reject{Reason: RejectReason(0x09), StatSN: 0x40, ExpCmdSN: 0x41, MaxCmdSN: 0xc0},
			"3f800900 00000000 00000000 00000000 ffffffff 00000000 00000040 00000041 000000c0 00000000 00000000 00000000"},
		{"NOP-Out §11.18", &NopOut{Immediate: true, ITT: 0x1000, TTT: ReservedTTT, CmdSN: 0x20, ExpStatSN: 0x30},
			"40800000 00000000 00000000 00000000 00001000 ffffffff 00000020 00000030 00000000 00000000 00000000 00000000"},
		{"NOP-In §11.19", &NopIn{ITT: ReservedITT, TTT: 5, StatSN: 0x30, ExpCmdSN: 0x21, MaxCmdSN: 0xa0},
			"20800000 00000000 00000000 00000000 ffffffff 00000005 00000030 00000021 000000a0 00000000 00000000 00000000"},
	} {
		want, err := hex.DecodeString(strings.ReplaceAll(c.want, " ", ""))
		if err != nil || len(want) != BHSLen {
			t.Fatalf("%s: bad literal (%v, %d bytes)", c.name, err, len(want))
		}
		var h BHS
		c.pdu.Encode(&h)
		if !bytes.Equal(h[:], want) {
			t.Errorf("%s:\n got %x\nwant %x", c.name, h[:], want)
		}
	}
}

// TestSharedFieldAccessors: the accessors code outside this package uses
// to route a PDU read the fields the typed PDUs write.
func TestSharedFieldAccessors(t *testing.T) {
	var h BHS
	(&DataIn{Final: true, HasStatus: true, ITT: 1, TTT: 2, StatSN: 3, ExpCmdSN: 4, MaxCmdSN: 5, Offset: 6}).Encode(&h)
	if h.TTT() != 2 || h.StatSN() != 3 || h.ExpCmdSN() != 4 || h.MaxCmdSN() != 5 || h.BufferOffset() != 6 || !h.DataInStatus() {
		t.Errorf("Data-In: TTT %d StatSN %d ExpCmdSN %d MaxCmdSN %d offset %d status %v", h.TTT(), h.StatSN(), h.ExpCmdSN(), h.MaxCmdSN(), h.BufferOffset(), h.DataInStatus())
	}
	(&NopOut{Immediate: true, ITT: 1, TTT: 2, CmdSN: 7, ExpStatSN: 8}).Encode(&h)
	if h.CmdSN() != 7 || h.ExpStatSN() != 8 || !h.Immediate() || h.DataInStatus() {
		t.Errorf("NOP-Out: CmdSN %d ExpStatSN %d immediate %v", h.CmdSN(), h.ExpStatSN(), h.Immediate())
	}
	h.SetImmediate(false)
	h.SetCmdSN(9)
	h.SetExpStatSN(10)
	var n NopOut
	if err := n.Decode(&h); err != nil || n.Immediate || n.CmdSN != 9 || n.ExpStatSN != 10 {
		t.Errorf("after the setters: %+v %v", n, err)
	}
	(&Reject{Reason: RejectReason(0x09)}).Encode(&h)
	if h.Response() != 0x09 {
		t.Errorf("Reject reason %#x", h.Response())
	}
	(&SNACKReq{Type: 2, TTT: 3, BegRun: 4}).Encode(&h)
	if h.SNACKType() != 2 || h.TTT() != 3 || h.BufferOffset() != 4 {
		t.Errorf("SNACK: type %d TTT %d BegRun %d", h.SNACKType(), h.TTT(), h.BufferOffset())
	}
}
