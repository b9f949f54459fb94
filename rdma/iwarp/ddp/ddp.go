// Package ddp is the codec for Direct Data Placement segment headers (RFC
// 5041): the tagged model (STag + tagged offset, placed straight into a
// registered buffer) and the untagged model (queue number, message
// sequence number, message offset, placed into a posted receive buffer).
//
// Byte 1 of every header belongs to the upper layer (RDMAP); this package
// carries it through untouched. It does no I/O. Layouts: RFC 5041 §4 and
// ../shared/spec/wire-facts.md §3.4.
package ddp

import (
	"encoding/binary"
	"fmt"
)

// Control byte bits (RFC 5041 §4.2).
const (
	FlagTagged   = 0x80
	FlagLast     = 0x40
	reservedMask = 0x3C
	versionMask  = 0x03
	Version      = 1
)

// Header sizes without the MPA length field.
const (
	TaggedLen   = 14 // ctrl, ULP ctrl, STag, TO
	UntaggedLen = 18 // ctrl, ULP ctrl, ULP word, QN, MSN, MO
)

// Queue numbers RDMAP uses (RFC 5040 §5.1).
const (
	QNSend        = 0
	QNReadRequest = 1
	QNTerminate   = 2
)

// Header is a decoded DDP segment header.
type Header struct {
	Tagged bool
	Last   bool
	ULP    byte // byte 1: RDMAP control

	// Tagged model.
	STag uint32
	TO   uint64

	// Untagged model.
	ULPWord uint32 // RsvdULP: RDMAP's Invalidate STag for Send with Invalidate
	QN      uint32
	MSN     uint32
	MO      uint32
}

// Len is the encoded header size.
func (h *Header) Len() int {
	if h.Tagged {
		return TaggedLen
	}
	return UntaggedLen
}

// Encode encodes h at the start of b (which must hold h.Len() bytes) and
// returns the length.
func (h *Header) Encode(b []byte) int {
	c := byte(Version)
	if h.Tagged {
		c |= FlagTagged
	}
	if h.Last {
		c |= FlagLast
	}
	b[0], b[1] = c, h.ULP
	if h.Tagged {
		binary.BigEndian.PutUint32(b[2:], h.STag)
		binary.BigEndian.PutUint64(b[6:], h.TO)
		return TaggedLen
	}
	binary.BigEndian.PutUint32(b[2:], h.ULPWord)
	binary.BigEndian.PutUint32(b[6:], h.QN)
	binary.BigEndian.PutUint32(b[10:], h.MSN)
	binary.BigEndian.PutUint32(b[14:], h.MO)
	return UntaggedLen
}

// Terminate error types and codes of the DDP layer (RFC 5041 §7.2,
// RFC 5040 §4.8 layer 1).
const (
	ETypeCatastrophic = 0
	ETypeTagged       = 1
	ETypeUntagged     = 2

	// Tagged buffer errors.
	CodeInvalidSTag   = 0x00
	CodeBaseBounds    = 0x01
	CodeSTagNotAssoc  = 0x02
	CodeTOWrap        = 0x03
	CodeTaggedVersion = 0x04

	// Untagged buffer errors.
	CodeInvalidQN       = 0x01
	CodeNoBuffer        = 0x02
	CodeInvalidMSN      = 0x03
	CodeInvalidMO       = 0x04
	CodeTooLong         = 0x05
	CodeUntaggedVersion = 0x06
)

// Error is a DDP-layer violation with the Terminate type and code that
// report it.
type Error struct {
	EType, Code uint8
	Msg         string
}

func (e *Error) Error() string { return "ddp: " + e.Msg }

// ErrorOf builds an *Error.
func ErrorOf(etype, code uint8, format string, a ...any) *Error {
	return &Error{EType: etype, Code: code, Msg: fmt.Sprintf(format, a...)}
}

// HeaderLen returns the header length announced by the control byte c.
func HeaderLen(c byte) int {
	if c&FlagTagged != 0 {
		return TaggedLen
	}
	return UntaggedLen
}

// Decode parses the header at the start of b, which must hold at least
// HeaderLen(b[0]) bytes. Reserved control bits are ignored on receipt
// (RFC 5041 §4.2: "set to zero on transmit, not checked on receive");
// a wrong version is an error.
func Decode(b []byte) (Header, error) {
	if len(b) < 2 || len(b) < HeaderLen(b[0]) {
		return Header{}, ErrorOf(ETypeCatastrophic, 0, "segment of %d bytes is shorter than its header", len(b))
	}
	c := b[0]
	h := Header{Tagged: c&FlagTagged != 0, Last: c&FlagLast != 0, ULP: b[1]}
	if c&versionMask != Version {
		if h.Tagged {
			return h, ErrorOf(ETypeTagged, CodeTaggedVersion, "DDP version %d, want 1 (RFC 5041 §4.2)", c&versionMask)
		}
		return h, ErrorOf(ETypeUntagged, CodeUntaggedVersion, "DDP version %d, want 1 (RFC 5041 §4.2)", c&versionMask)
	}
	if h.Tagged {
		h.STag = binary.BigEndian.Uint32(b[2:])
		h.TO = binary.BigEndian.Uint64(b[6:])
		return h, nil
	}
	h.ULPWord = binary.BigEndian.Uint32(b[2:])
	h.QN = binary.BigEndian.Uint32(b[6:])
	h.MSN = binary.BigEndian.Uint32(b[10:])
	h.MO = binary.BigEndian.Uint32(b[14:])
	return h, nil
}
