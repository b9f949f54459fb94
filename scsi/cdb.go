package scsi

import (
	"encoding/binary"
	"fmt"
)

// RW is the decoded addressing of a READ, WRITE, VERIFY, WRITE AND VERIFY,
// PRE-FETCH, SYNCHRONIZE CACHE or WRITE SAME CDB.
type RW struct {
	LBA    uint64
	Blocks uint32 // transfer length in logical blocks
	FUA    bool
	DPO    bool
	BytChk byte // VERIFY / WRITE AND VERIFY byte-check field
	Group  byte
	Flags  byte // byte 1 of the CDB, for handlers that need other bits
}

// DecodeRW decodes the LBA and transfer length of the block commands that
// share the READ(6/10/12/16) layouts (SBC-4 §5). READ(6)/WRITE(6) with a
// transfer length of 0 mean 256 blocks (SBC-4 §5.15). It reports an error
// if the CDB is shorter than its group code says.
func DecodeRW(cdb []byte) (RW, error) {
	if len(cdb) == 0 {
		return RW{}, fmt.Errorf("scsi: empty CDB")
	}
	n := CDBLength(cdb[0])
	if n == 0 || len(cdb) < n {
		return RW{}, fmt.Errorf("scsi: CDB for opcode %#02x is %d bytes, need %d", cdb[0], len(cdb), n)
	}
	var r RW
	switch n {
	case 6:
		r.LBA = uint64(binary.BigEndian.Uint32(cdb[0:4]) & 0x1fffff)
		r.Blocks = uint32(cdb[4])
		if r.Blocks == 0 && (cdb[0] == OpRead6 || cdb[0] == OpWrite6) {
			r.Blocks = 256
		}
		return r, nil
	case 10:
		r.LBA = uint64(binary.BigEndian.Uint32(cdb[2:6]))
		r.Blocks = uint32(binary.BigEndian.Uint16(cdb[7:9]))
		r.Group = cdb[6] & 0x3f
	case 12:
		r.LBA = uint64(binary.BigEndian.Uint32(cdb[2:6]))
		r.Blocks = binary.BigEndian.Uint32(cdb[6:10])
		r.Group = cdb[10] & 0x3f
	case 16:
		r.LBA = binary.BigEndian.Uint64(cdb[2:10])
		r.Blocks = binary.BigEndian.Uint32(cdb[10:14])
		r.Group = cdb[14] & 0x3f
	}
	r.Flags = cdb[1]
	r.FUA = cdb[1]&0x08 != 0
	r.DPO = cdb[1]&0x10 != 0
	r.BytChk = (cdb[1] >> 1) & 0x03
	return r, nil
}

// AllocationLength returns the allocation (or parameter list) length field
// of the commands the target core answers with data, by opcode, and whether
// the CDB holds one.
func AllocationLength(cdb []byte) (uint32, bool) {
	if len(cdb) == 0 || len(cdb) < CDBLength(cdb[0]) {
		return 0, false
	}
	switch cdb[0] {
	case OpInquiry, OpModeSense6, OpRequestSense, OpModeSelect6:
		if cdb[0] == OpInquiry {
			return uint32(binary.BigEndian.Uint16(cdb[3:5])), true
		}
		return uint32(cdb[4]), true
	case OpModeSense10, OpModeSelect10, OpPersistentReserveIn, OpPersistentReserveOut, OpUnmap:
		return uint32(binary.BigEndian.Uint16(cdb[7:9])), true
	case OpReportLuns, OpMaintenanceIn:
		return binary.BigEndian.Uint32(cdb[6:10]), true
	case OpServiceActionIn16:
		return binary.BigEndian.Uint32(cdb[10:14]), true
	}
	return 0, false
}

// LUN encoding (SAM-5 §4.7). The target core uses flat LUN numbers; the
// fabrics carry the 8-byte form.

// EncodeLUN returns the 8-byte SAM LUN for lun, using the peripheral device
// addressing method for LUNs below 256 and flat space addressing up to 16383,
// as Linux and libiscsi expect.
func EncodeLUN(lun uint64) [8]byte {
	var b [8]byte
	if lun < 256 {
		b[1] = byte(lun)
	} else {
		b[0] = 0x40 | byte(lun>>8)&0x3f
		b[1] = byte(lun)
	}
	return b
}

// DecodeLUN returns the flat LUN number of an 8-byte SAM LUN encoded with
// the peripheral device or flat space addressing method, or an error for
// other addressing methods or non-zero second-level fields.
func DecodeLUN(b [8]byte) (uint64, error) {
	if binary.BigEndian.Uint64(b[:])&0x0000ffffffffffff != 0 {
		return 0, fmt.Errorf("scsi: hierarchical LUN %x is not supported", b)
	}
	switch b[0] >> 6 {
	case 0: // peripheral device addressing, bus 0
		if b[0]&0x3f != 0 {
			return 0, fmt.Errorf("scsi: LUN %x addresses bus %d", b, b[0]&0x3f)
		}
		return uint64(b[1]), nil
	case 1: // flat space
		return uint64(b[0]&0x3f)<<8 | uint64(b[1]), nil
	}
	return 0, fmt.Errorf("scsi: LUN %x uses an unsupported addressing method", b)
}
