package pdu

// Typed views of the BHS, one per opcode (RFC 7143 §11.3-§11.19). Each has
// Encode, which writes every field (zeroing reserved ones), and Decode,
// which reads the fields and checks the rules that a receiver can check
// from the header alone. Decode does not check the opcode; callers
// dispatch on BHS.Opcode first.

// Task attributes (RFC 7143 §11.3.1).
const (
	AttrUntagged    = 0
	AttrSimple      = 1
	AttrOrdered     = 2
	AttrHeadOfQueue = 3
	AttrACA         = 4
)

// SCSICommand is RFC 7143 §11.3.
type SCSICommand struct {
	Immediate bool
	Final     bool
	Read      bool
	Write     bool
	Attr      byte
	LUN       [8]byte
	ITT       uint32
	EDTL      uint32 // Expected Data Transfer Length
	CmdSN     uint32
	ExpStatSN uint32
	CDB       [16]byte
}

// Encode writes p into h: the whole BHS of a SCSICommand (RFC 7143 §11.3.),
// every field not in p zero.
func (p *SCSICommand) Encode(h *BHS) {
	*h = BHS{}
	h[OffOpcode] = byte(OpSCSICommand)
	h.setBit(OffOpcode, 0x40, p.Immediate)
	h.setBit(OffFlags, 0x80, p.Final)
	h.setBit(OffFlags, 0x40, p.Read)
	h.setBit(OffFlags, 0x20, p.Write)
	h[OffFlags] |= p.Attr & 0x07
	copy(h[OffLUN:OffLUN+8], p.LUN[:])
	h.put32(OffITT, p.ITT)
	h.put32(OffEDTL, p.EDTL)
	h.put32(OffCmdSN, p.CmdSN)
	h.put32(OffExpStatSN, p.ExpStatSN)
	copy(h[OffCDB:OffCDB+16], p.CDB[:])
}

// Decode reads p from h, a SCSICommand's BHS, and returns an *Error for
// what RFC 7143 §11.3. forbids in it.
func (p *SCSICommand) Decode(h *BHS) error {
	p.Immediate = h.Immediate()
	p.Final = h.Final()
	p.Read = h.bit(OffFlags, 0x40)
	p.Write = h.bit(OffFlags, 0x20)
	p.Attr = h[OffFlags] & 0x07
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.EDTL = h.u32(OffEDTL)
	p.CmdSN = h.u32(OffCmdSN)
	p.ExpStatSN = h.u32(OffExpStatSN)
	copy(p.CDB[:], h[OffCDB:OffCDB+16])
	if p.ITT == ReservedITT {
		return errorf(OpSCSICommand, "§11.2.1.8", RejectInvalidPDUField, "ITT 0xffffffff is reserved")
	}
	if !p.Read && !p.Write && p.EDTL != 0 {
		return errorf(OpSCSICommand, "§11.3.1", RejectInvalidPDUField,
			"R=0 W=0 with Expected Data Transfer Length %d (must be 0)", p.EDTL)
	}
	if !p.Final && !p.Write {
		return errorf(OpSCSICommand, "§11.3.1", RejectProtocolError, "F=0 on a command that sends no data")
	}
	if p.Attr > AttrACA {
		return errorf(OpSCSICommand, "§11.3.1", RejectInvalidPDUField, "task attribute %d is reserved", p.Attr)
	}
	return nil
}

// Response codes of SCSI Response (RFC 7143 §11.4.3).
const (
	RespCompleted     = 0x00
	RespTargetFailure = 0x01
)

// SCSIResponse is RFC 7143 §11.4.
type SCSIResponse struct {
	BidiOverflow  bool // o
	BidiUnderflow bool // u
	Overflow      bool // O
	Underflow     bool // U
	Response      byte
	Status        byte
	ITT           uint32
	SNACKTag      uint32
	StatSN        uint32
	ExpCmdSN      uint32
	MaxCmdSN      uint32
	ExpDataSN     uint32
	BidiResidual  uint32
	Residual      uint32
}

// Encode writes p into h: the whole BHS of a SCSIResponse (RFC 7143 §11.4.),
// every field not in p zero.
func (p *SCSIResponse) Encode(h *BHS) {
	*h = BHS{}
	h[OffOpcode] = byte(OpSCSIResponse)
	h[OffFlags] = 0x80
	h.setBit(OffFlags, 0x10, p.BidiOverflow)
	h.setBit(OffFlags, 0x08, p.BidiUnderflow)
	h.setBit(OffFlags, 0x04, p.Overflow)
	h.setBit(OffFlags, 0x02, p.Underflow)
	h[OffResponse] = p.Response
	h[OffStatus] = p.Status
	h.put32(OffITT, p.ITT)
	h.put32(OffSNACKTag, p.SNACKTag)
	h.putSNs(p.StatSN, p.ExpCmdSN, p.MaxCmdSN)
	h.put32(OffExpDataSN, p.ExpDataSN)
	h.put32(OffBidiResidual, p.BidiResidual)
	h.put32(OffResidual, p.Residual)
}

// Decode reads p from h, a SCSIResponse's BHS, and returns an *Error for
// what RFC 7143 §11.4. forbids in it.
func (p *SCSIResponse) Decode(h *BHS) error {
	p.BidiOverflow = h.bit(OffFlags, 0x10)
	p.BidiUnderflow = h.bit(OffFlags, 0x08)
	p.Overflow = h.bit(OffFlags, 0x04)
	p.Underflow = h.bit(OffFlags, 0x02)
	p.Response = h[OffResponse]
	p.Status = h[OffStatus]
	p.ITT = h.ITT()
	p.SNACKTag = h.u32(OffSNACKTag)
	p.StatSN, p.ExpCmdSN, p.MaxCmdSN = h.sns()
	p.ExpDataSN = h.u32(OffExpDataSN)
	p.BidiResidual = h.u32(OffBidiResidual)
	p.Residual = h.u32(OffResidual)
	if p.Overflow && p.Underflow {
		return errorf(OpSCSIResponse, "§11.4.5", RejectInvalidPDUField, "O and U both set")
	}
	if p.BidiOverflow && p.BidiUnderflow {
		return errorf(OpSCSIResponse, "§11.4.5", RejectInvalidPDUField, "o and u both set")
	}
	return nil
}

// Task management function codes (RFC 7143 §11.5.1).
const (
	TMFAbortTask       = 1
	TMFAbortTaskSet    = 2
	TMFClearACA        = 3
	TMFClearTaskSet    = 4
	TMFLUReset         = 5
	TMFTargetWarmReset = 6
	TMFTargetColdReset = 7
	TMFTaskReassign    = 8
)

// Task management responses (RFC 7143 §11.6.1).
const (
	TMFRespComplete      = 0
	TMFRespNoTask        = 1
	TMFRespNoLUN         = 2
	TMFRespTaskAllegiant = 3
	TMFRespNoReassign    = 4
	TMFRespNotSupported  = 5
	TMFRespAuthFailed    = 6
	TMFRespRejected      = 255
)

// TaskMgmtReq is RFC 7143 §11.5.
type TaskMgmtReq struct {
	Immediate bool
	Function  byte
	LUN       [8]byte
	ITT       uint32
	RTT       uint32 // Referenced Task Tag
	CmdSN     uint32
	ExpStatSN uint32
	RefCmdSN  uint32
	ExpDataSN uint32
}

// Encode writes p into h: the whole BHS of a TaskMgmtReq (RFC 7143 §11.5.),
// every field not in p zero.
func (p *TaskMgmtReq) Encode(h *BHS) {
	*h = BHS{}
	h[OffOpcode] = byte(OpTaskMgmtReq)
	h.setBit(OffOpcode, 0x40, p.Immediate)
	h[OffFlags] = 0x80 | p.Function&0x7f
	copy(h[OffLUN:OffLUN+8], p.LUN[:])
	h.put32(OffITT, p.ITT)
	h.put32(OffRTT, p.RTT)
	h.put32(OffCmdSN, p.CmdSN)
	h.put32(OffExpStatSN, p.ExpStatSN)
	h.put32(OffRefCmdSN, p.RefCmdSN)
	h.put32(OffExpDataSN, p.ExpDataSN)
}

// Decode reads p from h, a TaskMgmtReq's BHS, and returns an *Error for
// what RFC 7143 §11.5. forbids in it.
func (p *TaskMgmtReq) Decode(h *BHS) error {
	p.Immediate = h.Immediate()
	p.Function = h[OffFlags] & 0x7f
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.RTT = h.u32(OffRTT)
	p.CmdSN = h.u32(OffCmdSN)
	p.ExpStatSN = h.u32(OffExpStatSN)
	p.RefCmdSN = h.u32(OffRefCmdSN)
	p.ExpDataSN = h.u32(OffExpDataSN)
	if !h.Final() {
		return errorf(OpTaskMgmtReq, "§11.5", RejectInvalidPDUField, "F bit must be 1")
	}
	if h.DataSegmentLength() != 0 {
		return errorf(OpTaskMgmtReq, "§11.5", RejectProtocolError, "data segment must be empty")
	}
	return nil
}

// TaskMgmtResp is RFC 7143 §11.6.
type TaskMgmtResp struct {
	Response byte
	ITT      uint32
	StatSN   uint32
	ExpCmdSN uint32
	MaxCmdSN uint32
}

// Encode writes p into h: the whole BHS of a TaskMgmtResp (RFC 7143 §11.6.),
// every field not in p zero.
func (p *TaskMgmtResp) Encode(h *BHS) {
	*h = BHS{}
	h[OffOpcode] = byte(OpTaskMgmtResp)
	h[OffFlags] = 0x80
	h[OffResponse] = p.Response
	h.put32(OffITT, p.ITT)
	h.putSNs(p.StatSN, p.ExpCmdSN, p.MaxCmdSN)
}

// Decode reads p from h, a TaskMgmtResp's BHS, and returns an *Error for
// what RFC 7143 §11.6. forbids in it.
func (p *TaskMgmtResp) Decode(h *BHS) error {
	p.Response = h[OffResponse]
	p.ITT = h.ITT()
	p.StatSN, p.ExpCmdSN, p.MaxCmdSN = h.sns()
	return nil
}

// DataOut is RFC 7143 §11.7 (initiator to target).
type DataOut struct {
	Final     bool
	LUN       [8]byte
	ITT       uint32
	TTT       uint32
	ExpStatSN uint32
	DataSN    uint32
	Offset    uint32
}

// Encode writes p into h: the whole BHS of a DataOut (RFC 7143 §11.7),
// every field not in p zero.
func (p *DataOut) Encode(h *BHS) {
	*h = BHS{}
	h[OffOpcode] = byte(OpDataOut)
	h.setBit(OffFlags, 0x80, p.Final)
	copy(h[OffLUN:OffLUN+8], p.LUN[:])
	h.put32(OffITT, p.ITT)
	h.put32(OffTTT, p.TTT)
	h.put32(OffExpStatSN, p.ExpStatSN)
	h.put32(OffDataSN, p.DataSN)
	h.put32(OffBufferOffset, p.Offset)
}

// Decode reads p from h, a DataOut's BHS, and returns an *Error for
// what RFC 7143 §11.7 forbids in it.
func (p *DataOut) Decode(h *BHS) error {
	p.Final = h.Final()
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.TTT = h.u32(OffTTT)
	p.ExpStatSN = h.u32(OffExpStatSN)
	p.DataSN = h.u32(OffDataSN)
	p.Offset = h.u32(OffBufferOffset)
	if h.Immediate() {
		return errorf(OpDataOut, "§11.7", RejectInvalidPDUField, "I bit set on Data-Out")
	}
	return nil
}

// DataIn is RFC 7143 §11.7 (target to initiator).
type DataIn struct {
	Final     bool
	Ack       bool // A
	Overflow  bool
	Underflow bool
	HasStatus bool // S
	Status    byte
	LUN       [8]byte
	ITT       uint32
	TTT       uint32
	StatSN    uint32
	ExpCmdSN  uint32
	MaxCmdSN  uint32
	DataSN    uint32
	Offset    uint32
	Residual  uint32
}

// Encode writes p into h: the whole BHS of a DataIn (RFC 7143 §11.7),
// every field not in p zero.
func (p *DataIn) Encode(h *BHS) {
	*h = BHS{}
	h[OffOpcode] = byte(OpDataIn)
	h.setBit(OffFlags, 0x80, p.Final)
	h.setBit(OffFlags, 0x40, p.Ack)
	h.setBit(OffFlags, 0x04, p.Overflow)
	h.setBit(OffFlags, 0x02, p.Underflow)
	h.setBit(OffFlags, 0x01, p.HasStatus)
	if p.HasStatus {
		h[OffStatus] = p.Status
		h.put32(OffStatSN, p.StatSN)
		h.put32(OffResidual, p.Residual)
	}
	copy(h[OffLUN:OffLUN+8], p.LUN[:])
	h.put32(OffITT, p.ITT)
	h.put32(OffTTT, p.TTT)
	h.put32(OffExpCmdSN, p.ExpCmdSN)
	h.put32(OffMaxCmdSN, p.MaxCmdSN)
	h.put32(OffDataSN, p.DataSN)
	h.put32(OffBufferOffset, p.Offset)
}

// Decode reads p from h, a DataIn's BHS, and returns an *Error for
// what RFC 7143 §11.7 forbids in it.
func (p *DataIn) Decode(h *BHS) error {
	p.Final = h.Final()
	p.Ack = h.bit(OffFlags, 0x40)
	p.Overflow = h.bit(OffFlags, 0x04)
	p.Underflow = h.bit(OffFlags, 0x02)
	p.HasStatus = h.bit(OffFlags, 0x01)
	// Status, StatSN and Residual Count are defined only with S=1 (RFC
	// 7143 §11.7.4, §11.7.5).
	p.Status, p.StatSN, p.Residual = 0, 0, 0
	if p.HasStatus {
		p.Status = h[OffStatus]
		p.StatSN = h.u32(OffStatSN)
		p.Residual = h.u32(OffResidual)
	}
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.TTT = h.u32(OffTTT)
	p.ExpCmdSN = h.u32(OffExpCmdSN)
	p.MaxCmdSN = h.u32(OffMaxCmdSN)
	p.DataSN = h.u32(OffDataSN)
	p.Offset = h.u32(OffBufferOffset)
	if p.HasStatus && !p.Final {
		return errorf(OpDataIn, "§11.7.2", RejectProtocolError, "S bit set without F bit")
	}
	if p.Overflow && p.Underflow {
		return errorf(OpDataIn, "§11.7.5", RejectInvalidPDUField, "O and U both set")
	}
	return nil
}

// R2T is RFC 7143 §11.8.
type R2T struct {
	LUN      [8]byte
	ITT      uint32
	TTT      uint32
	StatSN   uint32
	ExpCmdSN uint32
	MaxCmdSN uint32
	R2TSN    uint32
	Offset   uint32
	Desired  uint32 // Desired Data Transfer Length
}

// Encode writes p into h: the whole BHS of a R2T (RFC 7143 §11.8.),
// every field not in p zero.
func (p *R2T) Encode(h *BHS) {
	*h = BHS{}
	h[OffOpcode] = byte(OpR2T)
	h[OffFlags] = 0x80
	copy(h[OffLUN:OffLUN+8], p.LUN[:])
	h.put32(OffITT, p.ITT)
	h.put32(OffTTT, p.TTT)
	h.putSNs(p.StatSN, p.ExpCmdSN, p.MaxCmdSN)
	h.put32(OffR2TSN, p.R2TSN)
	h.put32(OffBufferOffset, p.Offset)
	h.put32(OffDesiredLength, p.Desired)
}

// Decode reads p from h, a R2T's BHS, and returns an *Error for
// what RFC 7143 §11.8. forbids in it.
func (p *R2T) Decode(h *BHS) error {
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.TTT = h.u32(OffTTT)
	p.StatSN, p.ExpCmdSN, p.MaxCmdSN = h.sns()
	p.R2TSN = h.u32(OffR2TSN)
	p.Offset = h.u32(OffBufferOffset)
	p.Desired = h.u32(OffDesiredLength)
	if p.TTT == ReservedTTT {
		return errorf(OpR2T, "§11.8.4", RejectInvalidPDUField, "TTT 0xffffffff is reserved")
	}
	if p.Desired == 0 {
		return errorf(OpR2T, "§11.8.6", RejectInvalidPDUField, "Desired Data Transfer Length is 0")
	}
	return nil
}

// Asynchronous events (RFC 7143 §11.9.1).
const (
	AsyncSCSI               = 0
	AsyncLogoutRequest      = 1
	AsyncDropConnection     = 2
	AsyncDropAllConnections = 3
	AsyncRenegotiate        = 4
	AsyncVendor             = 255
)

// AsyncMsg is RFC 7143 §11.9.
type AsyncMsg struct {
	LUN        [8]byte
	StatSN     uint32
	ExpCmdSN   uint32
	MaxCmdSN   uint32
	Event      byte
	VCode      byte
	Parameter1 uint16
	Parameter2 uint16
	Parameter3 uint16
}

// Encode writes p into h: the whole BHS of a AsyncMsg (RFC 7143 §11.9.),
// every field not in p zero.
func (p *AsyncMsg) Encode(h *BHS) {
	*h = BHS{}
	h[OffOpcode] = byte(OpAsyncMsg)
	h[OffFlags] = 0x80
	copy(h[OffLUN:OffLUN+8], p.LUN[:])
	h.put32(OffITT, ReservedITT)
	h.putSNs(p.StatSN, p.ExpCmdSN, p.MaxCmdSN)
	h[OffAsyncEvent] = p.Event
	h[OffAsyncVCode] = p.VCode
	h.put16(OffParameter1, p.Parameter1)
	h.put16(OffParameter2, p.Parameter2)
	h.put16(OffParameter3, p.Parameter3)
}

// Decode reads p from h, a AsyncMsg's BHS, and returns an *Error for
// what RFC 7143 §11.9. forbids in it.
func (p *AsyncMsg) Decode(h *BHS) error {
	p.LUN = h.LUN()
	p.StatSN, p.ExpCmdSN, p.MaxCmdSN = h.sns()
	p.Event = h[OffAsyncEvent]
	p.VCode = h[OffAsyncVCode]
	p.Parameter1 = h.u16(OffParameter1)
	p.Parameter2 = h.u16(OffParameter2)
	p.Parameter3 = h.u16(OffParameter3)
	if h.ITT() != ReservedITT {
		return errorf(OpAsyncMsg, "§11.9", RejectInvalidPDUField, "ITT must be 0xffffffff")
	}
	return nil
}

// TextReq is RFC 7143 §11.10.
type TextReq struct {
	Immediate bool
	Final     bool
	Continue  bool
	LUN       [8]byte
	ITT       uint32
	TTT       uint32
	CmdSN     uint32
	ExpStatSN uint32
}

// Encode writes p into h: the whole BHS of a TextReq (RFC 7143 §11.10.),
// every field not in p zero.
func (p *TextReq) Encode(h *BHS) {
	*h = BHS{}
	h[OffOpcode] = byte(OpTextReq)
	h.setBit(OffOpcode, 0x40, p.Immediate)
	h.setBit(OffFlags, 0x80, p.Final)
	h.setBit(OffFlags, 0x40, p.Continue)
	copy(h[OffLUN:OffLUN+8], p.LUN[:])
	h.put32(OffITT, p.ITT)
	h.put32(OffTTT, p.TTT)
	h.put32(OffCmdSN, p.CmdSN)
	h.put32(OffExpStatSN, p.ExpStatSN)
}

// Decode reads p from h, a TextReq's BHS, and returns an *Error for
// what RFC 7143 §11.10. forbids in it.
func (p *TextReq) Decode(h *BHS) error {
	p.Immediate = h.Immediate()
	p.Final = h.Final()
	p.Continue = h.bit(OffFlags, 0x40)
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.TTT = h.u32(OffTTT)
	p.CmdSN = h.u32(OffCmdSN)
	p.ExpStatSN = h.u32(OffExpStatSN)
	if p.Final && p.Continue {
		return errorf(OpTextReq, "§11.10.2", RejectProtocolError, "F and C both set")
	}
	if p.ITT == ReservedITT {
		return errorf(OpTextReq, "§11.10.4", RejectInvalidPDUField, "ITT 0xffffffff is reserved")
	}
	return nil
}

// TextResp is RFC 7143 §11.11.
type TextResp struct {
	Final    bool
	Continue bool
	LUN      [8]byte
	ITT      uint32
	TTT      uint32
	StatSN   uint32
	ExpCmdSN uint32
	MaxCmdSN uint32
}

// Encode writes p into h: the whole BHS of a TextResp (RFC 7143 §11.11.),
// every field not in p zero.
func (p *TextResp) Encode(h *BHS) {
	*h = BHS{}
	h[OffOpcode] = byte(OpTextResp)
	h.setBit(OffFlags, 0x80, p.Final)
	h.setBit(OffFlags, 0x40, p.Continue)
	copy(h[OffLUN:OffLUN+8], p.LUN[:])
	h.put32(OffITT, p.ITT)
	h.put32(OffTTT, p.TTT)
	h.putSNs(p.StatSN, p.ExpCmdSN, p.MaxCmdSN)
}

// Decode reads p from h, a TextResp's BHS, and returns an *Error for
// what RFC 7143 §11.11. forbids in it.
func (p *TextResp) Decode(h *BHS) error {
	p.Final = h.Final()
	p.Continue = h.bit(OffFlags, 0x40)
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.TTT = h.u32(OffTTT)
	p.StatSN, p.ExpCmdSN, p.MaxCmdSN = h.sns()
	if p.Final && p.Continue {
		return errorf(OpTextResp, "§11.11.2", RejectProtocolError, "F and C both set")
	}
	if p.Final && p.TTT != ReservedTTT {
		return errorf(OpTextResp, "§11.11.4", RejectProtocolError, "F=1 with TTT %#x (must be 0xffffffff)", p.TTT)
	}
	return nil
}

// Login stages (RFC 7143 §11.12.3).
const (
	StageSecurity    = 0
	StageOperational = 1
	StageFullFeature = 3
)

// LoginReq is RFC 7143 §11.12.
type LoginReq struct {
	Transit    bool
	Continue   bool
	CSG, NSG   byte
	VersionMax byte
	VersionMin byte
	ISID       [6]byte
	TSIH       uint16
	ITT        uint32
	CID        uint16
	CmdSN      uint32
	ExpStatSN  uint32
}

// Encode writes p into h: the whole BHS of a LoginReq (RFC 7143 §11.12.),
// every field not in p zero.
func (p *LoginReq) Encode(h *BHS) {
	*h = BHS{}
	h[OffOpcode] = byte(OpLoginReq) | 0x40 // I is always 1 (§11.12)
	h.setBit(OffFlags, 0x80, p.Transit)
	h.setBit(OffFlags, 0x40, p.Continue)
	h[OffFlags] |= (p.CSG&3)<<2 | p.NSG&3
	h[OffVersionMax] = p.VersionMax
	h[OffVersionMin] = p.VersionMin
	copy(h[OffISID:OffISID+6], p.ISID[:])
	h.put16(OffTSIH, p.TSIH)
	h.put32(OffITT, p.ITT)
	h.put16(OffCID, p.CID)
	h.put32(OffCmdSN, p.CmdSN)
	h.put32(OffExpStatSN, p.ExpStatSN)
}

// Decode reads p from h, a LoginReq's BHS, and returns an *Error for
// what RFC 7143 §11.12. forbids in it.
func (p *LoginReq) Decode(h *BHS) error {
	p.Transit = h.Final()
	p.Continue = h.bit(OffFlags, 0x40)
	p.CSG = (h[OffFlags] >> 2) & 3
	p.NSG = h[OffFlags] & 3
	p.VersionMax = h[OffVersionMax]
	p.VersionMin = h[OffVersionMin]
	copy(p.ISID[:], h[OffISID:OffISID+6])
	p.TSIH = h.u16(OffTSIH)
	p.ITT = h.ITT()
	p.CID = h.u16(OffCID)
	p.CmdSN = h.u32(OffCmdSN)
	p.ExpStatSN = h.u32(OffExpStatSN)
	if p.Transit && p.Continue {
		return errorf(OpLoginReq, "§11.12.2", RejectProtocolError, "T and C both set")
	}
	if p.CSG == 2 || (p.Transit && p.NSG == 2) {
		return errorf(OpLoginReq, "§11.12.3", RejectProtocolError, "stage 2 is reserved")
	}
	if p.Transit && p.NSG <= p.CSG {
		return errorf(OpLoginReq, "§11.12.3", RejectProtocolError, "transit from stage %d to stage %d does not advance", p.CSG, p.NSG)
	}
	return nil
}

// Login status classes (RFC 7143 §11.13.5).
const (
	LoginSuccess        = 0x00
	LoginRedirect       = 0x01
	LoginInitiatorError = 0x02
	LoginTargetError    = 0x03
)

// Login status details (class<<8 | detail).
const (
	LoginStatusSuccess            = 0x0000
	LoginStatusMovedTemporarily   = 0x0101
	LoginStatusMovedPermanently   = 0x0102
	LoginStatusInitiatorError     = 0x0200
	LoginStatusAuthFailure        = 0x0201
	LoginStatusAuthorizationFail  = 0x0202
	LoginStatusNotFound           = 0x0203
	LoginStatusTargetRemoved      = 0x0204
	LoginStatusUnsupportedVersion = 0x0205
	LoginStatusTooManyConnections = 0x0206
	LoginStatusMissingParameter   = 0x0207
	LoginStatusCantIncludeInSess  = 0x0208
	LoginStatusSessionTypeUnsupp  = 0x0209
	LoginStatusSessionNotFound    = 0x020a
	LoginStatusInvalidDuringLogin = 0x020b
	LoginStatusTargetError        = 0x0300
	LoginStatusServiceUnavailable = 0x0301
	LoginStatusOutOfResources     = 0x0302
)

// LoginResp is RFC 7143 §11.13.
type LoginResp struct {
	Transit       bool
	Continue      bool
	CSG, NSG      byte
	VersionMax    byte
	VersionActive byte
	ISID          [6]byte
	TSIH          uint16
	ITT           uint32
	StatSN        uint32
	ExpCmdSN      uint32
	MaxCmdSN      uint32
	StatusClass   byte
	StatusDetail  byte
}

// Encode writes p into h: the whole BHS of a LoginResp (RFC 7143 §11.13.),
// every field not in p zero.
func (p *LoginResp) Encode(h *BHS) {
	*h = BHS{}
	h[OffOpcode] = byte(OpLoginResp)
	h.setBit(OffFlags, 0x80, p.Transit)
	h.setBit(OffFlags, 0x40, p.Continue)
	h[OffFlags] |= (p.CSG&3)<<2 | p.NSG&3
	h[OffVersionMax] = p.VersionMax
	h[OffVersionMin] = p.VersionActive
	copy(h[OffISID:OffISID+6], p.ISID[:])
	h.put16(OffTSIH, p.TSIH)
	h.put32(OffITT, p.ITT)
	h.putSNs(p.StatSN, p.ExpCmdSN, p.MaxCmdSN)
	h[OffStatusClass] = p.StatusClass
	h[OffStatusDetail] = p.StatusDetail
}

// Decode reads p from h, a LoginResp's BHS, and returns an *Error for
// what RFC 7143 §11.13. forbids in it.
func (p *LoginResp) Decode(h *BHS) error {
	p.Transit = h.Final()
	p.Continue = h.bit(OffFlags, 0x40)
	p.CSG = (h[OffFlags] >> 2) & 3
	p.NSG = h[OffFlags] & 3
	p.VersionMax = h[OffVersionMax]
	p.VersionActive = h[OffVersionMin]
	copy(p.ISID[:], h[OffISID:OffISID+6])
	p.TSIH = h.u16(OffTSIH)
	p.ITT = h.ITT()
	p.StatSN, p.ExpCmdSN, p.MaxCmdSN = h.sns()
	p.StatusClass = h[OffStatusClass]
	p.StatusDetail = h[OffStatusDetail]
	if p.Transit && p.Continue {
		return errorf(OpLoginResp, "§11.13.2", RejectProtocolError, "T and C both set")
	}
	return nil
}

// Logout reason codes (RFC 7143 §11.14.1).
const (
	LogoutCloseSession    = 0
	LogoutCloseConnection = 1
	LogoutRecovery        = 2
)

// LogoutReq is RFC 7143 §11.14.
type LogoutReq struct {
	Immediate bool
	Reason    byte
	ITT       uint32
	CID       uint16
	CmdSN     uint32
	ExpStatSN uint32
}

// Encode writes p into h: the whole BHS of a LogoutReq (RFC 7143 §11.14.),
// every field not in p zero.
func (p *LogoutReq) Encode(h *BHS) {
	*h = BHS{}
	h[OffOpcode] = byte(OpLogoutReq)
	h.setBit(OffOpcode, 0x40, p.Immediate)
	h[OffFlags] = 0x80 | p.Reason&0x7f
	h.put32(OffITT, p.ITT)
	h.put16(OffCID, p.CID)
	h.put32(OffCmdSN, p.CmdSN)
	h.put32(OffExpStatSN, p.ExpStatSN)
}

// Decode reads p from h, a LogoutReq's BHS, and returns an *Error for
// what RFC 7143 §11.14. forbids in it.
func (p *LogoutReq) Decode(h *BHS) error {
	p.Immediate = h.Immediate()
	p.Reason = h[OffFlags] & 0x7f
	p.ITT = h.ITT()
	p.CID = h.u16(OffCID)
	p.CmdSN = h.u32(OffCmdSN)
	p.ExpStatSN = h.u32(OffExpStatSN)
	if !h.Final() {
		return errorf(OpLogoutReq, "§11.14", RejectInvalidPDUField, "F bit must be 1")
	}
	if p.Reason > LogoutRecovery {
		return errorf(OpLogoutReq, "§11.14.1", RejectInvalidPDUField, "reason code %d is reserved", p.Reason)
	}
	return nil
}

// Logout responses (RFC 7143 §11.15.1).
const (
	LogoutRespSuccess       = 0
	LogoutRespCIDNotFound   = 1
	LogoutRespNoRecovery    = 2
	LogoutRespCleanupFailed = 3
)

// LogoutResp is RFC 7143 §11.15.
type LogoutResp struct {
	Response    byte
	ITT         uint32
	StatSN      uint32
	ExpCmdSN    uint32
	MaxCmdSN    uint32
	Time2Wait   uint16
	Time2Retain uint16
}

// Encode writes p into h: the whole BHS of a LogoutResp (RFC 7143 §11.15.),
// every field not in p zero.
func (p *LogoutResp) Encode(h *BHS) {
	*h = BHS{}
	h[OffOpcode] = byte(OpLogoutResp)
	h[OffFlags] = 0x80
	h[OffResponse] = p.Response
	h.put32(OffITT, p.ITT)
	h.putSNs(p.StatSN, p.ExpCmdSN, p.MaxCmdSN)
	h.put16(OffTime2Wait, p.Time2Wait)
	h.put16(OffTime2Retain, p.Time2Retain)
}

// Decode reads p from h, a LogoutResp's BHS, and returns an *Error for
// what RFC 7143 §11.15. forbids in it.
func (p *LogoutResp) Decode(h *BHS) error {
	p.Response = h[OffResponse]
	p.ITT = h.ITT()
	p.StatSN, p.ExpCmdSN, p.MaxCmdSN = h.sns()
	p.Time2Wait = h.u16(OffTime2Wait)
	p.Time2Retain = h.u16(OffTime2Retain)
	return nil
}

// SNACK types (RFC 7143 §11.16.1).
const (
	SNACKDataR2T = 0
	SNACKStatus  = 1
	SNACKDataACK = 2
	SNACKRData   = 3
)

// SNACKReq is RFC 7143 §11.16.
type SNACKReq struct {
	Type      byte
	LUN       [8]byte
	ITT       uint32
	TTT       uint32
	ExpStatSN uint32
	BegRun    uint32
	RunLength uint32
}

// Encode writes p into h: the whole BHS of a SNACKReq (RFC 7143 §11.16.),
// every field not in p zero.
func (p *SNACKReq) Encode(h *BHS) {
	*h = BHS{}
	h[OffOpcode] = byte(OpSNACKReq)
	h[OffFlags] = 0x80 | p.Type&0x0f
	copy(h[OffLUN:OffLUN+8], p.LUN[:])
	h.put32(OffITT, p.ITT)
	h.put32(OffTTT, p.TTT)
	h.put32(OffExpStatSN, p.ExpStatSN)
	h.put32(OffBegRun, p.BegRun)
	h.put32(OffRunLength, p.RunLength)
}

// Decode reads p from h, a SNACKReq's BHS, and returns an *Error for
// what RFC 7143 §11.16. forbids in it.
func (p *SNACKReq) Decode(h *BHS) error {
	p.Type = h[OffFlags] & 0x0f
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.TTT = h.u32(OffTTT)
	p.ExpStatSN = h.u32(OffExpStatSN)
	p.BegRun = h.u32(OffBegRun)
	p.RunLength = h.u32(OffRunLength)
	if p.Type > SNACKRData {
		return errorf(OpSNACKReq, "§11.16.1", RejectInvalidPDUField, "SNACK type %d is reserved", p.Type)
	}
	return nil
}

// Reject is RFC 7143 §11.17. Its data segment carries the complete header
// of the rejected PDU.
type Reject struct {
	Reason   RejectReason
	StatSN   uint32
	ExpCmdSN uint32
	MaxCmdSN uint32
	DataSN   uint32 // DataSN/R2TSN
}

// Encode writes p into h: the whole BHS of a Reject (RFC 7143 §11.17.),
// every field not in p zero.
func (p *Reject) Encode(h *BHS) {
	*h = BHS{}
	h[OffOpcode] = byte(OpReject)
	h[OffFlags] = 0x80
	h[OffResponse] = byte(p.Reason)
	h.put32(OffITT, ReservedITT)
	h.putSNs(p.StatSN, p.ExpCmdSN, p.MaxCmdSN)
	h.put32(OffDataSN, p.DataSN)
}

// Decode reads p from h, a Reject's BHS, and returns an *Error for
// what RFC 7143 §11.17. forbids in it.
func (p *Reject) Decode(h *BHS) error {
	p.Reason = RejectReason(h[OffResponse])
	p.StatSN, p.ExpCmdSN, p.MaxCmdSN = h.sns()
	p.DataSN = h.u32(OffDataSN)
	if h.DataSegmentLength() < BHSLen {
		return errorf(OpReject, "§11.17", RejectProtocolError, "data segment of %d bytes cannot hold the rejected header", h.DataSegmentLength())
	}
	return nil
}

// NopOut is RFC 7143 §11.18.
type NopOut struct {
	Immediate bool
	LUN       [8]byte
	ITT       uint32
	TTT       uint32
	CmdSN     uint32
	ExpStatSN uint32
}

// Encode writes p into h: the whole BHS of a NopOut (RFC 7143 §11.18.),
// every field not in p zero.
func (p *NopOut) Encode(h *BHS) {
	*h = BHS{}
	h[OffOpcode] = byte(OpNopOut)
	h.setBit(OffOpcode, 0x40, p.Immediate)
	h[OffFlags] = 0x80
	copy(h[OffLUN:OffLUN+8], p.LUN[:])
	h.put32(OffITT, p.ITT)
	h.put32(OffTTT, p.TTT)
	h.put32(OffCmdSN, p.CmdSN)
	h.put32(OffExpStatSN, p.ExpStatSN)
}

// Decode reads p from h, a NopOut's BHS, and returns an *Error for
// what RFC 7143 §11.18. forbids in it.
func (p *NopOut) Decode(h *BHS) error {
	p.Immediate = h.Immediate()
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.TTT = h.u32(OffTTT)
	p.CmdSN = h.u32(OffCmdSN)
	p.ExpStatSN = h.u32(OffExpStatSN)
	if !h.Final() {
		return errorf(OpNopOut, "§11.18", RejectInvalidPDUField, "F bit must be 1")
	}
	// ITT and TTT both 0xffffffff is a one-way NOP-Out: no answer is
	// wanted, it only confirms ExpStatSN (RFC 7143 §11.18.1, §11.18.3).
	if p.ITT == ReservedITT && !p.Immediate {
		return errorf(OpNopOut, "§11.18", RejectProtocolError, "a NOP-Out answering a ping (ITT 0xffffffff) must be immediate")
	}
	return nil
}

// NopIn is RFC 7143 §11.19.
type NopIn struct {
	LUN      [8]byte
	ITT      uint32
	TTT      uint32
	StatSN   uint32
	ExpCmdSN uint32
	MaxCmdSN uint32
}

// Encode writes p into h: the whole BHS of a NopIn (RFC 7143 §11.19.),
// every field not in p zero.
func (p *NopIn) Encode(h *BHS) {
	*h = BHS{}
	h[OffOpcode] = byte(OpNopIn)
	h[OffFlags] = 0x80
	copy(h[OffLUN:OffLUN+8], p.LUN[:])
	h.put32(OffITT, p.ITT)
	h.put32(OffTTT, p.TTT)
	h.putSNs(p.StatSN, p.ExpCmdSN, p.MaxCmdSN)
}

// Decode reads p from h, a NopIn's BHS, and returns an *Error for
// what RFC 7143 §11.19. forbids in it.
func (p *NopIn) Decode(h *BHS) error {
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.TTT = h.u32(OffTTT)
	p.StatSN, p.ExpCmdSN, p.MaxCmdSN = h.sns()
	// ITT and TTT both 0xffffffff is a one-way NOP-In: the target wants
	// no NOP-Out back (RFC 7143 §11.19.1, §11.19.2); tgt sends them.
	return nil
}
