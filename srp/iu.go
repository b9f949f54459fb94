package srp

// ILogout is SRP_I_LOGOUT.
type ILogout struct{ Tag uint64 }

// Append appends the 16-byte IU.
func (r *ILogout) Append(b []byte) []byte {
	b, p := grow(b, ILogoutLen)
	p[0] = byte(OpILogout)
	be.PutUint64(p[8:], r.Tag)
	return b
}

// Decode reads SRP_I_LOGOUT.
func (r *ILogout) Decode(b []byte) error {
	if err := need(OpILogout, b, ILogoutLen); err != nil {
		return err
	}
	r.Tag = be.Uint64(b[8:])
	return nil
}

// TLogout is SRP_T_LOGOUT.
type TLogout struct {
	SolNT  bool
	Reason LogoutReason
	Tag    uint64
}

// Append appends the 16-byte IU.
func (r *TLogout) Append(b []byte) []byte {
	b, p := grow(b, TLogoutLen)
	p[0] = byte(OpTLogout)
	if r.SolNT {
		p[1] = 1
	}
	be.PutUint32(p[4:], uint32(r.Reason))
	be.PutUint64(p[8:], r.Tag)
	return b
}

// Decode reads SRP_T_LOGOUT.
func (r *TLogout) Decode(b []byte) error {
	if err := need(OpTLogout, b, TLogoutLen); err != nil {
		return err
	}
	r.SolNT = b[1]&1 != 0
	r.Reason = LogoutReason(be.Uint32(b[4:]))
	r.Tag = be.Uint64(b[8:])
	return nil
}

// TskMgmt is SRP_TSK_MGMT.
type TskMgmt struct {
	SolNT    uint8 // SolSuccess, SolFailure
	Tag      uint64
	LUN      uint64 // the 8-byte SAM LUN field, big-endian
	Function TMF
	TaskTag  uint64 // ABORT TASK: the tag of the task to abort
}

// Append appends the 48-byte IU.
func (r *TskMgmt) Append(b []byte) []byte {
	b, p := grow(b, TskMgmtLen)
	p[0] = byte(OpTskMgmt)
	p[1] = r.SolNT
	be.PutUint64(p[8:], r.Tag)
	be.PutUint64(p[20:], r.LUN)
	p[30] = byte(r.Function)
	be.PutUint64(p[32:], r.TaskTag)
	return b
}

// Decode reads SRP_TSK_MGMT.
func (r *TskMgmt) Decode(b []byte) error {
	if err := need(OpTskMgmt, b, TskMgmtLen); err != nil {
		return err
	}
	r.SolNT = b[1] & (SolSuccess | SolFailure)
	r.Tag = be.Uint64(b[8:])
	r.LUN = be.Uint64(b[20:])
	r.Function = TMF(b[30])
	r.TaskTag = be.Uint64(b[32:])
	return nil
}

// CredReq is SRP_CRED_REQ (target asks the initiator to take credits).
type CredReq struct {
	SolNT bool
	// ReqLimDelta, as in every IU that carries it from the target, is
	// signed: a target may take credits back (SRP r16a §6.9; Linux's
	// ib_srp reads it as s32).
	ReqLimDelta int32
	Tag         uint64
}

// Append appends the 16-byte IU.
func (r *CredReq) Append(b []byte) []byte {
	b, p := grow(b, CredReqLen)
	p[0] = byte(OpCredReq)
	if r.SolNT {
		p[1] = 1
	}
	be.PutUint32(p[4:], uint32(r.ReqLimDelta))
	be.PutUint64(p[8:], r.Tag)
	return b
}

// Decode reads SRP_CRED_REQ.
func (r *CredReq) Decode(b []byte) error {
	if err := need(OpCredReq, b, CredReqLen); err != nil {
		return err
	}
	r.SolNT = b[1]&1 != 0
	r.ReqLimDelta = int32(be.Uint32(b[4:]))
	r.Tag = be.Uint64(b[8:])
	return nil
}

// AppendCredRsp appends SRP_CRED_RSP, the initiator's answer to a
// CRED_REQ.
func AppendCredRsp(b []byte, tag uint64) []byte { return appendTagOnly(b, OpCredRsp, tag) }

// AppendAerRsp appends SRP_AER_RSP, the initiator's answer to an AER_REQ.
func AppendAerRsp(b []byte, tag uint64) []byte { return appendTagOnly(b, OpAerRsp, tag) }

func appendTagOnly(b []byte, op Opcode, tag uint64) []byte {
	b, p := grow(b, 16)
	p[0] = byte(op)
	be.PutUint64(p[8:], tag)
	return b
}

// DecodeTagOnly checks a 16-byte IU of type op (SRP_CRED_RSP,
// SRP_AER_RSP, SRP_I_LOGOUT) and returns its tag.
func DecodeTagOnly(op Opcode, b []byte) (uint64, error) {
	if err := need(op, b, 16); err != nil {
		return 0, err
	}
	return be.Uint64(b[8:]), nil
}

// AerReq is SRP_AER_REQ: an asynchronous event (a unit attention) for a
// LUN, with its sense data.
type AerReq struct {
	SolNT       bool
	ReqLimDelta int32 // signed, as in CredReq
	Tag         uint64
	LUN         uint64
	Sense       []byte // aliases the IU on decode
}

// Append appends the IU with its sense data.
func (r *AerReq) Append(b []byte) []byte {
	b, p := grow(b, AerReqLen+len(r.Sense))
	p[0] = byte(OpAerReq)
	if r.SolNT {
		p[1] = 1
	}
	be.PutUint32(p[4:], uint32(r.ReqLimDelta))
	be.PutUint64(p[8:], r.Tag)
	be.PutUint64(p[20:], r.LUN)
	be.PutUint32(p[28:], uint32(len(r.Sense)))
	copy(p[AerReqLen:], r.Sense)
	return b
}

// Decode reads SRP_AER_REQ.
func (r *AerReq) Decode(b []byte) error {
	if err := need(OpAerReq, b, AerReqLen); err != nil {
		return err
	}
	r.SolNT = b[1]&1 != 0
	r.ReqLimDelta = int32(be.Uint32(b[4:]))
	r.Tag = be.Uint64(b[8:])
	r.LUN = be.Uint64(b[20:])
	n := be.Uint32(b[28:])
	if uint64(n) > uint64(len(b)-AerReqLen) {
		return errf(OpAerReq, LogoutInvalidIULength, "sense length %d in a %d-byte IU", n, len(b))
	}
	r.Sense = b[AerReqLen : AerReqLen+int(n)]
	return nil
}

// Rsp is SRP_RSP.
type Rsp struct {
	SolNT       bool
	ReqLimDelta int32 // signed, as in CredReq
	Tag         uint64
	Flags       uint8 // DataOutOver, … (RspValid and SenseValid are set by Append)
	Status      uint8
	DataOutRes  uint32
	DataInRes   uint32
	// Response data (TMF results: 4 bytes, the code last) and sense data;
	// alias the IU on decode.
	RespData []byte
	Sense    []byte
}

// Append appends the IU with its response and sense data.
func (r *Rsp) Append(b []byte) []byte {
	b, p := grow(b, RspLen+len(r.RespData)+len(r.Sense))
	p[0] = byte(OpRsp)
	if r.SolNT {
		p[1] = 1
	}
	be.PutUint32(p[4:], uint32(r.ReqLimDelta))
	be.PutUint64(p[8:], r.Tag)
	f := r.Flags &^ (RspValid | SenseValid)
	if len(r.RespData) > 0 {
		f |= RspValid
	}
	if len(r.Sense) > 0 {
		f |= SenseValid
	}
	p[18] = f
	p[19] = r.Status
	be.PutUint32(p[20:], r.DataOutRes)
	be.PutUint32(p[24:], r.DataInRes)
	be.PutUint32(p[28:], uint32(len(r.Sense)))
	be.PutUint32(p[32:], uint32(len(r.RespData)))
	copy(p[RspLen:], r.RespData)
	copy(p[RspLen+len(r.RespData):], r.Sense)
	return b
}

// Decode reads SRP_RSP. The lengths count only when their valid bits
// are set (SRP r16a), and must fit in the IU.
func (r *Rsp) Decode(b []byte) error {
	if err := need(OpRsp, b, RspLen); err != nil {
		return err
	}
	r.SolNT = b[1]&1 != 0
	r.ReqLimDelta = int32(be.Uint32(b[4:]))
	r.Tag = be.Uint64(b[8:])
	r.Flags = b[18]
	r.Status = b[19]
	r.DataOutRes = be.Uint32(b[20:])
	r.DataInRes = be.Uint32(b[24:])
	var sl, rl uint64
	if r.Flags&SenseValid != 0 {
		sl = uint64(be.Uint32(b[28:]))
	}
	if r.Flags&RspValid != 0 {
		rl = uint64(be.Uint32(b[32:]))
	}
	if RspLen+rl+sl > uint64(len(b)) {
		return errf(OpRsp, LogoutInvalidIULength, "response data %d + sense %d bytes in a %d-byte IU", rl, sl, len(b))
	}
	r.RespData = b[RspLen : RspLen+rl]
	r.Sense = b[RspLen+rl : RspLen+rl+sl]
	return nil
}

// DataInResidual returns the data-in residual as a signed count:
// positive for underflow, negative for overflow, 0 when not valid.
func (r *Rsp) DataInResidual() int {
	switch {
	case r.Flags&DataInUnder != 0:
		return int(r.DataInRes)
	case r.Flags&DataInOver != 0:
		return -int(r.DataInRes)
	}
	return 0
}

// DataOutResidual is DataInResidual for data-out.
func (r *Rsp) DataOutResidual() int {
	switch {
	case r.Flags&DataOutUnder != 0:
		return int(r.DataOutRes)
	case r.Flags&DataOutOver != 0:
		return -int(r.DataOutRes)
	}
	return 0
}
