package dhchap

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The messages Authentication Send and Receive carry (NVMe Base 2.0,
// "DH-HMAC-CHAP Protocol"), little-endian: a common header — AUTH-Type,
// AUTH-Id, two reserved bytes, the transaction ID — then each message's
// fields.

// Message types and identifiers.
const (
	TypeCommon = 0x00
	TypeDHCHAP = 0x01

	IDNegotiate = 0x00 // common
	IDChallenge = 0x01 // DH-HMAC-CHAP
	IDReply     = 0x02
	IDSuccess1  = 0x03
	IDSuccess2  = 0x04
	IDFailure2  = 0xf0 // common
	IDFailure1  = 0xf1
)

// Failure reason code explanations (AUTH_Failure1/2's RCE; the reason
// code is always 1, authentication failure).
const (
	ReasonFailed            = 0x01
	ReasonProtocolUnusable  = 0x02
	ReasonSCCMismatch       = 0x03
	ReasonHashUnusable      = 0x04
	ReasonGroupUnusable     = 0x05
	ReasonIncorrectPayload  = 0x06
	ReasonIncorrectProtocol = 0x07
)

// SECP and SPSP of Authentication Send and Receive.
const (
	SECP  = 0xe9 // NVMe's security protocol
	SPSP0 = 0x01
	SPSP1 = 0x01
)

// ErrShort is a message shorter than its fields say.
var ErrShort = errors.New("dhchap: message too short")

// Header reads a message's type, identifier and transaction ID.
func Header(b []byte) (typ, id uint8, tid uint16, err error) {
	if len(b) < 6 {
		return 0, 0, 0, ErrShort
	}
	return b[0], b[1], binary.LittleEndian.Uint16(b[4:]), nil
}

// header appends a message of n bytes with its header to b and returns
// the whole and the message.
func header(b []byte, typ, id uint8, tid uint16, n int) ([]byte, []byte) {
	start := len(b)
	b = append(b, make([]byte, n)...)
	m := b[start:]
	m[0], m[1] = typ, id
	binary.LittleEndian.PutUint16(m[4:], tid)
	return b, m
}

// Negotiate is AUTH_Negotiate with its DH-HMAC-CHAP descriptor.
type Negotiate struct {
	TID    uint16
	SCC    uint8 // secure channel concatenation: 0, none
	Hashes []Hash
	Groups []Group
	// Offered (Decode) says the host offers DH-HMAC-CHAP: Hashes and
	// Groups are its descriptor's.
	Offered bool
}

// Append appends the message, with one descriptor (DH-HMAC-CHAP).
func (n *Negotiate) Append(b []byte) []byte {
	b, m := header(b, TypeCommon, IDNegotiate, n.TID, 8+64)
	m[6], m[7] = n.SCC, 1
	d := m[8:]
	d[0], d[2], d[3] = TypeDHCHAP, byte(len(n.Hashes)), byte(len(n.Groups))
	for i, h := range n.Hashes {
		d[4+i] = byte(h)
	}
	for i, g := range n.Groups {
		d[34+i] = byte(g)
	}
	return b
}

// Decode reads AUTH_Negotiate: the DH-HMAC-CHAP descriptor's lists
// (Offered false: the host offers no DH-HMAC-CHAP). A malformed message
// is an error.
func (n *Negotiate) Decode(b []byte) error {
	*n = Negotiate{}
	if len(b) < 8 {
		return ErrShort
	}
	n.TID, n.SCC = binary.LittleEndian.Uint16(b[4:]), b[6]
	napd := int(b[7])
	if len(b) != 8+64*napd {
		return fmt.Errorf("dhchap: AUTH_Negotiate of %d bytes with %d descriptors", len(b), napd)
	}
	for i := range napd {
		d := b[8+64*i:]
		if d[0] != TypeDHCHAP {
			continue
		}
		if d[2] > 30 || d[3] > 30 {
			return fmt.Errorf("dhchap: %d hashes and %d groups (30 at most)", d[2], d[3])
		}
		for _, h := range d[4 : 4+d[2]] {
			n.Hashes = append(n.Hashes, Hash(h))
		}
		for _, g := range d[34 : 34+d[3]] {
			n.Groups = append(n.Groups, Group(g))
		}
		n.Offered = true
		return nil
	}
	return nil
}

// Challenge is DH-HMAC-CHAP_Challenge.
type Challenge struct {
	TID   uint16
	Hash  Hash
	Group Group
	Seq   uint32
	C     []byte // the challenge, the hash's length
	DH    []byte // the controller's public value (not with Null)
}

// Append appends the message.
func (c *Challenge) Append(b []byte) []byte {
	b, m := header(b, TypeDHCHAP, IDChallenge, c.TID, 16+len(c.C)+len(c.DH))
	m[6], m[8], m[9] = byte(len(c.C)), byte(c.Hash), byte(c.Group)
	binary.LittleEndian.PutUint16(m[10:], uint16(len(c.DH)))
	binary.LittleEndian.PutUint32(m[12:], c.Seq)
	copy(m[16:], c.C)
	copy(m[16+len(c.C):], c.DH)
	return b
}

// Decode reads DH-HMAC-CHAP_Challenge (C and DH alias b).
func (c *Challenge) Decode(b []byte) error {
	if len(b) < 16 {
		return ErrShort
	}
	hl, dhl := int(b[6]), int(binary.LittleEndian.Uint16(b[10:]))
	if len(b) < 16+hl+dhl {
		return ErrShort
	}
	*c = Challenge{TID: binary.LittleEndian.Uint16(b[4:]), Hash: Hash(b[8]), Group: Group(b[9]), Seq: binary.LittleEndian.Uint32(b[12:]),
		C: b[16 : 16+hl], DH: b[16+hl : 16+hl+dhl]}
	if c.Hash.Len() != hl {
		return fmt.Errorf("dhchap: a challenge of %d bytes for %v", hl, c.Hash)
	}
	return nil
}

// Reply is DH-HMAC-CHAP_Reply: the host's response, and its own
// challenge to the controller when it asks the controller to
// authenticate too (bidirectional: CValid).
type Reply struct {
	TID    uint16
	CValid bool
	Seq    uint32 // the host's challenge's sequence number (with CValid)
	R, C   []byte // response, challenge: the hash's length each
	DH     []byte // the host's public value (not with Null)
}

// Append appends the message.
func (r *Reply) Append(b []byte) []byte {
	hl := len(r.R)
	b, m := header(b, TypeDHCHAP, IDReply, r.TID, 16+2*hl+len(r.DH))
	m[6] = byte(hl)
	if r.CValid {
		m[8] = 1
	}
	binary.LittleEndian.PutUint16(m[10:], uint16(len(r.DH)))
	binary.LittleEndian.PutUint32(m[12:], r.Seq)
	copy(m[16:], r.R)
	copy(m[16+hl:], r.C)
	copy(m[16+2*hl:], r.DH)
	return b
}

// Decode reads DH-HMAC-CHAP_Reply for hash h (R, C and DH alias b): the
// lengths must be exactly the message's.
func (r *Reply) Decode(b []byte, h Hash) error {
	if len(b) < 16 {
		return ErrShort
	}
	hl, dhl := int(b[6]), int(binary.LittleEndian.Uint16(b[10:]))
	if hl != h.Len() {
		return fmt.Errorf("dhchap: a response of %d bytes for %v", hl, h)
	}
	if dhl%4 != 0 || len(b) != 16+2*hl+dhl {
		return fmt.Errorf("dhchap: DH-HMAC-CHAP_Reply of %d bytes (response %d, public value %d)", len(b), hl, dhl)
	}
	if b[8] > 1 {
		return fmt.Errorf("dhchap: CVALID %d", b[8])
	}
	*r = Reply{TID: binary.LittleEndian.Uint16(b[4:]), CValid: b[8] == 1, Seq: binary.LittleEndian.Uint32(b[12:]),
		R: b[16 : 16+hl], C: b[16+hl : 16+2*hl], DH: b[16+2*hl:]}
	if r.CValid && r.Seq == 0 {
		return errors.New("dhchap: a host challenge with sequence number 0")
	}
	return nil
}

// Success1 is DH-HMAC-CHAP_Success1: with RValid, the controller's
// response to the host's challenge.
type Success1 struct {
	TID    uint16
	HL     uint8 // the hash's length (set whether or not RValid: Linux's host reads it)
	RValid bool
	R      []byte
}

// Append appends the message.
func (s *Success1) Append(b []byte) []byte {
	b, m := header(b, TypeDHCHAP, IDSuccess1, s.TID, 16+len(s.R))
	m[6] = s.HL
	if s.RValid {
		m[8] = 1
	}
	copy(m[16:], s.R)
	return b
}

// Decode reads DH-HMAC-CHAP_Success1 (R aliases b).
func (s *Success1) Decode(b []byte) error {
	if len(b) < 16 {
		return ErrShort
	}
	*s = Success1{TID: binary.LittleEndian.Uint16(b[4:]), HL: b[6], RValid: b[8]&1 != 0}
	if s.RValid {
		if len(b) < 16+int(s.HL) {
			return ErrShort
		}
		s.R = b[16 : 16+int(s.HL)]
	}
	return nil
}

// Success2 is DH-HMAC-CHAP_Success2: the host accepts the controller's
// response.
func Success2(tid uint16) []byte {
	b, _ := header(nil, TypeDHCHAP, IDSuccess2, tid, 16)
	return b
}

// Failure is AUTH_Failure1 (controller to host) or AUTH_Failure2 (host to
// controller): id IDFailure1 or IDFailure2, reason an explanation.
func Failure(id uint8, tid uint16, reason uint8) []byte {
	b, m := header(nil, TypeCommon, id, tid, 8)
	m[6], m[7] = 1, reason
	return b
}
