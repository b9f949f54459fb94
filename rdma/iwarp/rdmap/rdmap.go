// Package rdmap is the codec for the RDMA Protocol (RFC 5040): the RDMAP
// control byte and opcodes, the RDMA Read Request header and the Terminate
// message with its layer / error type / error code and the echoed headers
// of the segment that caused it.
//
// It does no I/O. Layouts: RFC 5040 §4 and ../shared/spec/wire-facts.md
// §3.5–3.6.
package rdmap

import (
	"encoding/binary"
	"fmt"

	"github.com/blockwire/blockwire/rdma/iwarp/ddp"
)

// Version is the RDMAP version in the two high bits of the control byte.
const Version = 1

// Opcode is the low nibble of the RDMAP control byte (RFC 5040 §4.2).
type Opcode uint8

// Opcodes.
const (
	Write          Opcode = 0
	ReadRequest    Opcode = 1
	ReadResponse   Opcode = 2
	Send           Opcode = 3
	SendInvalidate Opcode = 4
	SendSE         Opcode = 5
	SendSEInval    Opcode = 6
	Terminate      Opcode = 7
)

var opNames = [...]string{"RDMA Write", "RDMA Read Request", "RDMA Read Response", "Send",
	"Send with Invalidate", "Send with Solicited Event", "Send with SE and Invalidate", "Terminate"}

func (o Opcode) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("opcode %d", uint8(o))
}

// Tagged reports whether the opcode uses the DDP tagged model.
func (o Opcode) Tagged() bool { return o == Write || o == ReadResponse }

// IsSend reports whether o is one of the four Send variants.
func (o Opcode) IsSend() bool { return o >= Send && o <= SendSEInval }

// Solicited reports whether a Send variant asks for a solicited event.
func (o Opcode) Solicited() bool { return o == SendSE || o == SendSEInval }

// Invalidates reports whether a Send variant carries an STag to invalidate.
func (o Opcode) Invalidates() bool { return o == SendInvalidate || o == SendSEInval }

// QN is the untagged queue an opcode travels on (RFC 5040 §5.1).
func (o Opcode) QN() uint32 {
	switch o {
	case ReadRequest:
		return ddp.QNReadRequest
	case Terminate:
		return ddp.QNTerminate
	}
	return ddp.QNSend
}

// Ctrl is the RDMAP control byte for o.
func Ctrl(o Opcode) byte { return Version<<6 | byte(o) }

// ParseCtrl checks the version and opcode of an RDMAP control byte and
// that the DDP model matches the opcode.
func ParseCtrl(c byte, tagged bool) (Opcode, error) {
	if c>>6 != Version {
		return 0, ErrorOf(ETypeRemoteOp, CodeBadVersion, "RDMAP version %d, want 1 (RFC 5040 §4.2)", c>>6)
	}
	o := Opcode(c & 0x0F)
	if o > Terminate {
		return o, ErrorOf(ETypeRemoteOp, CodeUnexpectedOp, "unknown RDMAP opcode %d (RFC 5040 §4.2)", o)
	}
	if o.Tagged() != tagged {
		return o, ErrorOf(ETypeRemoteOp, CodeUnexpectedOp, "%v in the wrong DDP model (RFC 5040 §5.1)", o)
	}
	return o, nil
}

// Terminate layers, error types and codes (RFC 5040 §4.8).
const (
	LayerRDMAP = 0
	LayerDDP   = 1
	LayerLLP   = 2

	ETypeLocalCatastrophic = 0
	ETypeRemoteProtection  = 1
	ETypeRemoteOp          = 2

	CodeInvalidSTag     = 0x00
	CodeBaseBounds      = 0x01
	CodeAccessRights    = 0x02
	CodeSTagNotAssoc    = 0x03
	CodeTOWrap          = 0x04
	CodeBadVersion      = 0x05
	CodeUnexpectedOp    = 0x06
	CodeCatastrophic    = 0x07
	CodeCatastrophicAll = 0x08
	CodeCannotInvalid   = 0x09
	CodeUnspecified     = 0xFF
)

// Error is an RDMAP-layer violation.
type Error struct {
	EType, Code uint8
	Msg         string
}

func (e *Error) Error() string { return "rdmap: " + e.Msg }

// ErrorOf builds an *Error.
func ErrorOf(etype, code uint8, format string, a ...any) *Error {
	return &Error{EType: etype, Code: code, Msg: fmt.Sprintf(format, a...)}
}

// ReadRequestLen is the size of the Read Request header after the
// untagged DDP header (RFC 5040 §4.4).
const ReadRequestLen = 28

// ReadReq is the body of an RDMA Read Request.
type ReadReq struct {
	SinkSTag uint32
	SinkTO   uint64
	Size     uint32
	SrcSTag  uint32
	SrcTO    uint64
}

// Encode encodes r into b[:ReadRequestLen].
func (r *ReadReq) Encode(b []byte) {
	binary.BigEndian.PutUint32(b[0:], r.SinkSTag)
	binary.BigEndian.PutUint64(b[4:], r.SinkTO)
	binary.BigEndian.PutUint32(b[12:], r.Size)
	binary.BigEndian.PutUint32(b[16:], r.SrcSTag)
	binary.BigEndian.PutUint64(b[20:], r.SrcTO)
}

// DecodeReadReq parses b[:ReadRequestLen].
func DecodeReadReq(b []byte) (ReadReq, error) {
	if len(b) < ReadRequestLen {
		return ReadReq{}, ErrorOf(ETypeRemoteOp, CodeUnexpectedOp, "Read Request of %d bytes, need %d (RFC 5040 §4.4)", len(b), ReadRequestLen)
	}
	return ReadReq{
		SinkSTag: binary.BigEndian.Uint32(b[0:]),
		SinkTO:   binary.BigEndian.Uint64(b[4:]),
		Size:     binary.BigEndian.Uint32(b[12:]),
		SrcSTag:  binary.BigEndian.Uint32(b[16:]),
		SrcTO:    binary.BigEndian.Uint64(b[20:]),
	}, nil
}

// Terminate Control bits (RFC 5040 §4.8).
const (
	TermHdrM = 0x8000 // DDP Segment Length valid
	TermHdrD = 0x4000 // DDP header included
	TermHdrR = 0x2000 // RDMAP header included
)

// TermControlLen is the Terminate Control word.
const TermControlLen = 4

// Term is a Terminate message body.
type Term struct {
	Layer, EType, Code uint8
	// SegLenValid (M) says DDPSegLen holds the offending segment's length.
	SegLenValid bool
	DDPSegLen   uint16
	// DDPHeader is the offending segment's DDP header (14 or 18 bytes),
	// RDMAPHeader the Read Request body (28 bytes) when it caused it.
	DDPHeader   []byte
	RDMAPHeader []byte
}

func (t *Term) String() string {
	layer := [...]string{"RDMAP", "DDP", "LLP"}
	l := fmt.Sprintf("layer %d", t.Layer)
	if int(t.Layer) < len(layer) {
		l = layer[t.Layer]
	}
	return fmt.Sprintf("%s error type %d code %#02x", l, t.EType, t.Code)
}

// Len is the encoded size of the body.
func (t *Term) Len() int {
	n := TermControlLen
	if t.hasTail() {
		n += 2 + len(t.DDPHeader) + len(t.RDMAPHeader)
	}
	return n
}

// Append encodes the body after b: the control word, then (if any header
// is echoed) the 2-byte DDP segment length slot, the DDP header and the
// RDMAP header — the layout siw produces (facts §3.6).
func (t *Term) Append(b []byte) []byte {
	w := uint32(t.Layer&0xF)<<28 | uint32(t.EType&0xF)<<24 | uint32(t.Code)<<16
	if t.SegLenValid {
		w |= TermHdrM
	}
	if len(t.DDPHeader) > 0 {
		w |= TermHdrD
	}
	if len(t.RDMAPHeader) > 0 {
		w |= TermHdrR
	}
	b = binary.BigEndian.AppendUint32(b, w)
	if t.hasTail() {
		b = binary.BigEndian.AppendUint16(b, t.DDPSegLen)
		b = append(b, t.DDPHeader...)
		b = append(b, t.RDMAPHeader...)
	}
	return b
}

// hasTail reports whether the length slot and echoed headers follow the
// control word.
func (t *Term) hasTail() bool {
	return t.SegLenValid || len(t.DDPHeader) > 0 || len(t.RDMAPHeader) > 0
}

// DecodeTerm parses a Terminate body. Echoed headers alias b.
func DecodeTerm(b []byte) (Term, error) {
	if len(b) < TermControlLen {
		return Term{}, ErrorOf(ETypeRemoteOp, CodeUnexpectedOp, "Terminate of %d bytes, need 4 (RFC 5040 §4.8)", len(b))
	}
	w := binary.BigEndian.Uint32(b)
	t := Term{
		Layer:       uint8(w >> 28),
		EType:       uint8(w>>24) & 0xF,
		Code:        uint8(w >> 16),
		SegLenValid: w&TermHdrM != 0,
	}
	rest := b[TermControlLen:]
	if w&(TermHdrM|TermHdrD|TermHdrR) == 0 {
		return t, nil
	}
	if len(rest) < 2 {
		return t, ErrorOf(ETypeRemoteOp, CodeUnexpectedOp, "Terminate announces headers it does not carry (RFC 5040 §4.8)")
	}
	t.DDPSegLen = binary.BigEndian.Uint16(rest)
	rest = rest[2:]
	if w&TermHdrD != 0 {
		if len(rest) < 1 {
			return t, ErrorOf(ETypeRemoteOp, CodeUnexpectedOp, "Terminate D bit without a DDP header (RFC 5040 §4.8)")
		}
		n := ddp.HeaderLen(rest[0])
		if len(rest) < n {
			return t, ErrorOf(ETypeRemoteOp, CodeUnexpectedOp, "Terminate DDP header of %d bytes, need %d (RFC 5040 §4.8)", len(rest), n)
		}
		t.DDPHeader, rest = rest[:n], rest[n:]
	}
	if w&TermHdrR != 0 {
		if len(rest) < ReadRequestLen {
			return t, ErrorOf(ETypeRemoteOp, CodeUnexpectedOp, "Terminate R bit with %d header bytes, need %d (RFC 5040 §4.8)", len(rest), ReadRequestLen)
		}
		t.RDMAPHeader = rest[:ReadRequestLen]
	}
	return t, nil
}
