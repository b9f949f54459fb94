// Package isns registers blockwire's targets and portals with an iSNS
// server (RFC 4171, the Internet Storage Name Service) and deregisters them
// on shutdown, so initiators that discover through iSNS find them. The
// codec (this file) does no I/O; Client (client.go) talks to the server.
package isns

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// Function IDs (RFC 4171 §6.1); a response is its request's ID | 0x8000.
const (
	DevAttrReg  = 0x0001
	DevAttrQry  = 0x0002
	DevGetNext  = 0x0003
	DevDereg    = 0x0004
	ResponseBit = 0x8000
)

// Header flags (RFC 4171 §5.1.4).
const (
	FlagClient  = 0x8000 // the sender is the iSNS client
	FlagServer  = 0x4000
	FlagAuth    = 0x2000
	FlagReplace = 0x1000
	FlagLast    = 0x0800
	FlagFirst   = 0x0400
)

// Attribute tags (RFC 4171 §6.1) blockwire uses.
const (
	TagDelimiter        = 0
	TagEntityID         = 1
	TagEntityProtocol   = 2
	TagRegPeriod        = 6
	TagPortalIP         = 16
	TagPortalPort       = 17
	TagPortalSymbolic   = 18
	TagISCSIName        = 32
	TagISCSINodeType    = 33
	TagISCSIAlias       = 34
	TagPGISCSIName      = 48
	TagPGPortalIP       = 49
	TagPGPortalPort     = 50
	TagPGTag            = 51
	EntityProtocolISCSI = 2    // Entity Protocol: iSCSI (§6.2.2)
	NodeTypeTarget      = 0x01 // iSCSI Node Type bit 31 (§6.4.2)
	HeaderLen           = 12
	Version             = 1
	// MaxPayload bounds one PDU's payload: the PDU length field is 16
	// bits (RFC 4171 §5.1.3); blockwire's messages are far smaller.
	MaxPayload = 65532
)

// Header is the iSNSP PDU header (RFC 4171 §5.1).
type Header struct {
	Version  uint16
	Function uint16
	Length   uint16 // payload bytes after the header
	Flags    uint16
	XID      uint16 // transaction ID
	Seq      uint16 // sequence ID of this PDU within the message
}

// Encode writes the header into b[:HeaderLen].
func (h *Header) Encode(b []byte) {
	binary.BigEndian.PutUint16(b[0:], h.Version)
	binary.BigEndian.PutUint16(b[2:], h.Function)
	binary.BigEndian.PutUint16(b[4:], h.Length)
	binary.BigEndian.PutUint16(b[6:], h.Flags)
	binary.BigEndian.PutUint16(b[8:], h.XID)
	binary.BigEndian.PutUint16(b[10:], h.Seq)
}

// DecodeHeader reads a PDU header; only version 1 exists.
func DecodeHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, fmt.Errorf("isns: %d bytes cannot hold a PDU header (RFC 4171 §5.1)", len(b))
	}
	h := Header{Version: binary.BigEndian.Uint16(b), Function: binary.BigEndian.Uint16(b[2:]),
		Length: binary.BigEndian.Uint16(b[4:]), Flags: binary.BigEndian.Uint16(b[6:]),
		XID: binary.BigEndian.Uint16(b[8:]), Seq: binary.BigEndian.Uint16(b[10:])}
	if h.Version != Version {
		return h, fmt.Errorf("isns: iSNSP version %d (RFC 4171 §5.1.1: 1)", h.Version)
	}
	if h.Length%4 != 0 {
		return h, fmt.Errorf("isns: PDU length %d is not a multiple of 4 (RFC 4171 §5.1.3)", h.Length)
	}
	return h, nil
}

// Attr is one TLV attribute (RFC 4171 §5.5); Value is unpadded as given,
// padded to 4 bytes on the wire.
type Attr struct {
	Tag   uint32
	Value []byte
}

// String is a NUL-terminated string attribute (iSCSI names, EIDs, §6.1:
// "UTF-8 ... NULL terminated").
func String(tag uint32, s string) Attr { return Attr{tag, append([]byte(s), 0)} }

// Uint32 is a 4-byte integer attribute.
func Uint32(tag uint32, v uint32) Attr {
	return Attr{tag, binary.BigEndian.AppendUint32(nil, v)}
}

// IP is a 16-byte address attribute (IPv4 as an IPv4-mapped IPv6 address,
// §6.3.1).
func IP(tag uint32, a netip.Addr) Attr {
	b := a.As16() // IPv4-mapped for an IPv4 address
	return Attr{tag, b[:]}
}

// Port is a Portal TCP/UDP Port attribute: the port in the low 16 bits,
// bit 15 of the upper half set for UDP (§6.3.2); blockwire's are TCP.
func Port(tag uint32, port uint16) Attr { return Uint32(tag, uint32(port)) }

// Delimiter separates the message key from the operating attributes.
func Delimiter() Attr { return Attr{Tag: TagDelimiter} }

// AppendAttrs encodes attributes, each padded to 4 bytes.
func AppendAttrs(b []byte, attrs ...Attr) []byte {
	for _, a := range attrs {
		n := (len(a.Value) + 3) &^ 3
		b = binary.BigEndian.AppendUint32(b, a.Tag)
		b = binary.BigEndian.AppendUint32(b, uint32(n))
		b = append(b, a.Value...)
		b = append(b, make([]byte, n-len(a.Value))...)
	}
	return b
}

// ParseAttrs decodes a TLV list (the values alias b).
func ParseAttrs(b []byte) ([]Attr, error) {
	var out []Attr
	for len(b) > 0 {
		if len(b) < 8 {
			return out, errors.New("isns: truncated attribute header (RFC 4171 §5.5)")
		}
		tag, n := binary.BigEndian.Uint32(b), binary.BigEndian.Uint32(b[4:])
		if n%4 != 0 || uint64(n) > uint64(len(b)-8) {
			return out, fmt.Errorf("isns: attribute %d claims %d bytes, %d left (RFC 4171 §5.5)", tag, n, len(b)-8)
		}
		out = append(out, Attr{Tag: tag, Value: b[8 : 8+n]})
		b = b[8+n:]
	}
	return out, nil
}

// Message builds one single-PDU client message.
func Message(function, flags, xid uint16, attrs ...Attr) ([]byte, error) {
	b := AppendAttrs(make([]byte, HeaderLen, 256), attrs...)
	if len(b)-HeaderLen > MaxPayload {
		return nil, fmt.Errorf("isns: a %d-byte message needs more than one PDU", len(b)-HeaderLen)
	}
	h := Header{Version: Version, Function: function, Length: uint16(len(b) - HeaderLen),
		Flags: flags | FlagClient | FlagFirst | FlagLast, XID: xid}
	h.Encode(b)
	return b, nil
}

// Response is a server's answer: the status code (§5.4) and the
// attributes after it.
type Response struct {
	Function uint16
	XID      uint16
	Status   uint32
	Attrs    []Attr
}

// DecodeResponse decodes a response PDU's payload.
func DecodeResponse(h Header, payload []byte) (Response, error) {
	r := Response{Function: h.Function, XID: h.XID}
	if h.Function&ResponseBit == 0 {
		return r, fmt.Errorf("isns: function %#04x is not a response", h.Function)
	}
	if len(payload) < 4 {
		return r, errors.New("isns: a response without a status code (RFC 4171 §5.4)")
	}
	r.Status = binary.BigEndian.Uint32(payload)
	var err error
	r.Attrs, err = ParseAttrs(payload[4:])
	return r, err
}

// StatusText names the status codes of RFC 4171 §5.4.
func StatusText(s uint32) string {
	names := []string{"successful", "unknown error", "message format error", "invalid registration",
		"reserved", "invalid query", "source unknown", "source absent", "source unauthorized",
		"no such entry", "version not supported", "internal error", "busy", "option not understood",
		"invalid update", "message not supported", "SCN event rejected", "SCN registration rejected",
		"attribute not implemented", "FC_DOMAIN_ID not available", "FC_DOMAIN_ID not allocated",
		"ESI not available", "invalid deregistration", "registration feature not supported"}
	if int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("status %d", s)
}
