// Package mpa is the codec for Marker PDU Aligned framing (RFC 5044) with
// the enhanced connection establishment of RFC 6581: the MPA Request and
// Reply frames that open an iWARP stream, and the FPDU framing (length,
// padding, CRC32C) that carries DDP segments over TCP afterwards.
//
// It does no I/O. Layouts follow ../shared/spec/wire-facts.md §3.1–3.3 and
// what Linux siw puts on the wire (shared/captures/siw-rping.pcap).
package mpa

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Keys that open the MPA Request and Reply frames (RFC 5044 §7.1).
const (
	KeyRequest = "MPA ID Req Frame"
	KeyReply   = "MPA ID Rep Frame"
)

// Flag bits of byte 16 of a Request/Reply frame.
const (
	FlagMarkers  = 0x80 // M: markers wanted (RFC 5044 §7.1); we never use them
	FlagCRC      = 0x40 // C: CRC32C wanted
	FlagReject   = 0x20 // R: the Reply rejects the connection
	FlagEnhanced = 0x10 // RFC 6581 enhanced connection establishment
	flagGSO      = 0x08 // siw's experimental bit: ignored and never sent
)

// Revisions.
const (
	Rev1 = 1 // RFC 5044
	Rev2 = 2 // RFC 6581
)

// HeaderLen is the fixed part of a Request/Reply frame.
const HeaderLen = 20

// MaxPrivateData is the largest private data RFC 5044 §7.1 allows. Linux
// (siw, rdma_cm) caps at 256 and rejects more; see MaxPrivateDataLinux.
const (
	MaxPrivateData      = 512
	MaxPrivateDataLinux = 256
)

// RFC 6581 §3 IRD/ORD word bits (Linux names in brackets).
const (
	IRDPeerToPeer = 0x8000 // in the IRD word: P2P mode, an RTR must be exchanged
	IRDZeroLenRTR = 0x4000 // in the IRD word: zero-length FPDU RTR supported
	ORDWriteRTR   = 0x8000 // in the ORD word: zero-length RDMA Write as RTR
	ORDReadRTR    = 0x4000 // in the ORD word: zero-length RDMA Read as RTR
	IRDORDMask    = 0x3FFF
)

// ErrShort means the buffer does not hold a whole frame yet.
var ErrShort = errors.New("mpa: frame incomplete")

// Error is a malformed MPA frame. Code is the RFC 5044 / RFC 6581 LLP
// Terminate error code that describes it (§3.6 of the facts file).
type Error struct {
	Code uint8
	Msg  string
}

func (e *Error) Error() string { return "mpa: " + e.Msg }

// LLP error codes (RFC 5040 §4.8 layer 2, RFC 6581 §7).
const (
	CodeStreamLost     = 0x01
	CodeCRC            = 0x02
	CodeFPDUStart      = 0x03
	CodeInvalidReqRep  = 0x04
	CodeLocalCatastr   = 0x05
	CodeInsufficientIR = 0x06
	CodeNoMatchingRTR  = 0x07
)

func errorf(code uint8, format string, a ...any) error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, a...)}
}

// Frame is an MPA Request or Reply.
type Frame struct {
	Reply    bool
	Markers  bool
	CRC      bool
	Reject   bool // Reply only
	Enhanced bool // RFC 6581 (Rev 2): the private data starts with IRD/ORD
	Rev      uint8

	// With Enhanced: the RFC 6581 words (values masked with IRDORDMask;
	// the control bits separately).
	IRD, ORD    uint16
	PeerToPeer  bool
	ZeroLenRTR  bool
	WriteRTR    bool
	ReadRTR     bool
	PrivateData []byte // the ULP's private data (after the IRD/ORD words)
}

// Len is the encoded size of f.
func (f *Frame) Len() int {
	n := HeaderLen + len(f.PrivateData)
	if f.Enhanced {
		n += 4
	}
	return n
}

// Append encodes f after b.
func (f *Frame) Append(b []byte) ([]byte, error) {
	pd := len(f.PrivateData)
	if f.Enhanced {
		pd += 4
		if f.Rev < Rev2 {
			return b, errors.New("mpa: enhanced connection setup needs revision 2 (RFC 6581 §3)")
		}
	}
	if pd > MaxPrivateData {
		return b, fmt.Errorf("mpa: %d bytes of private data, at most %d (RFC 5044 §7.1)", pd, MaxPrivateData)
	}
	if f.Rev != Rev1 && f.Rev != Rev2 {
		return b, fmt.Errorf("mpa: revision %d", f.Rev)
	}
	if f.Reject && !f.Reply {
		return b, errors.New("mpa: only a Reply can reject")
	}
	if f.Reply {
		b = append(b, KeyReply...)
	} else {
		b = append(b, KeyRequest...)
	}
	var flags byte
	if f.Markers {
		flags |= FlagMarkers
	}
	if f.CRC {
		flags |= FlagCRC
	}
	if f.Reject {
		flags |= FlagReject
	}
	if f.Enhanced {
		flags |= FlagEnhanced
	}
	b = append(b, flags, f.Rev)
	b = binary.BigEndian.AppendUint16(b, uint16(pd))
	if f.Enhanced {
		ird := f.IRD & IRDORDMask
		ord := f.ORD & IRDORDMask
		if f.PeerToPeer {
			ird |= IRDPeerToPeer
		}
		if f.ZeroLenRTR {
			ird |= IRDZeroLenRTR
		}
		if f.WriteRTR {
			ord |= ORDWriteRTR
		}
		if f.ReadRTR {
			ord |= ORDReadRTR
		}
		b = binary.BigEndian.AppendUint16(b, ird)
		b = binary.BigEndian.AppendUint16(b, ord)
	}
	return append(b, f.PrivateData...), nil
}

// PrivateDataLength returns the PD_Length of a frame whose first HeaderLen
// bytes are h, checking the key, revision and length so that a reader knows
// how many more bytes to read. wantReply selects the key.
func PrivateDataLength(h []byte, wantReply bool) (int, error) {
	if len(h) < HeaderLen {
		return 0, ErrShort
	}
	key := KeyRequest
	if wantReply {
		key = KeyReply
	}
	if string(h[:16]) != key {
		return 0, errorf(CodeInvalidReqRep, "expected %q, got %q (RFC 5044 §7.1)", key, printable(h[:16]))
	}
	if rev := h[17]; rev != Rev1 && rev != Rev2 {
		return 0, errorf(CodeInvalidReqRep, "revision %d is not 1 or 2 (RFC 5044 §7.1, RFC 6581)", rev)
	}
	n := int(binary.BigEndian.Uint16(h[18:]))
	if n > MaxPrivateData {
		return 0, errorf(CodeInvalidReqRep, "private data length %d exceeds %d (RFC 5044 §7.1)", n, MaxPrivateData)
	}
	return n, nil
}

// Decode parses a whole Request (wantReply false) or Reply frame. The
// returned PrivateData aliases b.
func Decode(b []byte, wantReply bool) (Frame, error) {
	n, err := PrivateDataLength(b, wantReply)
	if err != nil {
		return Frame{}, err
	}
	if len(b) < HeaderLen+n {
		return Frame{}, ErrShort
	}
	if len(b) > HeaderLen+n {
		// RFC 5044 §7.1: nothing may follow the frame until the other
		// side has answered; siw treats extra bytes as a protocol error.
		return Frame{}, errorf(CodeInvalidReqRep, "%d bytes after the frame", len(b)-HeaderLen-n)
	}
	flags := b[16]
	f := Frame{
		Reply:    wantReply,
		Markers:  flags&FlagMarkers != 0,
		CRC:      flags&FlagCRC != 0,
		Reject:   flags&FlagReject != 0,
		Enhanced: flags&FlagEnhanced != 0,
		Rev:      b[17],
	}
	if f.Reject && !wantReply {
		return Frame{}, errorf(CodeInvalidReqRep, "R bit set in a Request (RFC 5044 §7.1)")
	}
	pd := b[HeaderLen : HeaderLen+n]
	if f.Enhanced && f.Rev == Rev2 {
		if len(pd) < 4 {
			return Frame{}, errorf(CodeInvalidReqRep, "enhanced frame with %d bytes of private data, IRD/ORD need 4 (RFC 6581 §3)", len(pd))
		}
		ird := binary.BigEndian.Uint16(pd)
		ord := binary.BigEndian.Uint16(pd[2:])
		f.IRD, f.ORD = ird&IRDORDMask, ord&IRDORDMask
		f.PeerToPeer = ird&IRDPeerToPeer != 0
		f.ZeroLenRTR = ird&IRDZeroLenRTR != 0
		f.WriteRTR = ord&ORDWriteRTR != 0
		f.ReadRTR = ord&ORDReadRTR != 0
		pd = pd[4:]
	} else {
		// The enhanced bit means nothing in revision 1.
		f.Enhanced = false
	}
	if len(pd) > 0 {
		f.PrivateData = pd
	}
	return f, nil
}

func printable(b []byte) string {
	out := make([]byte, len(b))
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			c = '.'
		}
		out[i] = c
	}
	return string(out)
}

// FPDU framing (RFC 5044 §4): | ULPDU_Length u16 | ULPDU | pad | CRC u32 |.
const (
	LengthLen = 2
	CRCLen    = 4
	// MaxULPDU is the largest ULPDU an FPDU can carry (a 16-bit length).
	MaxULPDU = 0xFFFF
)

// PadLen is the number of pad bytes after an ULPDU of n bytes: the length
// field, ULPDU and pad together are a multiple of four (RFC 5044 §4.1).
func PadLen(n int) int { return (4 - (LengthLen+n)&3) & 3 }

// FPDULen is the wire size of an FPDU carrying n ULPDU bytes.
func FPDULen(n int) int { return LengthLen + n + PadLen(n) + CRCLen }

// MULPDU is the largest ULPDU that fits one TCP segment of emss bytes
// without markers (RFC 5044 §4.1: EMSS - 6 - (EMSS mod 4)), capped at
// MaxULPDU.
func MULPDU(emss int) int {
	n := emss - 6 - emss%4
	if n > MaxULPDU {
		n = MaxULPDU - (MaxULPDU+2)%4 // keep 2+n a multiple of 4
	}
	return n
}

// castagnoli is the CRC32C table of RFC 5044 §4.4.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC returns the CRC32C update of crc over b (start with 0).
func CRC(crc uint32, b []byte) uint32 { return crc32.Update(crc, castagnoli, b) }

// PutCRC writes crc as it travels: least-significant byte first, which is
// what siw sends and tshark checks (facts §3.3).
func PutCRC(b []byte, crc uint32) { binary.LittleEndian.PutUint32(b, crc) }

// GetCRC reads a CRC field.
func GetCRC(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
