package iser

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/blockwire/blockwire/datamover"
)

// iSER message opcodes: the high nibble of byte 0 of every iSER header
// (RFC 5046 §9.1).
const (
	OpControl    = 0x10 // iSCSI control-type PDU follows the header
	OpHello      = 0x20
	OpHelloReply = 0x30
	opMask       = 0xF0
)

// Header flag bits (RFC 5046 §9.2).
const (
	FlagWSV = 0x08 // Write STag valid
	FlagRSV = 0x04 // Read STag valid
)

// Header lengths of the two profiles.
const (
	// HeaderLenRFC5046 is the 12-byte header of RFC 5046 §9.2:
	// flags, reserved, Write STag, Read STag; tagged offsets are zero-based.
	HeaderLenRFC5046 = 12
	// HeaderLenLinux is the 28-byte header of RFC 7145 §9.2 and Linux's
	// struct iser_ctrl: each STag with a 64-bit base offset (the virtual
	// address of the iSER-on-InfiniBand draft part IV).
	HeaderLenLinux = 28
	// HelloLen is the size of Hello and HelloReply (RFC 5046 §9.3/§9.4).
	HelloLen = 12
)

// Hello versions: 1 for RFC 5046, 10 for RFC 7145 (facts §1.3).
const (
	VersionRFC5046 = 1
	VersionRFC7145 = 10
)

// Header is the iSER header of a Send-type message.
type Header struct {
	Opcode    byte // OpControl, OpHello or OpHelloReply (high nibble)
	WSV, RSV  bool
	WriteSTag uint32
	WriteVA   uint64 // 28-byte header only
	ReadSTag  uint32
	ReadVA    uint64 // 28-byte header only
}

// FormatError is a malformed iSER header: RFC 5046 §10.1.3.2
// has no error message for it; the stream is terminated.
type FormatError struct{ Msg string }

func (e *FormatError) Error() string { return "iser: " + e.Msg }

func formatError(format string, a ...any) error {
	return &FormatError{Msg: fmt.Sprintf(format, a...)}
}

// Encode encodes a control-type header at the start of b, which holds hl
// (HeaderLenRFC5046 or HeaderLenLinux) bytes. Fields whose valid bit is
// clear are sent as zero (RFC 5046 §9.2).
func (h *Header) Encode(b []byte, hl int) {
	clear(b[:hl])
	f := byte(OpControl)
	if h.WSV {
		f |= FlagWSV
	}
	if h.RSV {
		f |= FlagRSV
	}
	b[0] = f
	if hl == HeaderLenRFC5046 {
		if h.WSV {
			binary.BigEndian.PutUint32(b[4:], h.WriteSTag)
		}
		if h.RSV {
			binary.BigEndian.PutUint32(b[8:], h.ReadSTag)
		}
		return
	}
	if h.WSV {
		binary.BigEndian.PutUint32(b[4:], h.WriteSTag)
		binary.BigEndian.PutUint64(b[8:], h.WriteVA)
	}
	if h.RSV {
		binary.BigEndian.PutUint32(b[16:], h.ReadSTag)
		binary.BigEndian.PutUint64(b[20:], h.ReadVA)
	}
}

// Decode parses the header of a received Send of the profile with header
// length hl. A control-type message must hold the header and a 48-byte
// BHS; the STag fields whose valid bit is clear are ignored (RFC 5046
// §9.2: "MUST be zero and ignored").
func Decode(b []byte, hl int) (Header, error) {
	if len(b) < 1 {
		return Header{}, formatError("empty message")
	}
	h := Header{Opcode: b[0] & opMask}
	switch h.Opcode {
	case OpControl:
	case OpHello, OpHelloReply:
		return h, nil // decoded by DecodeHello / DecodeHelloReply
	default:
		return h, formatError("unknown iSER opcode %#x (RFC 5046 §9.1)", b[0]>>4)
	}
	if len(b) < hl+48 {
		return h, formatError("control-type message of %d bytes, the header and BHS need %d (RFC 5046 §9.2)", len(b), hl+48)
	}
	h.WSV, h.RSV = b[0]&FlagWSV != 0, b[0]&FlagRSV != 0
	if hl == HeaderLenRFC5046 {
		if h.WSV {
			h.WriteSTag = binary.BigEndian.Uint32(b[4:])
		}
		if h.RSV {
			h.ReadSTag = binary.BigEndian.Uint32(b[8:])
		}
		return h, nil
	}
	if h.WSV {
		h.WriteSTag = binary.BigEndian.Uint32(b[4:])
		h.WriteVA = binary.BigEndian.Uint64(b[8:])
	}
	if h.RSV {
		h.ReadSTag = binary.BigEndian.Uint32(b[16:])
		h.ReadVA = binary.BigEndian.Uint64(b[20:])
	}
	return h, nil
}

// Hello is the initiator's first iSER message in the RFC 5046 profile
// (RFC 5046 §9.3): the versions it speaks and its iSER-IRD.
type Hello struct {
	MaxVer, MinVer uint8
	IRD            uint16
}

// Append encodes the 12-byte Hello.
func (h *Hello) Append(b []byte) []byte {
	b = append(b, OpHello, h.MaxVer<<4|h.MinVer&0xF)
	b = binary.BigEndian.AppendUint16(b, h.IRD)
	return append(b, make([]byte, 8)...)
}

// DecodeHello parses a Hello. Its length must be exactly HelloLen (RFC
// 5046 §10.1.3.2: a wrong length is a format error).
func DecodeHello(b []byte) (Hello, error) {
	if len(b) != HelloLen || b[0]&opMask != OpHello {
		return Hello{}, formatError("Hello of %d bytes with opcode %#x, want %d bytes and 0x2 (RFC 5046 §9.3)", len(b), b0(b), HelloLen)
	}
	h := Hello{MaxVer: b[1] >> 4, MinVer: b[1] & 0xF, IRD: binary.BigEndian.Uint16(b[2:])}
	if h.MinVer > h.MaxVer {
		return h, formatError("Hello MinVer %d above MaxVer %d (RFC 5046 §9.3)", h.MinVer, h.MaxVer)
	}
	return h, nil
}

// HelloReply is the target's answer (RFC 5046 §9.4).
type HelloReply struct {
	Reject         bool
	MaxVer, CurVer uint8
	ORD            uint16
}

// Append encodes the 12-byte HelloReply.
func (r *HelloReply) Append(b []byte) []byte {
	f := byte(OpHelloReply)
	if r.Reject {
		f |= 0x01
	}
	b = append(b, f, r.MaxVer<<4|r.CurVer&0xF)
	b = binary.BigEndian.AppendUint16(b, r.ORD)
	return append(b, make([]byte, 8)...)
}

// DecodeHelloReply parses a HelloReply.
func DecodeHelloReply(b []byte) (HelloReply, error) {
	if len(b) != HelloLen || b[0]&opMask != OpHelloReply {
		return HelloReply{}, formatError("HelloReply of %d bytes with opcode %#x, want %d bytes and 0x3 (RFC 5046 §9.4)", len(b), b0(b), HelloLen)
	}
	return HelloReply{Reject: b[0]&0x01 != 0, MaxVer: b[1] >> 4, CurVer: b[1] & 0xF, ORD: binary.BigEndian.Uint16(b[2:])}, nil
}

// AnswerHello is the target's rule (RFC 5046 §10.1.3.4 / RFC 5046 §5.1.3):
// iSER-ORD = min(own ORD, initiator's IRD); reject when the versions do
// not overlap or the initiator has an IRD but the target no ORD.
func AnswerHello(h Hello, ourMin, ourMax uint8, ourORD uint16) HelloReply {
	r := HelloReply{MaxVer: ourMax, ORD: min(ourORD, h.IRD)}
	cur := min(ourMax, h.MaxVer)
	switch {
	case cur < max(ourMin, h.MinVer):
		r.Reject = true
	case h.IRD > 0 && r.ORD == 0:
		r.Reject = true
	default:
		r.CurVer = cur
	}
	return r
}

func b0(b []byte) byte {
	if len(b) == 0 {
		return 0
	}
	return b[0] >> 4
}

// CM private data of the connection-first profile: the 4-byte iSER CM
// header Linux puts in the RDMA CM REQ/REP (iWARP: the MPA private data
// after the IRD/ORD words), facts §2.1–2.2.
const (
	// CMZBVANotSupported (initiator) / zero-based VA not used (target):
	// tagged offsets are virtual addresses, not zero-based.
	CMZBVANotSupported = 0x80
	// CMSendInvNotSupported (initiator): do not answer with Send with
	// Invalidate / (target) Send with Invalidate will not be used.
	CMSendInvNotSupported = 0x40
	CMHeaderLen           = 4
)

// Preference is the connection flag (Flg) of the iSER-on-InfiniBand draft's CM private data
// (Appendix, "Format of the CM REQ/REP/REJ Messages"): which kind of node
// the initiator will connect to (datamover.Preference, which the iSCSI
// layer names without knowing iSER).
type Preference = datamover.Preference

// The preferences.
const (
	PreferEither  = datamover.PreferEither
	PreferEndNode = datamover.PreferEndNode
	PreferGateway = datamover.PreferGateway
	PreferInvalid = datamover.PreferInvalid
)

// ServiceIDBaseIBDraft is the iSER-on-InfiniBand draft §II's iSER base service ID on
// InfiniBand ("until IBTA allocates one"): the REQ's service ID is the base
// plus the iSCSI TCP port. Linux uses RDMA/CM's TCP port space instead
// (0x0000000001060000 + port); an InfiniBand fabric listens on both.
const ServiceIDBaseIBDraft = 0x0000000000020000

// CMIBDraftLen is the length of the iSER-on-InfiniBand draft form: the 4-byte iSER CM
// header, then versions, IP version, flags, the local port and the source
// and destination addresses (16 bytes each).
const CMIBDraftLen = 44

// CMHeader is the iSER CM header. With IBDraft set it is the longer form
// of the iSER-on-InfiniBand draft's appendix, which adds the node preference and addresses;
// Linux sends and expects only the 4-byte form, and a 4-byte header is read
// as PreferEither.
type CMHeader struct {
	ZBVANotSupported    bool
	SendInvNotSupported bool

	IBDraft        bool
	MajVer, MinVer uint8      // 4 bits each; the iSER-on-InfiniBand draft leaves them TBD: we send 1.0
	IPVer          uint8      // 0 IPv4, 1 IPv6
	Pref           Preference // Flg
	LocalPort      uint16
	Src, Dst       [16]byte // IPv4 in the last 4 bytes
}

// SetAddrs fills IPVer, Src and Dst from two addresses of one family.
func (c *CMHeader) SetAddrs(src, dst netip.Addr) {
	put := func(b *[16]byte, a netip.Addr) {
		if a.Is4() {
			v := a.As4()
			*b = [16]byte{}
			copy(b[12:], v[:])
			return
		}
		*b = a.As16()
	}
	c.IPVer = 0
	if !src.Unmap().Is4() {
		c.IPVer = 1
	}
	put(&c.Src, src.Unmap())
	put(&c.Dst, dst.Unmap())
}

// Append encodes the 4 bytes.
func (c CMHeader) Append(b []byte) []byte {
	var f byte
	if c.ZBVANotSupported {
		f |= CMZBVANotSupported
	}
	if c.SendInvNotSupported {
		f |= CMSendInvNotSupported
	}
	b = append(b, f, 0, 0, 0)
	if !c.IBDraft {
		return b
	}
	var x [CMIBDraftLen - CMHeaderLen]byte
	x[0] = c.MajVer<<4 | c.MinVer&0x0f
	x[1] = c.IPVer<<4 | byte(c.Pref)&3
	binary.BigEndian.PutUint16(x[4:], c.LocalPort)
	copy(x[8:24], c.Src[:])
	copy(x[24:40], c.Dst[:])
	return append(b, x[:]...)
}

// DecodeCMHeader reads the flags from private data; short private data
// counts as no flags (RFC 7145 peers that send none).
// Private data of at least CMIBDraftLen bytes is read as the iSER-on-InfiniBand draft form.
func DecodeCMHeader(pd []byte) CMHeader {
	if len(pd) < 1 {
		return CMHeader{}
	}
	c := CMHeader{ZBVANotSupported: pd[0]&CMZBVANotSupported != 0, SendInvNotSupported: pd[0]&CMSendInvNotSupported != 0}
	if len(pd) < CMIBDraftLen {
		return c
	}
	x := pd[CMHeaderLen:]
	c.IBDraft = true
	c.MajVer, c.MinVer = x[0]>>4, x[0]&0x0f
	c.IPVer, c.Pref = x[1]>>4, Preference(x[1]&3)
	c.LocalPort = binary.BigEndian.Uint16(x[4:])
	copy(c.Src[:], x[8:24])
	copy(c.Dst[:], x[24:40])
	return c
}
