package srp

import (
	"fmt"
	"strconv"
	"strings"
)

// PortID is a 16-byte SRP port identifier. For InfiniBand (SRP r16a
// Annex, and what Linux uses) an initiator port ID is initiator_ext then
// the port GUID; a target port ID is id_ext then the I/O controller GUID.
type PortID [16]byte

// MakePortID joins the two 8-byte halves.
func MakePortID(hi, lo uint64) PortID {
	var p PortID
	be.PutUint64(p[:8], hi)
	be.PutUint64(p[8:], lo)
	return p
}

// Halves splits a port ID into its two 8-byte halves.
func (p PortID) Halves() (uint64, uint64) { return be.Uint64(p[:8]), be.Uint64(p[8:]) }

func (p PortID) String() string {
	hi, lo := p.Halves()
	return fmt.Sprintf("0x%016x%016x", hi, lo)
}

// ParsePortID reads a port ID as String writes it (0x and 32 hex digits),
// as 32 hex digits, or as its two halves HI:LO in hex (initiator_ext and
// port GUID, or id_ext and IOC GUID), each with an optional 0x.
func ParsePortID(s string) (PortID, error) {
	hi, lo, halves := strings.Cut(s, ":")
	if !halves {
		h := strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X")
		if len(h) != 32 {
			return PortID{}, fmt.Errorf("srp: port ID %q: want 32 hex digits or HI:LO", s)
		}
		hi, lo = h[:16], h[16:]
	}
	a, err1 := parseHalf(hi)
	b, err2 := parseHalf(lo)
	if err1 != nil || err2 != nil {
		return PortID{}, fmt.Errorf("srp: port ID %q: want 32 hex digits or HI:LO, 16 hex digits each", s)
	}
	return MakePortID(a, b), nil
}

func parseHalf(s string) (uint64, error) {
	s = strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X")
	if s == "" || len(s) > 16 || strings.HasPrefix(s, "+") {
		return 0, strconv.ErrSyntax
	}
	return strconv.ParseUint(s, 16, 64)
}

// LoginReq is SRP_LOGIN_REQ.
type LoginReq struct {
	Tag uint64
	// MaxITIULen is the REQUESTED MAXIMUM INITIATOR TO TARGET IU LENGTH.
	MaxITIULen uint32
	// BufFormats are the REQUIRED BUFFER FORMATS (BufDirect, …).
	BufFormats   uint16
	MultiChannel uint8 // MultiChannelSingle or MultiChannelMulti
	// Immediate asks for immediate data (SRP-2) at ImmDataOffset bytes
	// from the start of each SRP_CMD.
	Immediate     bool
	ImmDataOffset uint16
	Initiator     PortID
	Target        PortID
}

func (r *LoginReq) flags() byte {
	f := r.MultiChannel & multiChanMask
	if r.Immediate {
		f |= flagImmRequested
	}
	return f
}

func (r *LoginReq) setFlags(f byte) {
	r.MultiChannel = f & multiChanMask
	r.Immediate = f&flagImmRequested != 0
}

// Append appends the 64-byte IU form (sent as a Send, or as IB CM REQ
// private data).
func (r *LoginReq) Append(b []byte) []byte {
	b, p := grow(b, LoginReqLen)
	p[0] = byte(OpLoginReq)
	be.PutUint64(p[8:], r.Tag)
	be.PutUint32(p[16:], r.MaxITIULen)
	be.PutUint16(p[24:], r.BufFormats)
	p[26] = r.flags()
	be.PutUint16(p[28:], r.ImmDataOffset)
	copy(p[32:], r.Initiator[:])
	copy(p[48:], r.Target[:])
	return b
}

// AppendCM appends the 56-byte RDMA/CM form (struct srp_login_req_rdma
// in Linux): the same fields without the reserved bytes, so that it fits
// the 56 bytes InfiniBand RDMA/CM leaves for private data. Linux ib_srp
// sends this form whenever it connects through RDMA/CM (also on iWARP,
// in the MPA private data).
func (r *LoginReq) AppendCM(b []byte) []byte {
	b, p := grow(b, LoginReqCMLen)
	be.PutUint64(p[0:], r.Tag)
	be.PutUint16(p[8:], r.BufFormats)
	p[10] = r.flags()
	p[11] = byte(OpLoginReq)
	be.PutUint32(p[12:], r.MaxITIULen)
	copy(p[16:], r.Initiator[:])
	copy(p[32:], r.Target[:])
	be.PutUint16(p[48:], r.ImmDataOffset)
	return b
}

// Decode reads the 64-byte IU form.
func (r *LoginReq) Decode(b []byte) error {
	if err := need(OpLoginReq, b, LoginReqLen); err != nil {
		return err
	}
	r.Tag = be.Uint64(b[8:])
	r.MaxITIULen = be.Uint32(b[16:])
	r.BufFormats = be.Uint16(b[24:])
	r.setFlags(b[26])
	r.ImmDataOffset = be.Uint16(b[28:])
	copy(r.Initiator[:], b[32:48])
	copy(r.Target[:], b[48:64])
	return nil
}

// DecodeCM reads the 56-byte RDMA/CM form.
func (r *LoginReq) DecodeCM(b []byte) error {
	if len(b) < LoginReqCMLen {
		return errf(OpLoginReq, LogoutInvalidIULength, "RDMA/CM login of %d bytes, at least %d", len(b), LoginReqCMLen)
	}
	if Opcode(b[11]) != OpLoginReq {
		return errf(OpLoginReq, LogoutInvalidIUType, "RDMA/CM login with IU type %#02x", b[11])
	}
	r.Tag = be.Uint64(b[0:])
	r.BufFormats = be.Uint16(b[8:])
	r.setFlags(b[10])
	r.MaxITIULen = be.Uint32(b[12:])
	copy(r.Initiator[:], b[16:32])
	copy(r.Target[:], b[32:48])
	r.ImmDataOffset = be.Uint16(b[48:])
	return nil
}

// LoginRsp is SRP_LOGIN_RSP.
type LoginRsp struct {
	ReqLimDelta  uint32 // initial credits
	Tag          uint64
	MaxITIULen   uint32
	MaxTIIULen   uint32
	BufFormats   uint16
	MultiChannel uint8 // MultiChanNoExisting, MultiChanTerminated, MultiChanMaintained
	Immediate    bool  // immediate data supported (SRP-2)
}

// Append appends the 52-byte IU.
func (r *LoginRsp) Append(b []byte) []byte {
	b, p := grow(b, LoginRspLen)
	p[0] = byte(OpLoginRsp)
	be.PutUint32(p[4:], r.ReqLimDelta)
	be.PutUint64(p[8:], r.Tag)
	be.PutUint32(p[16:], r.MaxITIULen)
	be.PutUint32(p[20:], r.MaxTIIULen)
	be.PutUint16(p[24:], r.BufFormats)
	p[26] = r.MultiChannel & multiChanMask
	if r.Immediate {
		p[26] |= flagImmRequested
	}
	return b
}

// Decode reads SRP_LOGIN_RSP.
func (r *LoginRsp) Decode(b []byte) error {
	if err := need(OpLoginRsp, b, LoginRspLen); err != nil {
		return err
	}
	r.ReqLimDelta = be.Uint32(b[4:])
	r.Tag = be.Uint64(b[8:])
	r.MaxITIULen = be.Uint32(b[16:])
	r.MaxTIIULen = be.Uint32(b[20:])
	r.BufFormats = be.Uint16(b[24:])
	r.MultiChannel = b[26] & multiChanMask
	r.Immediate = b[26]&flagImmRequested != 0
	return nil
}

// LoginRej is SRP_LOGIN_REJ.
type LoginRej struct {
	Reason     RejectReason
	Tag        uint64
	BufFormats uint16 // the formats the target supports
}

// Append appends the 32-byte IU.
func (r *LoginRej) Append(b []byte) []byte {
	b, p := grow(b, LoginRejLen)
	p[0] = byte(OpLoginRej)
	be.PutUint32(p[4:], uint32(r.Reason))
	be.PutUint64(p[8:], r.Tag)
	be.PutUint16(p[24:], r.BufFormats)
	return b
}

// Decode reads SRP_LOGIN_REJ.
func (r *LoginRej) Decode(b []byte) error {
	if err := need(OpLoginRej, b, LoginRejLen); err != nil {
		return err
	}
	r.Reason = RejectReason(be.Uint32(b[4:]))
	r.Tag = be.Uint64(b[8:])
	r.BufFormats = be.Uint16(b[24:])
	return nil
}

// Error makes a login reject an error value for initiators.
func (r *LoginRej) Error() string { return "srp: login rejected: " + r.Reason.String() }
