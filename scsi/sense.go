package scsi

import (
	"encoding/binary"
	"fmt"
)

// Sense describes one sense condition. It is also an error, so command
// handlers can return it directly; the target core turns it into CHECK
// CONDITION with the sense data encoded in the format the LU uses.
type Sense struct {
	Key  byte
	ASC  byte
	ASCQ byte

	// Information, when Valid, fills the INFORMATION field (for example the
	// first failing LBA, or the miscompare offset).
	Information uint64
	Valid       bool

	// Sense-key specific field pointer (SPC-4 §4.5.2.4.2), when FieldPointer
	// is true: CDB (InCDB) or parameter data byte Field, optionally bit Bit.
	FieldPointer bool
	InCDB        bool
	Field        uint16
	Bit          int8 // -1 when no bit pointer
}

func (s *Sense) Error() string {
	msg := fmt.Sprintf("scsi: sense key %#x ASC/ASCQ %02x/%02x (%s)", s.Key, s.ASC, s.ASCQ, ascText(s.ASC, s.ASCQ))
	if s.FieldPointer {
		where := "parameter data"
		if s.InCDB {
			where = "CDB"
		}
		msg += fmt.Sprintf(" at %s byte %d", where, s.Field)
		if s.Bit >= 0 {
			msg += fmt.Sprintf(" bit %d", s.Bit)
		}
	}
	return msg
}

// FixedLen and DescriptorLen are the sizes Marshal produces.
const (
	FixedLen      = 18
	DescriptorLen = 8 + 12 + 8 // header + information descriptor + sense-key-specific descriptor
)

// AppendFixed appends fixed-format sense data (response code 70h, SPC-4
// §4.5.3).
func (s *Sense) AppendFixed(b []byte) []byte {
	var f [FixedLen]byte
	f[0] = 0x70
	if s.Valid && s.Information <= 0xffffffff {
		f[0] |= 0x80
		binary.BigEndian.PutUint32(f[3:], uint32(s.Information))
	}
	f[2] = s.Key & 0x0f
	f[7] = FixedLen - 8
	f[12] = s.ASC
	f[13] = s.ASCQ
	s.putSKS(f[15:18])
	return append(b, f[:]...)
}

// AppendDescriptor appends descriptor-format sense data (response code 72h,
// SPC-4 §4.5.2) with an information descriptor when Valid and a
// sense-key specific descriptor when FieldPointer.
func (s *Sense) AppendDescriptor(b []byte) []byte {
	start := len(b)
	b = append(b, 0x72, s.Key&0x0f, s.ASC, s.ASCQ, 0, 0, 0, 0)
	if s.Valid {
		b = append(b, 0x00, 0x0a, 0x80, 0)
		b = binary.BigEndian.AppendUint64(b, s.Information)
	}
	if s.FieldPointer {
		var sks [3]byte
		s.putSKS(sks[:])
		b = append(b, 0x02, 0x06, 0, 0, sks[0], sks[1], sks[2], 0)
	}
	b[start+7] = byte(len(b) - start - 8)
	return b
}

func (s *Sense) putSKS(p []byte) {
	if !s.FieldPointer {
		return
	}
	p[0] = 0x80 // SKSV
	if s.InCDB {
		p[0] |= 0x40
	}
	if s.Bit >= 0 {
		p[0] |= 0x08 | byte(s.Bit&7)
	}
	binary.BigEndian.PutUint16(p[1:], s.Field)
}

// ParseSense decodes fixed or descriptor sense data. It is used by the
// initiator and by tests.
func ParseSense(b []byte) (*Sense, error) {
	if len(b) < 8 {
		return nil, fmt.Errorf("scsi: sense data of %d bytes is shorter than 8", len(b))
	}
	s := &Sense{Bit: -1}
	switch b[0] & 0x7f {
	case 0x70, 0x71:
		if len(b) < 14 {
			return nil, fmt.Errorf("scsi: fixed sense data of %d bytes is shorter than 14", len(b))
		}
		s.Key = b[2] & 0x0f
		s.ASC, s.ASCQ = b[12], b[13]
		if b[0]&0x80 != 0 {
			s.Valid = true
			s.Information = uint64(binary.BigEndian.Uint32(b[3:7]))
		}
		if len(b) >= 18 && b[15]&0x80 != 0 {
			s.parseSKS(b[15:18])
		}
	case 0x72, 0x73:
		s.Key = b[1] & 0x0f
		s.ASC, s.ASCQ = b[2], b[3]
		rest := b[8:]
		if n := int(b[7]); n < len(rest) {
			rest = rest[:n]
		}
		for len(rest) >= 2 {
			typ, l := rest[0], int(rest[1])
			if 2+l > len(rest) {
				break
			}
			d := rest[2 : 2+l]
			switch {
			case typ == 0 && l >= 10:
				s.Valid = d[0]&0x80 != 0
				s.Information = binary.BigEndian.Uint64(d[2:10])
			case typ == 2 && l >= 5 && d[2]&0x80 != 0:
				s.parseSKS(d[2:5])
			}
			rest = rest[2+l:]
		}
	default:
		return nil, fmt.Errorf("scsi: unknown sense response code %#x", b[0]&0x7f)
	}
	return s, nil
}

func (s *Sense) parseSKS(p []byte) {
	if s.Key != SenseIllegalRequest {
		return
	}
	s.FieldPointer = true
	s.InCDB = p[0]&0x40 != 0
	if p[0]&0x08 != 0 {
		s.Bit = int8(p[0] & 7)
	}
	s.Field = binary.BigEndian.Uint16(p[1:])
}

// Common sense conditions.

// InvalidOpcode is ILLEGAL REQUEST, INVALID COMMAND OPERATION CODE (20/00)
// pointing at CDB byte 0.
func InvalidOpcode() *Sense {
	return &Sense{Key: SenseIllegalRequest, ASC: 0x20, FieldPointer: true, InCDB: true, Field: 0, Bit: -1}
}

// InvalidFieldInCDB is ILLEGAL REQUEST, INVALID FIELD IN CDB (24/00) with a
// field pointer to byte field (and bit, or -1).
func InvalidFieldInCDB(field int, bit int) *Sense {
	return &Sense{Key: SenseIllegalRequest, ASC: 0x24, FieldPointer: true, InCDB: true, Field: uint16(field), Bit: int8(bit)}
}

// InvalidFieldInParameterList is ILLEGAL REQUEST 26/00 with a field pointer
// into the parameter data.
func InvalidFieldInParameterList(field int, bit int) *Sense {
	return &Sense{Key: SenseIllegalRequest, ASC: 0x26, FieldPointer: true, Field: uint16(field), Bit: int8(bit)}
}

// ParameterListLengthError is ILLEGAL REQUEST 1A/00.
func ParameterListLengthError() *Sense {
	return &Sense{Key: SenseIllegalRequest, ASC: 0x1a, Bit: -1}
}

// LBAOutOfRange is ILLEGAL REQUEST, LOGICAL BLOCK ADDRESS OUT OF RANGE (21/00).
func LBAOutOfRange(lba uint64) *Sense {
	return &Sense{Key: SenseIllegalRequest, ASC: 0x21, Information: lba, Valid: true, Bit: -1}
}

// LUNNotSupported is ILLEGAL REQUEST, LOGICAL UNIT NOT SUPPORTED (25/00).
func LUNNotSupported() *Sense { return &Sense{Key: SenseIllegalRequest, ASC: 0x25, Bit: -1} }

// WriteProtected is DATA PROTECT, WRITE PROTECTED (27/00).
func WriteProtected() *Sense { return &Sense{Key: SenseDataProtect, ASC: 0x27, Bit: -1} }

// NotReadyStopped is NOT READY, LOGICAL UNIT NOT READY, INITIALIZING COMMAND
// REQUIRED (04/02): the LU was stopped with START STOP UNIT.
func NotReadyStopped() *Sense { return &Sense{Key: SenseNotReady, ASC: 0x04, ASCQ: 0x02, Bit: -1} }

// NotReadySanitizing is LOGICAL UNIT NOT READY, SANITIZE IN PROGRESS.
func NotReadySanitizing() *Sense { return &Sense{Key: SenseNotReady, ASC: 0x04, ASCQ: 0x1b, Bit: -1} }

// MediumError wraps a backend I/O failure: MEDIUM ERROR, UNRECOVERED READ
// ERROR (11/00) or WRITE ERROR (0C/00).
func MediumError(write bool, lba uint64) *Sense {
	if write {
		return &Sense{Key: SenseMediumError, ASC: 0x0c, Information: lba, Valid: true, Bit: -1}
	}
	return &Sense{Key: SenseMediumError, ASC: 0x11, Information: lba, Valid: true, Bit: -1}
}

// Miscompare is MISCOMPARE DURING VERIFY OPERATION (1D/00) with the offset
// of the first differing byte in Information.
func Miscompare(offset uint64) *Sense {
	return &Sense{Key: SenseMiscompare, ASC: 0x1d, Information: offset, Valid: true, Bit: -1}
}

// Unit attention conditions (SPC-4 §4.5.6 and Annex F).

// UAPowerOnReset is POWER ON, RESET, OR BUS DEVICE RESET OCCURRED (29/00).
func UAPowerOnReset() Sense { return Sense{Key: SenseUnitAttention, ASC: 0x29, ASCQ: 0x00, Bit: -1} }

// UABusReset is SCSI BUS RESET OCCURRED (29/02).
func UABusReset() Sense { return Sense{Key: SenseUnitAttention, ASC: 0x29, ASCQ: 0x02, Bit: -1} }

// UALUReset is BUS DEVICE RESET FUNCTION OCCURRED (29/03).
func UALUReset() Sense { return Sense{Key: SenseUnitAttention, ASC: 0x29, ASCQ: 0x03, Bit: -1} }

// UANexusLoss is I_T NEXUS LOSS OCCURRED (29/07).
func UANexusLoss() Sense { return Sense{Key: SenseUnitAttention, ASC: 0x29, ASCQ: 0x07, Bit: -1} }

// UACapacityChanged is CAPACITY DATA HAS CHANGED (2A/09).
func UACapacityChanged() Sense { return Sense{Key: SenseUnitAttention, ASC: 0x2a, ASCQ: 0x09, Bit: -1} }

// UAModeParamsChanged is MODE PARAMETERS CHANGED (2A/01).
func UAModeParamsChanged() Sense {
	return Sense{Key: SenseUnitAttention, ASC: 0x2a, ASCQ: 0x01, Bit: -1}
}

// UAReportedLUNsChanged is REPORTED LUNS DATA HAS CHANGED (3F/0E).
func UAReportedLUNsChanged() Sense {
	return Sense{Key: SenseUnitAttention, ASC: 0x3f, ASCQ: 0x0e, Bit: -1}
}

// UACommandsCleared is COMMANDS CLEARED BY ANOTHER INITIATOR (2F/00).
func UACommandsCleared() Sense { return Sense{Key: SenseUnitAttention, ASC: 0x2f, ASCQ: 0x00, Bit: -1} }

func ascText(asc, ascq byte) string {
	switch uint16(asc)<<8 | uint16(ascq) {
	case 0x0000:
		return "no additional sense information"
	case 0x0402:
		return "logical unit not ready, initializing command required"
	case 0x0800:
		return "logical unit communication failure"
	case 0x0c00:
		return "write error"
	case 0x1100:
		return "unrecovered read error"
	case 0x1a00:
		return "parameter list length error"
	case 0x1d00:
		return "miscompare during verify operation"
	case 0x2000:
		return "invalid command operation code"
	case 0x2100:
		return "logical block address out of range"
	case 0x2400:
		return "invalid field in CDB"
	case 0x2500:
		return "logical unit not supported"
	case 0x2600:
		return "invalid field in parameter list"
	case 0x2700:
		return "write protected"
	case 0x2900:
		return "power on, reset, or bus device reset occurred"
	case 0x2902:
		return "SCSI bus reset occurred"
	case 0x2903:
		return "bus device reset function occurred"
	case 0x2907:
		return "I_T nexus loss occurred"
	case 0x2a01:
		return "mode parameters changed"
	case 0x2a09:
		return "capacity data has changed"
	case 0x2f00:
		return "commands cleared by another initiator"
	case 0x3f0e:
		return "reported LUNs data has changed"
	case 0x4700:
		return "SCSI parity error"
	}
	return "unlisted"
}

// InvalidFieldInIU is ILLEGAL REQUEST, INVALID FIELD IN INFORMATION UNIT
// (0E/03): the fabric's transfer length does not cover what the CDB asks for.
func InvalidFieldInIU() *Sense {
	return &Sense{Key: SenseIllegalRequest, ASC: 0x0e, ASCQ: 0x03, Bit: -1}
}

// SavingParametersNotSupported is ILLEGAL REQUEST 39/00.
func SavingParametersNotSupported() *Sense {
	return &Sense{Key: SenseIllegalRequest, ASC: 0x39, Bit: -1}
}
