// Package pdu is the iSCSI PDU codec of RFC 7143 §11: the 48-byte Basic
// Header Segment with typed views for every opcode in both directions,
// Additional Header Segments, data-segment padding and CRC32C digests. It
// does no I/O: framing on a byte stream belongs to the TCP datamover.
package pdu

import (
	"encoding/binary"
	"fmt"
)

// BHSLen is the size of the Basic Header Segment (RFC 7143 §11.2.1).
const BHSLen = 48

// Opcode is the 6-bit iSCSI opcode (RFC 7143 §11.2.1.2).
type Opcode byte

// Initiator opcodes.
const (
	OpNopOut      Opcode = 0x00
	OpSCSICommand Opcode = 0x01
	OpTaskMgmtReq Opcode = 0x02
	OpLoginReq    Opcode = 0x03
	OpTextReq     Opcode = 0x04
	OpDataOut     Opcode = 0x05
	OpLogoutReq   Opcode = 0x06
	OpSNACKReq    Opcode = 0x10
)

// Target opcodes.
const (
	OpNopIn        Opcode = 0x20
	OpSCSIResponse Opcode = 0x21
	OpTaskMgmtResp Opcode = 0x22
	OpLoginResp    Opcode = 0x23
	OpTextResp     Opcode = 0x24
	OpDataIn       Opcode = 0x25
	OpLogoutResp   Opcode = 0x26
	OpR2T          Opcode = 0x31
	OpAsyncMsg     Opcode = 0x32
	OpReject       Opcode = 0x3f
)

func (o Opcode) name() string {
	switch o {
	case OpNopOut:
		return "NOP-Out"
	case OpSCSICommand:
		return "SCSI Command"
	case OpTaskMgmtReq:
		return "Task Management Request"
	case OpLoginReq:
		return "Login Request"
	case OpTextReq:
		return "Text Request"
	case OpDataOut:
		return "SCSI Data-Out"
	case OpLogoutReq:
		return "Logout Request"
	case OpSNACKReq:
		return "SNACK Request"
	case OpNopIn:
		return "NOP-In"
	case OpSCSIResponse:
		return "SCSI Response"
	case OpTaskMgmtResp:
		return "Task Management Response"
	case OpLoginResp:
		return "Login Response"
	case OpTextResp:
		return "Text Response"
	case OpDataIn:
		return "SCSI Data-In"
	case OpLogoutResp:
		return "Logout Response"
	case OpR2T:
		return "R2T"
	case OpAsyncMsg:
		return "Asynchronous Message"
	case OpReject:
		return "Reject"
	}
	return ""
}

// String is the opcode's name in RFC 7143 (§11.2.1.2), or its number.
func (o Opcode) String() string {
	if n := o.name(); n != "" {
		return n
	}
	return fmt.Sprintf("opcode %#02x", byte(o))
}

// Known reports whether o is an opcode RFC 7143 defines.
func (o Opcode) Known() bool { return o.name() != "" }

// FromInitiator reports whether o is sent by initiators.
func (o Opcode) FromInitiator() bool { return o < 0x20 }

// BHS is a raw Basic Header Segment with accessors for the fields every
// opcode shares.
type BHS [BHSLen]byte

// Opcode returns the opcode.
func (h *BHS) Opcode() Opcode { return Opcode(h[OffOpcode] & 0x3f) }

// Immediate reports the I bit (initiator PDUs).
func (h *BHS) Immediate() bool { return h[OffOpcode]&0x40 != 0 }

// Final reports the F bit (byte 1 bit 7).
func (h *BHS) Final() bool { return h[OffFlags]&0x80 != 0 }

// TotalAHSLength returns the AHS length in bytes.
func (h *BHS) TotalAHSLength() int { return int(h[OffAHSLength]) * 4 }

// DataSegmentLength returns the data segment length in bytes, without
// padding.
func (h *BHS) DataSegmentLength() int {
	d := h[OffDataLength : OffDataLength+3]
	return int(d[0])<<16 | int(d[1])<<8 | int(d[2])
}

// SetDataSegmentLength sets the 24-bit data segment length.
func (h *BHS) SetDataSegmentLength(n int) {
	d := h[OffDataLength : OffDataLength+3]
	d[0], d[1], d[2] = byte(n>>16), byte(n>>8), byte(n)
}

// SetTotalAHSLength sets the AHS length, which must be a multiple of 4.
func (h *BHS) SetTotalAHSLength(n int) { h[OffAHSLength] = byte(n / 4) }

// ITT returns the Initiator Task Tag (bytes 16-19).
func (h *BHS) ITT() uint32 { return h.u32(OffITT) }

// LUN returns bytes 8-15.
func (h *BHS) LUN() [8]byte { return [8]byte(h[OffLUN : OffLUN+8]) }

// The places of the fields many opcodes share (RFC 7143 §11.2 and each
// PDU's layout in §11.3–§11.18). The typed PDUs (Decode, Encode) use them;
// the accessors below are for code that routes a PDU without decoding it
// (a datamover counting unexpected PDUs, an initiator noting sequence
// numbers).
const (
	OffFlags        = 1  // F and the opcode-specific flags
	OffResponse     = 2  // Response, Reject reason, TMF function/response
	OffAHSLength    = 4  // TotalAHSLength, in 4-byte words
	OffDataLength   = 5  // DataSegmentLength, 24 bits
	OffLUN          = 8  // LUN, or opcode-specific
	OffITT          = 16 // Initiator Task Tag
	OffTTT          = 20 // Target Transfer Tag (NOP, Text, Data, R2T, SNACK)
	OffCmdSN        = 24 // CmdSN of initiator PDUs
	OffStatSN       = 24 // StatSN of target PDUs
	OffExpStatSN    = 28 // ExpStatSN of initiator PDUs
	OffExpCmdSN     = 28 // ExpCmdSN of target PDUs
	OffMaxCmdSN     = 32 // MaxCmdSN of target PDUs
	OffBufferOffset = 40 // Buffer Offset of Data-In, Data-Out, R2T; BegRun of SNACK
)

// The places of the fields of one or a few opcodes (RFC 7143 §11.3–§11.18).
const (
	OffOpcode        = 0  // the I bit and the opcode
	OffStatus        = 3  // SCSI status (SCSI Response, Data-In with S)
	OffVersionMax    = 2  // Login Request and Response (§11.12.4, §11.13.3)
	OffVersionMin    = 3  // Login Request: Version-min; Login Response: Version-active
	OffISID          = 8  // Login: ISID, 6 bytes
	OffTSIH          = 14 // Login: TSIH, 2 bytes
	OffEDTL          = 20 // SCSI Command: Expected Data Transfer Length
	OffSNACKTag      = 20 // SCSI Response: SNACK Tag
	OffRTT           = 20 // Task Management Request: Referenced Task Tag
	OffCID           = 20 // Login and Logout Request: CID, 2 bytes
	OffCDB           = 32 // SCSI Command: the CDB, 16 bytes
	OffRefCmdSN      = 32 // Task Management Request: RefCmdSN
	OffDataSN        = 36 // Data-In, Data-Out: DataSN
	OffR2TSN         = 36 // R2T: R2TSN
	OffExpDataSN     = 36 // SCSI Response, Task Management Request: ExpDataSN
	OffAsyncEvent    = 36 // Asynchronous Message: AsyncEvent
	OffAsyncVCode    = 37 // Asynchronous Message: AsyncVCode
	OffStatusClass   = 36 // Login Response: Status-Class
	OffStatusDetail  = 37 // Login Response: Status-Detail
	OffParameter1    = 38 // Asynchronous Message: Parameter1, 2 bytes
	OffParameter2    = 40 // Asynchronous Message: Parameter2, 2 bytes
	OffParameter3    = 42 // Asynchronous Message: Parameter3, 2 bytes
	OffTime2Wait     = 40 // Logout Response: Time2Wait, 2 bytes
	OffTime2Retain   = 42 // Logout Response: Time2Retain, 2 bytes
	OffBidiResidual  = 40 // SCSI Response: Bidirectional Read Residual Count
	OffBegRun        = 40 // SNACK Request: BegRun
	OffResidual      = 44 // SCSI Response, Data-In: Residual Count
	OffDesiredLength = 44 // R2T: Desired Data Transfer Length
	OffRunLength     = 44 // SNACK Request: RunLength
)

// putSNs writes a target PDU's StatSN, ExpCmdSN and MaxCmdSN (RFC 7143
// §11.2: every target PDU that carries them, at the same places).
func (h *BHS) putSNs(statSN, expCmdSN, maxCmdSN uint32) {
	h.put32(OffStatSN, statSN)
	h.put32(OffExpCmdSN, expCmdSN)
	h.put32(OffMaxCmdSN, maxCmdSN)
}

// sns reads what putSNs writes.
func (h *BHS) sns() (statSN, expCmdSN, maxCmdSN uint32) {
	return h.u32(OffStatSN), h.u32(OffExpCmdSN), h.u32(OffMaxCmdSN)
}

// SetImmediate sets or clears the I bit (initiator PDUs).
func (h *BHS) SetImmediate(on bool) {
	if on {
		h[OffOpcode] |= 0x40
	} else {
		h[OffOpcode] &^= 0x40
	}
}

// Response returns byte 2: a response code, a Reject's reason, a SCSI
// Response's or TMF Response's response.
func (h *BHS) Response() byte { return h[OffResponse] }

// TTT returns the Target Transfer Tag (bytes 20-23 of the PDUs that have
// one).
func (h *BHS) TTT() uint32 { return h.u32(OffTTT) }

// CmdSN returns the CmdSN of an initiator PDU.
func (h *BHS) CmdSN() uint32 { return h.u32(OffCmdSN) }

// SetCmdSN sets the CmdSN of an initiator PDU.
func (h *BHS) SetCmdSN(v uint32) { h.put32(OffCmdSN, v) }

// ExpStatSN returns the ExpStatSN of an initiator PDU.
func (h *BHS) ExpStatSN() uint32 { return h.u32(OffExpStatSN) }

// SetExpStatSN sets the ExpStatSN of an initiator PDU.
func (h *BHS) SetExpStatSN(v uint32) { h.put32(OffExpStatSN, v) }

// StatSN returns the StatSN of a target PDU.
func (h *BHS) StatSN() uint32 { return h.u32(OffStatSN) }

// SetStatSN sets the StatSN of a target PDU.
func (h *BHS) SetStatSN(v uint32) { h.put32(OffStatSN, v) }

// ExpCmdSN returns the ExpCmdSN of a target PDU.
func (h *BHS) ExpCmdSN() uint32 { return h.u32(OffExpCmdSN) }

// MaxCmdSN returns the MaxCmdSN of a target PDU.
func (h *BHS) MaxCmdSN() uint32 { return h.u32(OffMaxCmdSN) }

// BufferOffset returns bytes 40-43: the Buffer Offset of Data-In,
// Data-Out and R2T, the BegRun of a SNACK.
func (h *BHS) BufferOffset() uint32 { return h.u32(OffBufferOffset) }

// DataInStatus reports the S bit of a Data-In (byte 1 bit 0): the PDU
// carries the command's status and a StatSN (RFC 7143 §11.7.1).
func (h *BHS) DataInStatus() bool { return h.Opcode() == OpDataIn && h[OffFlags]&0x01 != 0 }

// SNACKType returns the Type of a SNACK Request (byte 1, low 4 bits).
func (h *BHS) SNACKType() byte { return h[OffFlags] & 0x0f }

func (h *BHS) u32(off int) uint32              { return binary.BigEndian.Uint32(h[off:]) }
func (h *BHS) put32(off int, v uint32)         { binary.BigEndian.PutUint32(h[off:], v) }
func (h *BHS) u16(off int) uint16              { return binary.BigEndian.Uint16(h[off:]) }
func (h *BHS) put16(off int, v uint16)         { binary.BigEndian.PutUint16(h[off:], v) }
func (h *BHS) bit(byteOff int, mask byte) bool { return h[byteOff]&mask != 0 }
func (h *BHS) setBit(byteOff int, mask byte, on bool) {
	if on {
		h[byteOff] |= mask
	}
}

// Pad returns the number of pad bytes after a data segment of n bytes
// (RFC 7143 §11.2.3: padded to a multiple of 4).
func Pad(n int) int { return (4 - n&3) & 3 }

// PaddedLen returns n rounded up to a multiple of 4.
func PaddedLen(n int) int { return n + Pad(n) }

// ReservedITT is the ITT value 0xffffffff, reserved for PDUs not tied to a
// task (RFC 7143 §11.2.1.8).
const ReservedITT = 0xffffffff

// ReservedTTT is the TTT value meaning "no transfer tag".
const ReservedTTT = 0xffffffff
