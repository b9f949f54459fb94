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

func (p *SCSICommand) Encode(h *BHS) {
	*h = BHS{}
	h[0] = byte(OpSCSICommand)
	h.setBit(0, 0x40, p.Immediate)
	h.setBit(1, 0x80, p.Final)
	h.setBit(1, 0x40, p.Read)
	h.setBit(1, 0x20, p.Write)
	h[1] |= p.Attr & 0x07
	copy(h[8:16], p.LUN[:])
	h.put32(16, p.ITT)
	h.put32(20, p.EDTL)
	h.put32(24, p.CmdSN)
	h.put32(28, p.ExpStatSN)
	copy(h[32:48], p.CDB[:])
}

func (p *SCSICommand) Decode(h *BHS) error {
	p.Immediate = h.Immediate()
	p.Final = h.Final()
	p.Read = h.bit(1, 0x40)
	p.Write = h.bit(1, 0x20)
	p.Attr = h[1] & 0x07
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.EDTL = h.u32(20)
	p.CmdSN = h.u32(24)
	p.ExpStatSN = h.u32(28)
	copy(p.CDB[:], h[32:48])
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

func (p *SCSIResponse) Encode(h *BHS) {
	*h = BHS{}
	h[0] = byte(OpSCSIResponse)
	h[1] = 0x80
	h.setBit(1, 0x10, p.BidiOverflow)
	h.setBit(1, 0x08, p.BidiUnderflow)
	h.setBit(1, 0x04, p.Overflow)
	h.setBit(1, 0x02, p.Underflow)
	h[2] = p.Response
	h[3] = p.Status
	h.put32(16, p.ITT)
	h.put32(20, p.SNACKTag)
	h.put32(24, p.StatSN)
	h.put32(28, p.ExpCmdSN)
	h.put32(32, p.MaxCmdSN)
	h.put32(36, p.ExpDataSN)
	h.put32(40, p.BidiResidual)
	h.put32(44, p.Residual)
}

func (p *SCSIResponse) Decode(h *BHS) error {
	p.BidiOverflow = h.bit(1, 0x10)
	p.BidiUnderflow = h.bit(1, 0x08)
	p.Overflow = h.bit(1, 0x04)
	p.Underflow = h.bit(1, 0x02)
	p.Response = h[2]
	p.Status = h[3]
	p.ITT = h.ITT()
	p.SNACKTag = h.u32(20)
	p.StatSN = h.u32(24)
	p.ExpCmdSN = h.u32(28)
	p.MaxCmdSN = h.u32(32)
	p.ExpDataSN = h.u32(36)
	p.BidiResidual = h.u32(40)
	p.Residual = h.u32(44)
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

func (p *TaskMgmtReq) Encode(h *BHS) {
	*h = BHS{}
	h[0] = byte(OpTaskMgmtReq)
	h.setBit(0, 0x40, p.Immediate)
	h[1] = 0x80 | p.Function&0x7f
	copy(h[8:16], p.LUN[:])
	h.put32(16, p.ITT)
	h.put32(20, p.RTT)
	h.put32(24, p.CmdSN)
	h.put32(28, p.ExpStatSN)
	h.put32(32, p.RefCmdSN)
	h.put32(36, p.ExpDataSN)
}

func (p *TaskMgmtReq) Decode(h *BHS) error {
	p.Immediate = h.Immediate()
	p.Function = h[1] & 0x7f
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.RTT = h.u32(20)
	p.CmdSN = h.u32(24)
	p.ExpStatSN = h.u32(28)
	p.RefCmdSN = h.u32(32)
	p.ExpDataSN = h.u32(36)
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

func (p *TaskMgmtResp) Encode(h *BHS) {
	*h = BHS{}
	h[0] = byte(OpTaskMgmtResp)
	h[1] = 0x80
	h[2] = p.Response
	h.put32(16, p.ITT)
	h.put32(24, p.StatSN)
	h.put32(28, p.ExpCmdSN)
	h.put32(32, p.MaxCmdSN)
}

func (p *TaskMgmtResp) Decode(h *BHS) error {
	p.Response = h[2]
	p.ITT = h.ITT()
	p.StatSN = h.u32(24)
	p.ExpCmdSN = h.u32(28)
	p.MaxCmdSN = h.u32(32)
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

func (p *DataOut) Encode(h *BHS) {
	*h = BHS{}
	h[0] = byte(OpDataOut)
	h.setBit(1, 0x80, p.Final)
	copy(h[8:16], p.LUN[:])
	h.put32(16, p.ITT)
	h.put32(20, p.TTT)
	h.put32(28, p.ExpStatSN)
	h.put32(36, p.DataSN)
	h.put32(40, p.Offset)
}

func (p *DataOut) Decode(h *BHS) error {
	p.Final = h.Final()
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.TTT = h.u32(20)
	p.ExpStatSN = h.u32(28)
	p.DataSN = h.u32(36)
	p.Offset = h.u32(40)
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

func (p *DataIn) Encode(h *BHS) {
	*h = BHS{}
	h[0] = byte(OpDataIn)
	h.setBit(1, 0x80, p.Final)
	h.setBit(1, 0x40, p.Ack)
	h.setBit(1, 0x04, p.Overflow)
	h.setBit(1, 0x02, p.Underflow)
	h.setBit(1, 0x01, p.HasStatus)
	if p.HasStatus {
		h[3] = p.Status
		h.put32(24, p.StatSN)
		h.put32(44, p.Residual)
	}
	copy(h[8:16], p.LUN[:])
	h.put32(16, p.ITT)
	h.put32(20, p.TTT)
	h.put32(28, p.ExpCmdSN)
	h.put32(32, p.MaxCmdSN)
	h.put32(36, p.DataSN)
	h.put32(40, p.Offset)
}

func (p *DataIn) Decode(h *BHS) error {
	p.Final = h.Final()
	p.Ack = h.bit(1, 0x40)
	p.Overflow = h.bit(1, 0x04)
	p.Underflow = h.bit(1, 0x02)
	p.HasStatus = h.bit(1, 0x01)
	// Status, StatSN and Residual Count are defined only with S=1 (RFC
	// 7143 §11.7.4, §11.7.5).
	p.Status, p.StatSN, p.Residual = 0, 0, 0
	if p.HasStatus {
		p.Status = h[3]
		p.StatSN = h.u32(24)
		p.Residual = h.u32(44)
	}
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.TTT = h.u32(20)
	p.ExpCmdSN = h.u32(28)
	p.MaxCmdSN = h.u32(32)
	p.DataSN = h.u32(36)
	p.Offset = h.u32(40)
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

func (p *R2T) Encode(h *BHS) {
	*h = BHS{}
	h[0] = byte(OpR2T)
	h[1] = 0x80
	copy(h[8:16], p.LUN[:])
	h.put32(16, p.ITT)
	h.put32(20, p.TTT)
	h.put32(24, p.StatSN)
	h.put32(28, p.ExpCmdSN)
	h.put32(32, p.MaxCmdSN)
	h.put32(36, p.R2TSN)
	h.put32(40, p.Offset)
	h.put32(44, p.Desired)
}

func (p *R2T) Decode(h *BHS) error {
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.TTT = h.u32(20)
	p.StatSN = h.u32(24)
	p.ExpCmdSN = h.u32(28)
	p.MaxCmdSN = h.u32(32)
	p.R2TSN = h.u32(36)
	p.Offset = h.u32(40)
	p.Desired = h.u32(44)
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

func (p *AsyncMsg) Encode(h *BHS) {
	*h = BHS{}
	h[0] = byte(OpAsyncMsg)
	h[1] = 0x80
	copy(h[8:16], p.LUN[:])
	h.put32(16, ReservedITT)
	h.put32(24, p.StatSN)
	h.put32(28, p.ExpCmdSN)
	h.put32(32, p.MaxCmdSN)
	h[36] = p.Event
	h[37] = p.VCode
	h.put16(38, p.Parameter1)
	h.put16(40, p.Parameter2)
	h.put16(42, p.Parameter3)
}

func (p *AsyncMsg) Decode(h *BHS) error {
	p.LUN = h.LUN()
	p.StatSN = h.u32(24)
	p.ExpCmdSN = h.u32(28)
	p.MaxCmdSN = h.u32(32)
	p.Event = h[36]
	p.VCode = h[37]
	p.Parameter1 = h.u16(38)
	p.Parameter2 = h.u16(40)
	p.Parameter3 = h.u16(42)
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

func (p *TextReq) Encode(h *BHS) {
	*h = BHS{}
	h[0] = byte(OpTextReq)
	h.setBit(0, 0x40, p.Immediate)
	h.setBit(1, 0x80, p.Final)
	h.setBit(1, 0x40, p.Continue)
	copy(h[8:16], p.LUN[:])
	h.put32(16, p.ITT)
	h.put32(20, p.TTT)
	h.put32(24, p.CmdSN)
	h.put32(28, p.ExpStatSN)
}

func (p *TextReq) Decode(h *BHS) error {
	p.Immediate = h.Immediate()
	p.Final = h.Final()
	p.Continue = h.bit(1, 0x40)
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.TTT = h.u32(20)
	p.CmdSN = h.u32(24)
	p.ExpStatSN = h.u32(28)
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

func (p *TextResp) Encode(h *BHS) {
	*h = BHS{}
	h[0] = byte(OpTextResp)
	h.setBit(1, 0x80, p.Final)
	h.setBit(1, 0x40, p.Continue)
	copy(h[8:16], p.LUN[:])
	h.put32(16, p.ITT)
	h.put32(20, p.TTT)
	h.put32(24, p.StatSN)
	h.put32(28, p.ExpCmdSN)
	h.put32(32, p.MaxCmdSN)
}

func (p *TextResp) Decode(h *BHS) error {
	p.Final = h.Final()
	p.Continue = h.bit(1, 0x40)
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.TTT = h.u32(20)
	p.StatSN = h.u32(24)
	p.ExpCmdSN = h.u32(28)
	p.MaxCmdSN = h.u32(32)
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

func (p *LoginReq) Encode(h *BHS) {
	*h = BHS{}
	h[0] = byte(OpLoginReq) | 0x40 // I is always 1 (§11.12)
	h.setBit(1, 0x80, p.Transit)
	h.setBit(1, 0x40, p.Continue)
	h[1] |= (p.CSG&3)<<2 | p.NSG&3
	h[2] = p.VersionMax
	h[3] = p.VersionMin
	copy(h[8:14], p.ISID[:])
	h.put16(14, p.TSIH)
	h.put32(16, p.ITT)
	h.put16(20, p.CID)
	h.put32(24, p.CmdSN)
	h.put32(28, p.ExpStatSN)
}

func (p *LoginReq) Decode(h *BHS) error {
	p.Transit = h.Final()
	p.Continue = h.bit(1, 0x40)
	p.CSG = (h[1] >> 2) & 3
	p.NSG = h[1] & 3
	p.VersionMax = h[2]
	p.VersionMin = h[3]
	copy(p.ISID[:], h[8:14])
	p.TSIH = h.u16(14)
	p.ITT = h.ITT()
	p.CID = h.u16(20)
	p.CmdSN = h.u32(24)
	p.ExpStatSN = h.u32(28)
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

func (p *LoginResp) Encode(h *BHS) {
	*h = BHS{}
	h[0] = byte(OpLoginResp)
	h.setBit(1, 0x80, p.Transit)
	h.setBit(1, 0x40, p.Continue)
	h[1] |= (p.CSG&3)<<2 | p.NSG&3
	h[2] = p.VersionMax
	h[3] = p.VersionActive
	copy(h[8:14], p.ISID[:])
	h.put16(14, p.TSIH)
	h.put32(16, p.ITT)
	h.put32(24, p.StatSN)
	h.put32(28, p.ExpCmdSN)
	h.put32(32, p.MaxCmdSN)
	h[36] = p.StatusClass
	h[37] = p.StatusDetail
}

func (p *LoginResp) Decode(h *BHS) error {
	p.Transit = h.Final()
	p.Continue = h.bit(1, 0x40)
	p.CSG = (h[1] >> 2) & 3
	p.NSG = h[1] & 3
	p.VersionMax = h[2]
	p.VersionActive = h[3]
	copy(p.ISID[:], h[8:14])
	p.TSIH = h.u16(14)
	p.ITT = h.ITT()
	p.StatSN = h.u32(24)
	p.ExpCmdSN = h.u32(28)
	p.MaxCmdSN = h.u32(32)
	p.StatusClass = h[36]
	p.StatusDetail = h[37]
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

func (p *LogoutReq) Encode(h *BHS) {
	*h = BHS{}
	h[0] = byte(OpLogoutReq)
	h.setBit(0, 0x40, p.Immediate)
	h[1] = 0x80 | p.Reason&0x7f
	h.put32(16, p.ITT)
	h.put16(20, p.CID)
	h.put32(24, p.CmdSN)
	h.put32(28, p.ExpStatSN)
}

func (p *LogoutReq) Decode(h *BHS) error {
	p.Immediate = h.Immediate()
	p.Reason = h[1] & 0x7f
	p.ITT = h.ITT()
	p.CID = h.u16(20)
	p.CmdSN = h.u32(24)
	p.ExpStatSN = h.u32(28)
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

func (p *LogoutResp) Encode(h *BHS) {
	*h = BHS{}
	h[0] = byte(OpLogoutResp)
	h[1] = 0x80
	h[2] = p.Response
	h.put32(16, p.ITT)
	h.put32(24, p.StatSN)
	h.put32(28, p.ExpCmdSN)
	h.put32(32, p.MaxCmdSN)
	h.put16(40, p.Time2Wait)
	h.put16(42, p.Time2Retain)
}

func (p *LogoutResp) Decode(h *BHS) error {
	p.Response = h[2]
	p.ITT = h.ITT()
	p.StatSN = h.u32(24)
	p.ExpCmdSN = h.u32(28)
	p.MaxCmdSN = h.u32(32)
	p.Time2Wait = h.u16(40)
	p.Time2Retain = h.u16(42)
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

func (p *SNACKReq) Encode(h *BHS) {
	*h = BHS{}
	h[0] = byte(OpSNACKReq)
	h[1] = 0x80 | p.Type&0x0f
	copy(h[8:16], p.LUN[:])
	h.put32(16, p.ITT)
	h.put32(20, p.TTT)
	h.put32(28, p.ExpStatSN)
	h.put32(40, p.BegRun)
	h.put32(44, p.RunLength)
}

func (p *SNACKReq) Decode(h *BHS) error {
	p.Type = h[1] & 0x0f
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.TTT = h.u32(20)
	p.ExpStatSN = h.u32(28)
	p.BegRun = h.u32(40)
	p.RunLength = h.u32(44)
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

func (p *Reject) Encode(h *BHS) {
	*h = BHS{}
	h[0] = byte(OpReject)
	h[1] = 0x80
	h[2] = byte(p.Reason)
	h.put32(16, ReservedITT)
	h.put32(24, p.StatSN)
	h.put32(28, p.ExpCmdSN)
	h.put32(32, p.MaxCmdSN)
	h.put32(36, p.DataSN)
}

func (p *Reject) Decode(h *BHS) error {
	p.Reason = RejectReason(h[2])
	p.StatSN = h.u32(24)
	p.ExpCmdSN = h.u32(28)
	p.MaxCmdSN = h.u32(32)
	p.DataSN = h.u32(36)
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

func (p *NopOut) Encode(h *BHS) {
	*h = BHS{}
	h[0] = byte(OpNopOut)
	h.setBit(0, 0x40, p.Immediate)
	h[1] = 0x80
	copy(h[8:16], p.LUN[:])
	h.put32(16, p.ITT)
	h.put32(20, p.TTT)
	h.put32(24, p.CmdSN)
	h.put32(28, p.ExpStatSN)
}

func (p *NopOut) Decode(h *BHS) error {
	p.Immediate = h.Immediate()
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.TTT = h.u32(20)
	p.CmdSN = h.u32(24)
	p.ExpStatSN = h.u32(28)
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

func (p *NopIn) Encode(h *BHS) {
	*h = BHS{}
	h[0] = byte(OpNopIn)
	h[1] = 0x80
	copy(h[8:16], p.LUN[:])
	h.put32(16, p.ITT)
	h.put32(20, p.TTT)
	h.put32(24, p.StatSN)
	h.put32(28, p.ExpCmdSN)
	h.put32(32, p.MaxCmdSN)
}

func (p *NopIn) Decode(h *BHS) error {
	p.LUN = h.LUN()
	p.ITT = h.ITT()
	p.TTT = h.u32(20)
	p.StatSN = h.u32(24)
	p.ExpCmdSN = h.u32(28)
	p.MaxCmdSN = h.u32(32)
	// ITT and TTT both 0xffffffff is a one-way NOP-In: the target wants
	// no NOP-Out back (RFC 7143 §11.19.1, §11.19.2); tgt sends them.
	return nil
}
