package pdu

import (
	"path/filepath"
	"testing"

	"github.com/blockwire/blockwire/internal/pcaptest"
)

// decodeAny decodes a header with the typed view of its opcode.
func decodeAny(h *BHS) (any, error) {
	var p interface{ Decode(*BHS) error }
	switch h.Opcode() {
	case OpNopOut:
		p = &NopOut{}
	case OpSCSICommand:
		p = &SCSICommand{}
	case OpTaskMgmtReq:
		p = &TaskMgmtReq{}
	case OpLoginReq:
		p = &LoginReq{}
	case OpTextReq:
		p = &TextReq{}
	case OpDataOut:
		p = &DataOut{}
	case OpLogoutReq:
		p = &LogoutReq{}
	case OpSNACKReq:
		p = &SNACKReq{}
	case OpNopIn:
		p = &NopIn{}
	case OpSCSIResponse:
		p = &SCSIResponse{}
	case OpTaskMgmtResp:
		p = &TaskMgmtResp{}
	case OpLoginResp:
		p = &LoginResp{}
	case OpTextResp:
		p = &TextResp{}
	case OpDataIn:
		p = &DataIn{}
	case OpLogoutResp:
		p = &LogoutResp{}
	case OpR2T:
		p = &R2T{}
	case OpAsyncMsg:
		p = &AsyncMsg{}
	case OpReject:
		p = &Reject{}
	default:
		return nil, &Error{Op: h.Opcode(), Rule: "§11.2.1.2", Msg: "unknown opcode"}
	}
	return p, p.Decode(h)
}

// TestGoldenLinuxLIO decodes every PDU that open-iscsi and LIO exchanged in
// shared/captures/iscsi-tcp.pcap and checks the frames the captures README
// describes.
func TestGoldenLinuxLIO(t *testing.T) {
	pdus, err := pcaptest.ISCSIPDUs(filepath.Join(pcaptest.Dir(t), "iscsi-tcp.pcap"), 3260)
	if err != nil {
		t.Fatal(err)
	}
	var r2ts []R2T
	var loginResp []LoginResp
	collapsed := 0
	counts := map[Opcode]int{}
	for _, raw := range pdus {
		h := BHS(raw.BHS)
		p, err := decodeAny(&h)
		if err != nil {
			t.Fatalf("frame %d: %v", raw.Frame, err)
		}
		counts[h.Opcode()]++
		switch v := p.(type) {
		case *R2T:
			r2ts = append(r2ts, *v)
		case *LoginResp:
			loginResp = append(loginResp, *v)
		case *DataIn:
			if v.HasStatus {
				collapsed++
			}
		case *SCSICommand:
			if v.Write && len(raw.Data) > 0 && uint32(len(raw.Data)) > v.EDTL {
				t.Errorf("frame %d: immediate data longer than EDTL", raw.Frame)
			}
		}
	}
	if len(r2ts) != 2 {
		t.Fatalf("got %d R2Ts, the capture has 2", len(r2ts))
	}
	if r := r2ts[0]; r.R2TSN != 0 || r.Offset != 65536 || r.Desired != 262144 || r.TTT != 0x13 {
		t.Errorf("first R2T %+v, want R2TSN 0 offset 65536 desired 262144 TTT 0x13", r)
	}
	if r := r2ts[1]; r.R2TSN != 1 || r.Offset != 327680 || r.Desired != 196608 {
		t.Errorf("second R2T %+v, want R2TSN 1 offset 327680 desired 196608", r)
	}
	final := 0
	for _, l := range loginResp {
		if l.Transit && l.NSG == StageFullFeature {
			final++
			if l.TSIH != 1 || l.StatusClass != 0 {
				t.Errorf("final login response %+v, want TSIH 1 and success", l)
			}
		}
	}
	if final != 2 {
		t.Errorf("%d final login responses, want 2 (discovery and normal)", final)
	}
	if collapsed == 0 {
		t.Error("no Data-In with phase-collapsed status")
	}
	if counts[OpLogoutReq] != 1 || counts[OpLogoutResp] != 1 {
		t.Errorf("logout counts %d/%d, want 1/1", counts[OpLogoutReq], counts[OpLogoutResp])
	}
}

// TestGoldenDigests checks our CRC32C against every digest LIO and
// open-iscsi computed in iscsi-tcp-digest.pcap (63 of them).
func TestGoldenDigests(t *testing.T) {
	pdus, err := pcaptest.ISCSIPDUs(filepath.Join(pcaptest.Dir(t), "iscsi-tcp-digest.pcap"), 3260)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, raw := range pdus {
		h := BHS(raw.BHS)
		if _, err := decodeAny(&h); err != nil {
			t.Fatalf("frame %d: %v", raw.Frame, err)
		}
		if raw.HeaderCRC != nil {
			n++
			if !*raw.HeaderCRC {
				t.Errorf("frame %d: header digest mismatch", raw.Frame)
			}
			if got := Digest(raw.BHS, raw.AHS); got != GetDigest(raw.HD) {
				t.Errorf("frame %d: our header digest %#x, wire %#x", raw.Frame, got, GetDigest(raw.HD))
			}
		}
		if raw.DataCRC != nil {
			n++
			if !*raw.DataCRC {
				t.Errorf("frame %d: data digest mismatch", raw.Frame)
			}
			if got := Digest(raw.Data, PadFor(len(raw.Data))); got != GetDigest(raw.DD) {
				t.Errorf("frame %d: our data digest %#x, wire %#x", raw.Frame, got, GetDigest(raw.DD))
			}
		}
	}
	if n != 63 {
		t.Errorf("verified %d digests, the capture has 63", n)
	}
	// Frame 25's header digest 0x6a84dcab travels as ab dc 84 6a.
	var b [4]byte
	PutDigest(b[:], 0x6a84dcab)
	if b != [4]byte{0xab, 0xdc, 0x84, 0x6a} {
		t.Errorf("PutDigest wire order %x", b)
	}
}
