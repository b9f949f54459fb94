package nvme

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

// TestEncodeByteLiterals: a submission and a completion queue entry
// against bytes written out by hand from the Base specification's
// layouts (“Common Command Format”, “Common Completion Queue Entry
// Layout”), every field little-endian.
func TestEncodeByteLiterals(t *testing.T) {
	// A Read of 8 blocks at LBA 0x12345678 on namespace 1, its data to
	// come by C2HData (a transport SGL data block of 4 KiB), fused as the
	// first of a pair.
	read := Command{Opcode: OpRead, Fuse: FuseFirst, PSDT: 1, CID: 0xbeef, NSID: 1,
		DPTR: SGL{Length: 4096, ID: SGLTransportDataBlock}, CDW: [6]uint32{0x12345678, 0, 7}}
	var sqe [SQELen]byte
	read.Encode(&sqe)
	want := unhex(t, "0241efbe 01000000 00000000 00000000 00000000 00000000 00000000 00000000 00100000 0000005a 78563412 00000000 07000000 00000000 00000000 00000000")
	if !bytes.Equal(sqe[:], want) {
		t.Errorf("Read SQE:\n got %x\nwant %x", sqe, want)
	}
	var back Command
	if err := back.Decode(&sqe); err != nil || back != read {
		t.Errorf("Read SQE decodes as %+v, %v", back, err)
	}
	// A reservation conflict for CID 7 on SQ 1, SQ head 3, phase set.
	cqe := Completion{SQHD: 3, SQID: 1, CID: 7, Status: StatusReservationConflict, Phase: true}
	var cb [CQELen]byte
	cqe.Encode(&cb)
	if want := unhex(t, "00000000 00000000 03000100 07000781"); !bytes.Equal(cb[:], want) {
		t.Errorf("CQE:\n got %x\nwant %x", cb, want)
	}
	var cback Completion
	cback.Decode(&cb)
	if cback != cqe {
		t.Errorf("CQE decodes as %+v", cback)
	}
}

// TestStatus: the status field's parts, as hosts read them.
func TestStatus(t *testing.T) {
	for _, c := range []struct {
		s       Status
		sct, sc uint8
		dnr     bool
	}{
		{StatusSuccess, 0, 0, false},
		{StatusInvalidField, 0, 0x02, true},
		{StatusNamespaceNotReady, 0, 0x82, false},
		{StatusConnectInvalidHost, 1, 0x84, true},
		{StatusCompareFailure, 2, 0x85, true},
	} {
		if c.s.SCT() != c.sct || c.s.SC() != c.sc || c.s.DNR() != c.dnr || MakeStatus(c.sct, c.sc, c.dnr) != c.s {
			t.Errorf("%v: SCT %d SC %#x DNR %v", c.s, c.s.SCT(), c.s.SC(), c.s.DNR())
		}
	}
	var b [SQELen]byte
	b[1] = 3 // FUSE 3: reserved
	var c Command
	if err := c.Decode(&b); err == nil {
		t.Error("a command with FUSE 3 decoded")
	}
	b = [SQELen]byte{AdminFabrics, 0x40, 1, 0, FabricsConnect}
	if err := c.Decode(&b); err != nil || c.FCType() != FabricsConnect {
		t.Errorf("fabrics Connect: FCType %#x, %v", c.FCType(), err)
	}
}
