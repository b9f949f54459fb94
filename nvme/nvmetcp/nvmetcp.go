// Package nvmetcp is the NVMe/TCP PDU codec (NVM Express TCP Transport
// Specification 1.0): the common header every PDU starts with, the
// connection set-up pair (ICReq, ICResp), capsules, data transfer PDUs
// (H2CData, C2HData, R2T), termination requests, and the CRC32C header and
// data digests. Like every codec here it does no I/O and keeps no state:
// a fixed-size header is written in place by Encode and read by Decode,
// which checks what the transport fixes (header lengths, data offsets,
// lengths) and returns an error, never panics. Every multi-byte field is
// little-endian, as everywhere in NVMe.
package nvmetcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Type is a PDU type (“PDU-Type” of the common header).
type Type uint8

// The PDU types.
const (
	TypeICReq       Type = 0x00 // Initialize Connection Request
	TypeICResp      Type = 0x01 // Initialize Connection Response
	TypeH2CTermReq  Type = 0x02 // Host to Controller Terminate Connection Request
	TypeC2HTermReq  Type = 0x03 // Controller to Host Terminate Connection Request
	TypeCapsuleCmd  Type = 0x04 // Command Capsule
	TypeCapsuleResp Type = 0x05 // Response Capsule
	TypeH2CData     Type = 0x06 // Host to Controller Data
	TypeC2HData     Type = 0x07 // Controller to Host Data
	TypeR2T         Type = 0x09 // Ready to Transfer
)

func (t Type) String() string {
	switch t {
	case TypeICReq:
		return "ICReq"
	case TypeICResp:
		return "ICResp"
	case TypeH2CTermReq:
		return "H2CTermReq"
	case TypeC2HTermReq:
		return "C2HTermReq"
	case TypeCapsuleCmd:
		return "CapsuleCmd"
	case TypeCapsuleResp:
		return "CapsuleResp"
	case TypeH2CData:
		return "H2CData"
	case TypeC2HData:
		return "C2HData"
	case TypeR2T:
		return "R2T"
	}
	return fmt.Sprintf("PDU type %#02x", uint8(t))
}

// The common header's flags. HDGSTF and DDGSTF say a header or data digest
// follows; LAST_PDU marks the last data PDU of a command's transfer (or of
// an R2T's); SUCCESS, on the last C2HData of a command, stands for a
// successful Response Capsule the controller then does not send.
const (
	FlagHDGST   = 1 << 0
	FlagDDGST   = 1 << 1
	FlagLastPDU = 1 << 2
	FlagSuccess = 1 << 3
)

// Lengths: the common header; the header (HLEN) of each PDU type; a
// digest; the SQE and CQE a capsule carries.
const (
	CommonLen      = 8
	ICLen          = 128 // ICReq and ICResp: header only
	CapsuleCmdLen  = CommonLen + SQELen
	CapsuleRespLen = CommonLen + CQELen
	DataLen        = 24 // H2CData, C2HData
	R2TLen         = 24
	TermLen        = 24 // H2CTermReq, C2HTermReq (the offending header follows as data)
	DigestLen      = 4
	SQELen         = 64
	CQELen         = 16
	// MaxTermPLen bounds a termination request: its header and at most
	// the 128-byte header it reports.
	MaxTermPLen = TermLen + 128
)

// HeaderLen is the HLEN a PDU of type t has, or 0 for an unknown type.
func HeaderLen(t Type) int {
	switch t {
	case TypeICReq, TypeICResp:
		return ICLen
	case TypeCapsuleCmd:
		return CapsuleCmdLen
	case TypeCapsuleResp:
		return CapsuleRespLen
	case TypeH2CData, TypeC2HData:
		return DataLen
	case TypeR2T:
		return R2TLen
	case TypeH2CTermReq, TypeC2HTermReq:
		return TermLen
	}
	return 0
}

// Common is the header every PDU starts with: its type, flags, header
// length (HLEN), where its data starts (PDO, 0 with none) and its whole
// length on the wire with digests and padding (PLEN).
type Common struct {
	Type  Type
	Flags uint8
	HLen  uint8
	PDO   uint8
	PLen  uint32
}

// Encode writes the common header into b[:CommonLen].
func (c *Common) Encode(b []byte) {
	_ = b[CommonLen-1]
	b[0], b[1], b[2], b[3] = byte(c.Type), c.Flags, c.HLen, c.PDO
	binary.LittleEndian.PutUint32(b[4:], c.PLen)
}

// ErrShort is what Decode returns for bytes shorter than the header.
var ErrShort = errors.New("nvmetcp: shorter than its header")

// Decode reads the common header from b and checks what the transport
// fixes: the type's HLEN, a PDO within PLEN and past the header (and its
// digest), a PLEN that holds the header. A PDU type this codec does not
// know is an error (FESInvalidHeaderField).
func (c *Common) Decode(b []byte) error {
	if len(b) < CommonLen {
		return ErrShort
	}
	*c = Common{Type: Type(b[0]), Flags: b[1], HLen: b[2], PDO: b[3], PLen: binary.LittleEndian.Uint32(b[4:])}
	want := HeaderLen(c.Type)
	switch {
	case want == 0:
		return &FieldError{Field: "PDU-Type", Offset: 0, Err: fmt.Errorf("%s is not a PDU type", c.Type)}
	case int(c.HLen) != want:
		return &FieldError{Field: "HLEN", Offset: 2, Err: fmt.Errorf("%d, a %s's is %d", c.HLen, c.Type, want)}
	}
	hdr := int(c.HLen)
	if c.Flags&FlagHDGST != 0 {
		hdr += DigestLen
	}
	if int64(c.PLen) < int64(hdr) {
		return &FieldError{Field: "PLEN", Offset: 4, Err: fmt.Errorf("%d does not hold the %d-byte header", c.PLen, hdr)}
	}
	if c.PDO != 0 && (int(c.PDO) < hdr || uint32(c.PDO) > c.PLen) {
		return &FieldError{Field: "PDO", Offset: 3, Err: fmt.Errorf("%d is not past the %d-byte header and within PLEN %d", c.PDO, hdr, c.PLen)}
	}
	return nil
}

// DataLength is how many data bytes the PDU carries: PLEN less the
// header, its digest, the padding up to PDO, and the data digest.
func (c *Common) DataLength() int {
	if c.PDO == 0 {
		return 0
	}
	n := int(c.PLen) - int(c.PDO)
	if c.Flags&FlagDDGST != 0 {
		n -= DigestLen
	}
	return max(n, 0)
}

// FieldError is a header field a receiver cannot accept; Offset is the
// byte it starts at, what a termination request reports as its fatal
// error information.
type FieldError struct {
	Field  string
	Offset uint32
	Err    error
}

func (e *FieldError) Error() string { return fmt.Sprintf("nvmetcp: %s: %v", e.Field, e.Err) }
func (e *FieldError) Unwrap() error { return e.Err }

// CapsuleCmd is a Command Capsule's header: its framing (the digest
// flags, where in-capsule data starts, the whole length) and the
// submission queue entry (nvme.Command's encoding).
type CapsuleCmd struct {
	Flags uint8
	PDO   uint8
	PLen  uint32
	SQE   [SQELen]byte
}

// Encode writes the header into b[:CapsuleCmdLen].
func (c *CapsuleCmd) Encode(b []byte) {
	_ = b[CapsuleCmdLen-1]
	(&Common{Type: TypeCapsuleCmd, Flags: c.Flags, HLen: CapsuleCmdLen, PDO: c.PDO, PLen: c.PLen}).Encode(b)
	copy(b[CommonLen:], c.SQE[:])
}

// Decode reads the header from b.
func (c *CapsuleCmd) Decode(b []byte) error {
	var h Common
	if err := h.Decode(b); err != nil {
		return err
	}
	if h.Type != TypeCapsuleCmd {
		return &FieldError{Field: "PDU-Type", Offset: 0, Err: fmt.Errorf("%s is not a command capsule", h.Type)}
	}
	if len(b) < CapsuleCmdLen {
		return ErrShort
	}
	*c = CapsuleCmd{Flags: h.Flags, PDO: h.PDO, PLen: h.PLen}
	copy(c.SQE[:], b[CommonLen:CapsuleCmdLen])
	return nil
}

// CapsuleResp is a Response Capsule: the completion queue entry
// (nvme.Completion's encoding), with the header digest flag as framed.
type CapsuleResp struct {
	Flags uint8
	CQE   [CQELen]byte
}

// Encode writes the PDU into b[:CapsuleRespLen] (PLEN counts the header
// digest when Flags has it).
func (c *CapsuleResp) Encode(b []byte) {
	_ = b[CapsuleRespLen-1]
	plen := uint32(CapsuleRespLen)
	if c.Flags&FlagHDGST != 0 {
		plen += DigestLen
	}
	(&Common{Type: TypeCapsuleResp, Flags: c.Flags & FlagHDGST, HLen: CapsuleRespLen, PLen: plen}).Encode(b)
	copy(b[CommonLen:], c.CQE[:])
}

// Decode reads the PDU from b: a response carries no data.
func (c *CapsuleResp) Decode(b []byte) error {
	var h Common
	if err := h.Decode(b); err != nil {
		return err
	}
	if h.Type != TypeCapsuleResp {
		return &FieldError{Field: "PDU-Type", Offset: 0, Err: fmt.Errorf("%s is not a response capsule", h.Type)}
	}
	if h.PDO != 0 {
		return &FieldError{Field: "PDO", Offset: 3, Err: errors.New("a response capsule carries no data")}
	}
	if len(b) < CapsuleRespLen {
		return ErrShort
	}
	*c = CapsuleResp{Flags: h.Flags}
	copy(c.CQE[:], b[CommonLen:CapsuleRespLen])
	return nil
}

// ICReq is the host's first PDU on a connection: the PDU format version,
// the data alignment it wants (HPDA, in dwords, 0's based), the digests it
// asks for and how many R2Ts it takes outstanding per command (MAXR2T, 0's
// based).
type ICReq struct {
	PFV                      uint16
	HPDA                     uint8
	HeaderDigest, DataDigest bool
	MaxR2T                   uint32
}

// Encode writes the whole PDU.
func (r *ICReq) Encode(b *[ICLen]byte) {
	*b = [ICLen]byte{}
	(&Common{Type: TypeICReq, HLen: ICLen, PLen: ICLen}).Encode(b[:])
	binary.LittleEndian.PutUint16(b[8:], r.PFV)
	b[10] = r.HPDA
	b[11] = digests(r.HeaderDigest, r.DataDigest)
	binary.LittleEndian.PutUint32(b[12:], r.MaxR2T)
}

// Decode reads the PDU, its common header checked.
func (r *ICReq) Decode(b *[ICLen]byte) error {
	var c Common
	if err := c.Decode(b[:]); err != nil {
		return err
	}
	if c.Type != TypeICReq || c.PLen != ICLen {
		return &FieldError{Field: "PLEN", Offset: 4, Err: fmt.Errorf("a %s of %d bytes, not an ICReq of %d", c.Type, c.PLen, ICLen)}
	}
	*r = ICReq{PFV: binary.LittleEndian.Uint16(b[8:]), HPDA: b[10], HeaderDigest: b[11]&1 != 0, DataDigest: b[11]&2 != 0,
		MaxR2T: binary.LittleEndian.Uint32(b[12:])}
	return nil
}

// ICResp is the controller's answer: the format version, the data
// alignment it wants (CPDA), the digests it grants and the most data one
// H2CData PDU may carry (MAXH2CDATA, at least 4096).
type ICResp struct {
	PFV                      uint16
	CPDA                     uint8
	HeaderDigest, DataDigest bool
	MaxH2CData               uint32
}

// Encode writes the whole PDU.
func (r *ICResp) Encode(b *[ICLen]byte) {
	*b = [ICLen]byte{}
	(&Common{Type: TypeICResp, HLen: ICLen, PLen: ICLen}).Encode(b[:])
	binary.LittleEndian.PutUint16(b[8:], r.PFV)
	b[10] = r.CPDA
	b[11] = digests(r.HeaderDigest, r.DataDigest)
	binary.LittleEndian.PutUint32(b[12:], r.MaxH2CData)
}

// MinMaxH2CData is the least MAXH2CDATA a controller may grant.
const MinMaxH2CData = 4096

// Decode reads the PDU, its common header checked.
func (r *ICResp) Decode(b *[ICLen]byte) error {
	var c Common
	if err := c.Decode(b[:]); err != nil {
		return err
	}
	if c.Type != TypeICResp || c.PLen != ICLen {
		return &FieldError{Field: "PLEN", Offset: 4, Err: fmt.Errorf("a %s of %d bytes, not an ICResp of %d", c.Type, c.PLen, ICLen)}
	}
	*r = ICResp{PFV: binary.LittleEndian.Uint16(b[8:]), CPDA: b[10], HeaderDigest: b[11]&1 != 0, DataDigest: b[11]&2 != 0,
		MaxH2CData: binary.LittleEndian.Uint32(b[12:])}
	if r.MaxH2CData < MinMaxH2CData {
		return &FieldError{Field: "MAXH2CDATA", Offset: 12, Err: fmt.Errorf("%d, under the %d a controller must take", r.MaxH2CData, MinMaxH2CData)}
	}
	return nil
}

func digests(header, data bool) byte {
	var d byte
	if header {
		d |= 1
	}
	if data {
		d |= 2
	}
	return d
}

// Data is an H2CData or C2HData PDU's header: which command's data
// (CCCID), for H2CData the R2T it answers (TTAG), and where the data goes
// in the command's transfer. Flags carries LAST_PDU and, on C2HData,
// SUCCESS; the digest flags and PDO come from the sender's framing.
type Data struct {
	Type   Type // TypeH2CData or TypeC2HData
	Flags  uint8
	PDO    uint8
	PLen   uint32
	CCCID  uint16
	TTag   uint16 // H2CData only
	Offset uint32
	Length uint32
}

// Encode writes the header into b[:DataLen].
func (d *Data) Encode(b []byte) {
	_ = b[DataLen-1]
	(&Common{Type: d.Type, Flags: d.Flags, HLen: DataLen, PDO: d.PDO, PLen: d.PLen}).Encode(b)
	binary.LittleEndian.PutUint16(b[8:], d.CCCID)
	binary.LittleEndian.PutUint16(b[10:], d.TTag)
	binary.LittleEndian.PutUint32(b[12:], d.Offset)
	binary.LittleEndian.PutUint32(b[16:], d.Length)
	clear(b[20:DataLen])
}

// Decode reads the header from b, checking that the PDU carries exactly
// the DATAL bytes it says (FESDataOutOfRange otherwise is the caller's to
// judge against the command).
func (d *Data) Decode(b []byte) error {
	var c Common
	if err := c.Decode(b); err != nil {
		return err
	}
	if c.Type != TypeH2CData && c.Type != TypeC2HData {
		return &FieldError{Field: "PDU-Type", Offset: 0, Err: fmt.Errorf("%s is not a data PDU", c.Type)}
	}
	if len(b) < DataLen {
		return ErrShort
	}
	*d = Data{Type: c.Type, Flags: c.Flags, PDO: c.PDO, PLen: c.PLen, CCCID: binary.LittleEndian.Uint16(b[8:]),
		TTag: binary.LittleEndian.Uint16(b[10:]), Offset: binary.LittleEndian.Uint32(b[12:]), Length: binary.LittleEndian.Uint32(b[16:])}
	if c.Type == TypeC2HData {
		d.TTag = 0
	}
	switch {
	case c.PDO == 0:
		return &FieldError{Field: "PDO", Offset: 3, Err: errors.New("a data PDU without data")}
	case c.DataLength() != int(d.Length):
		return &FieldError{Field: "DATAL", Offset: 16, Err: fmt.Errorf("%d, but the PDU carries %d", d.Length, c.DataLength())}
	case c.Type == TypeH2CData && c.Flags&FlagSuccess != 0:
		return &FieldError{Field: "FLAGS", Offset: 1, Err: errors.New("SUCCESS on an H2CData")}
	case c.Flags&FlagSuccess != 0 && c.Flags&FlagLastPDU == 0:
		return &FieldError{Field: "FLAGS", Offset: 1, Err: errors.New("SUCCESS without LAST_PDU")}
	}
	return nil
}

// R2T asks the host for Length bytes of a command's data from Offset, to
// come in H2CData PDUs carrying TTag.
type R2T struct {
	Flags  uint8 // the header digest flag, as framed
	CCCID  uint16
	TTag   uint16
	Offset uint32
	Length uint32
}

// Encode writes the PDU into b[:R2TLen] (PLEN counts the header digest
// when Flags has it).
func (r *R2T) Encode(b []byte) {
	_ = b[R2TLen-1]
	plen := uint32(R2TLen)
	if r.Flags&FlagHDGST != 0 {
		plen += DigestLen
	}
	(&Common{Type: TypeR2T, Flags: r.Flags, HLen: R2TLen, PLen: plen}).Encode(b)
	binary.LittleEndian.PutUint16(b[8:], r.CCCID)
	binary.LittleEndian.PutUint16(b[10:], r.TTag)
	binary.LittleEndian.PutUint32(b[12:], r.Offset)
	binary.LittleEndian.PutUint32(b[16:], r.Length)
	clear(b[20:R2TLen])
}

// Decode reads the PDU from b.
func (r *R2T) Decode(b []byte) error {
	var c Common
	if err := c.Decode(b); err != nil {
		return err
	}
	if c.Type != TypeR2T {
		return &FieldError{Field: "PDU-Type", Offset: 0, Err: fmt.Errorf("%s is not an R2T", c.Type)}
	}
	if c.PDO != 0 {
		return &FieldError{Field: "PDO", Offset: 3, Err: errors.New("an R2T carries no data")}
	}
	if len(b) < R2TLen {
		return ErrShort
	}
	*r = R2T{Flags: c.Flags, CCCID: binary.LittleEndian.Uint16(b[8:]), TTag: binary.LittleEndian.Uint16(b[10:]),
		Offset: binary.LittleEndian.Uint32(b[12:]), Length: binary.LittleEndian.Uint32(b[16:])}
	if r.Length == 0 {
		return &FieldError{Field: "R2TL", Offset: 16, Err: errors.New("an R2T for no data")}
	}
	return nil
}

// Fatal error statuses a termination request carries (FES).
const (
	FESInvalidHeaderField uint16 = 0x01 // FEI: the field's byte offset
	FESSequenceError      uint16 = 0x02
	FESHeaderDigest       uint16 = 0x03
	FESDataOutOfRange     uint16 = 0x04
	FESDataLimitExceeded  uint16 = 0x05 // H2CTermReq: R2T limit exceeded
	FESUnsupportedParam   uint16 = 0x06 // FEI: the field's byte offset
)

// Term is a termination request (H2CTermReq or C2HTermReq): why the
// sender ends the connection (FES), with information for some statuses
// (FEI), and as data the header of the PDU that caused it.
type Term struct {
	Type Type // TypeH2CTermReq or TypeC2HTermReq
	FES  uint16
	FEI  uint32
}

// Append adds the PDU to b: its header, then, right after it, up to 128
// bytes of the offending PDU's header (bad). PDO is reserved here (0).
func (t *Term) Append(b []byte, bad []byte) []byte {
	bad = bad[:min(len(bad), MaxTermPLen-TermLen)]
	var h [TermLen]byte
	(&Common{Type: t.Type, HLen: TermLen, PLen: uint32(TermLen + len(bad))}).Encode(h[:])
	binary.LittleEndian.PutUint16(h[8:], t.FES)
	binary.LittleEndian.PutUint32(h[10:], t.FEI)
	return append(append(b, h[:]...), bad...)
}

// Decode reads the header from b (the offending header, its data, is
// the caller's).
func (t *Term) Decode(b []byte) error {
	var c Common
	if err := c.Decode(b); err != nil {
		return err
	}
	if c.Type != TypeH2CTermReq && c.Type != TypeC2HTermReq {
		return &FieldError{Field: "PDU-Type", Offset: 0, Err: fmt.Errorf("%s is not a termination request", c.Type)}
	}
	if c.PLen > MaxTermPLen {
		return &FieldError{Field: "PLEN", Offset: 4, Err: fmt.Errorf("%d, more than a termination request's %d", c.PLen, MaxTermPLen)}
	}
	if len(b) < TermLen {
		return ErrShort
	}
	*t = Term{Type: c.Type, FES: binary.LittleEndian.Uint16(b[8:]), FEI: binary.LittleEndian.Uint32(b[10:])}
	return nil
}

// castagnoli is CRC32C's table (the digests' polynomial).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Digest is the CRC32C of b: a header digest over the HLEN bytes of a
// header, a data digest over the data (not its padding).
func Digest(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// PutDigest writes a digest into b[:DigestLen], little-endian.
func PutDigest(b []byte, d uint32) { binary.LittleEndian.PutUint32(b, d) }

// GetDigest reads a digest from b[:DigestLen].
func GetDigest(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
