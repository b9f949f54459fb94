// Package srp is the SCSI RDMA Protocol codec: every information unit
// (IU) of T10 SRP (revision 16a) and the SRP-2 immediate-data additions,
// in the layouts Linux's ib_srp and ib_srpt put on the wire (see
// shared/spec/wire-facts.md §4), plus the 56-byte login form that rides
// in RDMA/CM private data. It does no I/O: decoders read byte slices and
// never retain or copy them (CDBs, descriptor lists and immediate data
// alias the IU), encoders append to a caller's slice.
//
// Transport rules (the SRP InfiniBand annex, SRP over InfiniBand, Annex A): the target
// only receives Sends; the initiator's memory is reached by RDMA Read
// (data-out) and RDMA Write (data-in) through the descriptors in SRP_CMD.
package srp

import (
	"encoding/binary"
	"fmt"
)

// Opcode is an IU type (byte 0 of every IU).
type Opcode uint8

// IU types.
const (
	OpLoginReq Opcode = 0x00
	OpTskMgmt  Opcode = 0x01
	OpCmd      Opcode = 0x02
	OpILogout  Opcode = 0x03
	OpCredRsp  Opcode = 0x41
	OpAerRsp   Opcode = 0x42
	OpTLogout  Opcode = 0x80
	OpCredReq  Opcode = 0x81
	OpAerReq   Opcode = 0x82
	OpLoginRsp Opcode = 0xC0
	OpRsp      Opcode = 0xC1
	OpLoginRej Opcode = 0xC2
)

func (o Opcode) String() string {
	switch o {
	case OpLoginReq:
		return "SRP_LOGIN_REQ"
	case OpTskMgmt:
		return "SRP_TSK_MGMT"
	case OpCmd:
		return "SRP_CMD"
	case OpILogout:
		return "SRP_I_LOGOUT"
	case OpCredRsp:
		return "SRP_CRED_RSP"
	case OpAerRsp:
		return "SRP_AER_RSP"
	case OpTLogout:
		return "SRP_T_LOGOUT"
	case OpCredReq:
		return "SRP_CRED_REQ"
	case OpAerReq:
		return "SRP_AER_REQ"
	case OpLoginRsp:
		return "SRP_LOGIN_RSP"
	case OpRsp:
		return "SRP_RSP"
	case OpLoginRej:
		return "SRP_LOGIN_REJ"
	}
	return fmt.Sprintf("IU type %#02x", uint8(o))
}

// IU lengths (fixed parts).
const (
	LoginReqLen   = 64
	LoginReqCMLen = 56 // srp_login_req_rdma: what fits in IB RDMA/CM private data (92 − 36)
	LoginRspLen   = 52
	LoginRejLen   = 32
	ILogoutLen    = 16
	TLogoutLen    = 16
	TskMgmtLen    = 48
	CmdLen        = 48 // without additional CDB and descriptors
	RspLen        = 36 // without response and sense data
	CredReqLen    = 16
	CredRspLen    = 16
	AerReqLen     = 36 // without sense data
	AerRspLen     = 16
	DirectLen     = 16 // a direct data buffer descriptor
	IndirectLen   = 20 // an indirect descriptor's header (table descriptor + total length)
	ImmediateLen  = 4  // an immediate-data descriptor (SRP-2): the length
	// MinITIULen is the smallest I→T IU length a login may ask for: an
	// SRP_CMD with one direct descriptor needs 64 bytes.
	MinITIULen = 64
)

// Supported/required buffer formats (login REQUIRED BUFFER FORMATS and
// SUPPORTED BUFFER FORMATS).
const (
	BufDirect    uint16 = 1 << 1
	BufIndirect  uint16 = 1 << 2
	BufImmediate uint16 = 1 << 3 // SRP-2
)

// Data buffer descriptor formats (SRP_CMD byte 5, one nibble each way).
const (
	FmtNone      uint8 = 0
	FmtDirect    uint8 = 1
	FmtIndirect  uint8 = 2
	FmtImmediate uint8 = 3 // SRP-2, data-out only
)

// Login flags.
const (
	multiChanMask      = 0x03
	flagImmRequested   = 0x80
	MultiChannelSingle = 0 // log out the nexus's other channels
	MultiChannelMulti  = 1 // keep them
)

// LoginRsp multi-channel results.
const (
	MultiChanNoExisting = 0
	MultiChanTerminated = 1
	MultiChanMaintained = 2
)

// RejectReason is an SRP_LOGIN_REJ reason.
type RejectReason uint32

const (
	RejectUnable       RejectReason = 0x00010000 // unable to establish RDMA channel, no reason specified
	RejectResources    RejectReason = 0x00010001 // insufficient RDMA channel resources
	RejectITIULen      RejectReason = 0x00010002 // requested maximum I→T IU length too large
	RejectAssociate    RejectReason = 0x00010003 // unable to associate RDMA channel with I_T nexus
	RejectBufferFormat RejectReason = 0x00010004 // requested buffer descriptor format not supported
	RejectMultiChannel RejectReason = 0x00010005 // multiple RDMA channels not supported
	RejectChannelLimit RejectReason = 0x00010006 // RDMA channel limit reached
)

func (r RejectReason) String() string {
	switch r {
	case RejectUnable:
		return "unable to establish RDMA channel"
	case RejectResources:
		return "insufficient RDMA channel resources"
	case RejectITIULen:
		return "requested maximum initiator-to-target IU length too large"
	case RejectAssociate:
		return "unable to associate RDMA channel with I_T nexus"
	case RejectBufferFormat:
		return "requested buffer descriptor format not supported"
	case RejectMultiChannel:
		return "multiple RDMA channels not supported"
	case RejectChannelLimit:
		return "RDMA channel limit reached"
	}
	return fmt.Sprintf("login reject reason %#08x", uint32(r))
}

// LogoutReason is an SRP_T_LOGOUT reason.
type LogoutReason uint32

const (
	LogoutNoReason         LogoutReason = 0
	LogoutInactive         LogoutReason = 1 // inactive RDMA channel (reclaiming resources)
	LogoutInvalidIUType    LogoutReason = 2
	LogoutSpuriousResponse LogoutReason = 3 // initiator sent a response with no request
	LogoutMultiChannel     LogoutReason = 4 // disconnected by a new login's MULTI-CHANNEL ACTION
	LogoutDataOutFormat    LogoutReason = 5 // unsupported data-out descriptor format
	LogoutDataInFormat     LogoutReason = 6 // unsupported data-in descriptor format
	LogoutInvalidIULength  LogoutReason = 8
)

func (r LogoutReason) String() string {
	switch r {
	case LogoutNoReason:
		return "no reason specified"
	case LogoutInactive:
		return "inactive RDMA channel"
	case LogoutInvalidIUType:
		return "invalid IU type"
	case LogoutSpuriousResponse:
		return "response with no corresponding request"
	case LogoutMultiChannel:
		return "multi-channel action of a new login"
	case LogoutDataOutFormat:
		return "unsupported data-out buffer descriptor format"
	case LogoutDataInFormat:
		return "unsupported data-in buffer descriptor format"
	case LogoutInvalidIULength:
		return "invalid IU length for the IU type"
	}
	return fmt.Sprintf("logout reason %#x", uint32(r))
}

// TMF is an SRP_TSK_MGMT function.
type TMF uint8

const (
	TMFAbortTask    TMF = 0x01
	TMFAbortTaskSet TMF = 0x02
	TMFClearTaskSet TMF = 0x04
	TMFLUNReset     TMF = 0x08
	TMFClearACA     TMF = 0x40
)

// TMF response codes (the last byte of the 4-byte response data, SAM).
const (
	TMFComplete     = 0x00
	TMFNotSupported = 0x04
	TMFFailed       = 0x05
	TMFSucceeded    = 0x08
	TMFIncorrectLUN = 0x09
)

// SRP_RSP flags.
const (
	RspValid     = 0x01 // response data present
	SenseValid   = 0x02
	DataOutOver  = 0x04
	DataOutUnder = 0x08
	DataInOver   = 0x10
	DataInUnder  = 0x20
)

// Solicited-notification bits of SRP_CMD and SRP_TSK_MGMT byte 1.
const (
	SolSuccess = 0x02 // SCSOLNT: solicited event on successful completion
	SolFailure = 0x04 // UCSOLNT: on unsuccessful completion
)

// Error is a malformed IU: what the target answers with (an SRP_T_LOGOUT
// reason) and why.
type Error struct {
	Op     Opcode
	Logout LogoutReason
	Msg    string
}

func (e *Error) Error() string { return fmt.Sprintf("srp: %v: %s", e.Op, e.Msg) }

func errf(op Opcode, r LogoutReason, format string, a ...any) *Error {
	return &Error{Op: op, Logout: r, Msg: fmt.Sprintf(format, a...)}
}

var be = binary.BigEndian

// Op returns the IU type of b (0 for an empty slice).
func Op(b []byte) Opcode {
	if len(b) == 0 {
		return 0
	}
	return Opcode(b[0])
}

// Tag returns the tag of IU b (bytes 8–15, opaque: echoed as received).
func Tag(b []byte) uint64 {
	if len(b) < 16 {
		return 0
	}
	return be.Uint64(b[8:])
}

func need(op Opcode, b []byte, n int) error {
	if len(b) < n {
		return errf(op, LogoutInvalidIULength, "%d bytes, at least %d", len(b), n)
	}
	if Opcode(b[0]) != op {
		return errf(op, LogoutInvalidIUType, "IU type %#02x", b[0])
	}
	return nil
}

func grow(b []byte, n int) ([]byte, []byte) {
	l := len(b)
	b = append(b, make([]byte, n)...)
	return b, b[l:]
}
