package pdu

import (
	"encoding/binary"
	"hash/crc32"
)

// AHS types (RFC 7143 §11.2.2.1).
const (
	AHSExtendedCDB    = 1
	AHSBidiReadLength = 2
)

// AHS is the decoded content of the Additional Header Segments of a SCSI
// Command that this implementation understands.
type AHS struct {
	// ExtCDB holds CDB bytes 16 and beyond (RFC 7143 §11.3.6).
	ExtCDB []byte
	// BidiReadLength is the Expected Bidirectional Read Data Length
	// (§11.3.7); HasBidi tells whether it was present.
	BidiReadLength uint32
	HasBidi        bool
}

// ParseAHS decodes raw AHS bytes. ExtCDB aliases b.
func ParseAHS(op Opcode, b []byte) (AHS, error) {
	var a AHS
	for len(b) > 0 {
		if len(b) < 4 {
			return a, errorf(op, "§11.2.2", RejectProtocolError, "%d trailing AHS bytes", len(b))
		}
		l := int(binary.BigEndian.Uint16(b[0:2]))
		typ := b[2]
		total := PaddedLen(3 + l)
		if total > len(b) {
			return a, errorf(op, "§11.2.2", RejectProtocolError, "AHS length %d runs past the %d AHS bytes left", l, len(b))
		}
		switch typ {
		case AHSExtendedCDB:
			if l < 2 || a.ExtCDB != nil {
				return a, errorf(op, "§11.3.6", RejectInvalidPDUField, "bad extended CDB AHS (length %d)", l)
			}
			a.ExtCDB = b[4 : 3+l]
		case AHSBidiReadLength:
			if l != 5 || a.HasBidi {
				return a, errorf(op, "§11.3.7", RejectInvalidPDUField, "bad bidirectional read length AHS (length %d)", l)
			}
			a.BidiReadLength = binary.BigEndian.Uint32(b[4:8])
			a.HasBidi = true
		default:
			return a, errorf(op, "§11.2.2.1", RejectInvalidPDUField, "AHS type %d is not supported", typ)
		}
		b = b[total:]
	}
	return a, nil
}

// AppendExtendedCDB appends an extended-CDB AHS carrying cdb[16:].
func AppendExtendedCDB(b []byte, cdb []byte) []byte {
	ext := cdb[16:]
	l := len(ext) + 1
	b = binary.BigEndian.AppendUint16(b, uint16(l))
	b = append(b, AHSExtendedCDB, 0)
	b = append(b, ext...)
	for range Pad(3 + l) {
		b = append(b, 0)
	}
	return b
}

// AppendBidiReadLength appends an Expected Bidirectional Read Data Length
// AHS.
func AppendBidiReadLength(b []byte, n uint32) []byte {
	b = append(b, 0, 5, AHSBidiReadLength, 0)
	return binary.BigEndian.AppendUint32(b, n)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Digest computes the CRC32C digest of RFC 7143 §13.1 over the given
// pieces (BHS and AHS for a header digest; data and pad for a data digest).
func Digest(pieces ...[]byte) uint32 {
	var c uint32
	for _, p := range pieces {
		c = crc32.Update(c, castagnoli, p)
	}
	return c
}

// UpdateDigest continues a running CRC32C.
func UpdateDigest(c uint32, p []byte) uint32 { return crc32.Update(c, castagnoli, p) }

// PutDigest stores a digest in wire order. RFC 7143 §13.1 transmits the
// CRC32C least significant byte first (as Linux, LIO and libiscsi do).
func PutDigest(b []byte, d uint32) { binary.LittleEndian.PutUint32(b, d) }

// GetDigest reads a digest in wire order.
func GetDigest(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }

// PadFor returns the zero pad for a data segment of n bytes: a new slice
// of up to 3 zero bytes (for tests and cold paths; the datamover pads in
// its own buffers).
func PadFor(n int) []byte { return make([]byte, Pad(n)) }

// DataDigest computes the data digest of a data segment, pad included
// (RFC 7143 §13.1), without allocating.
func DataDigest(data []byte) uint32 {
	c := crc32.Update(0, castagnoli, data)
	if pad := Pad(len(data)); pad > 0 {
		// The pad bytes are zero: fold them in through the table, as
		// crc32.Update would, without building a slice.
		c = ^c
		for range pad {
			c = castagnoli[byte(c)] ^ (c >> 8)
		}
		c = ^c
	}
	return c
}
