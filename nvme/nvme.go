// Package nvme is the NVMe command set's codec (NVM Express Base
// Specification 2.0, and NVMe over Fabrics 1.1 for the fabrics commands):
// the submission queue entry a command travels in, the completion queue
// entry that answers it, the SGL descriptors fabrics use for data, and
// the opcodes and status values. It does no I/O and keeps no state; a
// fixed-size entry is written in place by Encode and read by Decode.
// Every multi-byte field is little-endian.
package nvme

import (
	"encoding/binary"
	"fmt"
)

// Admin command opcodes (Base 2.0, "Admin Command Set").
const (
	AdminGetLogPage    = 0x02
	AdminIdentify      = 0x06
	AdminAbort         = 0x08
	AdminSetFeatures   = 0x09
	AdminGetFeatures   = 0x0a
	AdminAsyncEventReq = 0x0c
	AdminKeepAlive     = 0x18
	AdminFabrics       = 0x7f // the fabrics commands: FCType says which
	FabricsPropertySet = 0x00
	FabricsConnect     = 0x01
	FabricsPropertyGet = 0x04
	FabricsAuthSend    = 0x05
	FabricsAuthReceive = 0x06
	FabricsDisconnect  = 0x08
)

// NVM command set opcodes (the I/O queues).
const (
	OpFlush        = 0x00
	OpWrite        = 0x01
	OpRead         = 0x02
	OpCompare      = 0x05
	OpWriteZeroes  = 0x08
	OpDatasetMgmt  = 0x09
	OpResvRegister = 0x0d
	OpResvReport   = 0x0e
	OpResvAcquire  = 0x11
	OpResvRelease  = 0x15
)

// Fused operations (FUSE, CDW0 bits 9:8): Compare and Write as one.
const (
	FuseNone   = 0
	FuseFirst  = 1
	FuseSecond = 2
)

// SQELen and CQELen are the sizes of the queue entries.
const (
	SQELen = 64
	CQELen = 16
	SGLLen = 16
)

// SGL descriptor identifiers (type in bits 7:4, subtype in 3:0) NVMe/TCP
// uses: data in the capsule at an offset, or data the transport moves
// (R2T and H2CData, or C2HData).
const (
	SGLDataBlockOffset    = 0x01 // Data Block, subtype Offset: in-capsule data
	SGLTransportDataBlock = 0x5a // Transport SGL Data Block, transport specific
)

// SGL is a scatter gather list descriptor: its address (for in-capsule
// data, the offset into the capsule's data), its length and identifier.
type SGL struct {
	Addr   uint64
	Length uint32
	ID     uint8
}

// Command is a submission queue entry. CDW10 to CDW15 are the
// command-specific dwords; a fabrics command keeps its FCType in byte 4
// (NSID's first byte), which FCType reads.
type Command struct {
	Opcode uint8
	Fuse   uint8
	PSDT   uint8 // 0: PRPs; 1 or 2: SGLs (what fabrics use)
	CID    uint16
	NSID   uint32
	CDW2   uint32
	CDW3   uint32
	MPTR   uint64
	DPTR   SGL
	CDW    [6]uint32 // CDW10..CDW15
}

// Encode writes the entry into b.
func (c *Command) Encode(b *[SQELen]byte) {
	b[0] = c.Opcode
	b[1] = c.Fuse&3 | c.PSDT<<6
	binary.LittleEndian.PutUint16(b[2:], c.CID)
	binary.LittleEndian.PutUint32(b[4:], c.NSID)
	binary.LittleEndian.PutUint32(b[8:], c.CDW2)
	binary.LittleEndian.PutUint32(b[12:], c.CDW3)
	binary.LittleEndian.PutUint64(b[16:], c.MPTR)
	c.DPTR.Encode((*[SGLLen]byte)(b[24:40]))
	for i, dw := range c.CDW {
		binary.LittleEndian.PutUint32(b[40+4*i:], dw)
	}
}

// Decode reads the entry from b. Fields the command does not use are
// the command's handler's to judge; Decode refuses only a FUSE value no
// command may carry.
func (c *Command) Decode(b *[SQELen]byte) error {
	*c = Command{Opcode: b[0], Fuse: b[1] & 3, PSDT: b[1] >> 6, CID: binary.LittleEndian.Uint16(b[2:]),
		NSID: binary.LittleEndian.Uint32(b[4:]), CDW2: binary.LittleEndian.Uint32(b[8:]), CDW3: binary.LittleEndian.Uint32(b[12:]),
		MPTR: binary.LittleEndian.Uint64(b[16:])}
	c.DPTR.Decode((*[SGLLen]byte)(b[24:40]))
	for i := range c.CDW {
		c.CDW[i] = binary.LittleEndian.Uint32(b[40+4*i:])
	}
	if c.Fuse == 3 {
		return fmt.Errorf("nvme: command %#x: FUSE 3 is reserved", c.CID)
	}
	return nil
}

// FCType is a fabrics command's type (byte 4 of the entry).
func (c *Command) FCType() uint8 { return uint8(c.NSID) }

// Encode writes the descriptor into b.
func (s *SGL) Encode(b *[SGLLen]byte) {
	binary.LittleEndian.PutUint64(b[0:], s.Addr)
	binary.LittleEndian.PutUint32(b[8:], s.Length)
	b[12], b[13], b[14] = 0, 0, 0
	b[15] = s.ID
}

// Decode reads the descriptor from b.
func (s *SGL) Decode(b *[SGLLen]byte) {
	*s = SGL{Addr: binary.LittleEndian.Uint64(b[0:]), Length: binary.LittleEndian.Uint32(b[8:]), ID: b[15]}
}

// Status is a completion's status field (CQE bits 31:17 of DW3, here
// shifted down by one): status code (bits 7:0), status code type (10:8),
// command retry delay (12:11), more (13), do not retry (14).
type Status uint16

// Status code types.
const (
	SCTGeneric         = 0
	SCTCommandSpecific = 1
	SCTMedia           = 2
	SCTPath            = 3
)

// dnr is the Do Not Retry bit of a Status.
const dnr = 1 << 14

// MakeStatus is the status of code sc of type sct, with DNR when the
// command would fail the same way again.
func MakeStatus(sct, sc uint8, doNotRetry bool) Status {
	s := Status(sct&7)<<8 | Status(sc)
	if doNotRetry {
		s |= dnr
	}
	return s
}

// SC is the status code.
func (s Status) SC() uint8 { return uint8(s) }

// SCT is the status code type.
func (s Status) SCT() uint8 { return uint8(s>>8) & 7 }

// DNR reports whether the host should not retry the command.
func (s Status) DNR() bool { return s&dnr != 0 }

// Statuses: generic (SCT 0), command specific (SCT 1: the Connect
// command's refusals, log pages, limits), media and data integrity (SCT 2).
const (
	StatusSuccess             Status = 0x00
	StatusInvalidOpcode       Status = dnr | 0x01
	StatusInvalidField        Status = dnr | 0x02
	StatusCIDConflict         Status = dnr | 0x03
	StatusDataTransferError   Status = 0x04
	StatusInternalError       Status = 0x06
	StatusAbortRequested      Status = 0x07
	StatusFusedFailed         Status = 0x09
	StatusFusedMissing        Status = dnr | 0x0a
	StatusInvalidNamespace    Status = dnr | 0x0b
	StatusCommandSequence     Status = dnr | 0x0c
	StatusSGLInvalidType      Status = dnr | 0x11
	StatusKeepAliveExpired    Status = dnr | 0x19
	StatusLBAOutOfRange       Status = dnr | 0x80
	StatusCapacityExceeded    Status = dnr | 0x81
	StatusNamespaceNotReady   Status = 0x82
	StatusReservationConflict Status = dnr | 0x83

	StatusAbortCommandLimit   Status = SCTCommandSpecific<<8 | 0x03
	StatusAsyncEventLimit     Status = SCTCommandSpecific<<8 | 0x05
	StatusInvalidLogPage      Status = dnr | SCTCommandSpecific<<8 | 0x09
	StatusConnectIncompatible Status = dnr | SCTCommandSpecific<<8 | 0x80
	StatusConnectBusy         Status = SCTCommandSpecific<<8 | 0x81
	StatusConnectInvalidParam Status = dnr | SCTCommandSpecific<<8 | 0x82
	StatusConnectInvalidHost  Status = dnr | SCTCommandSpecific<<8 | 0x84

	StatusCompareFailure Status = dnr | SCTMedia<<8 | 0x85
	StatusAccessDenied   Status = dnr | SCTMedia<<8 | 0x86
)

// statusNames names the statuses a host most often meets, by SCT<<8|SC.
var statusNames = map[uint16]string{
	0x001: "Invalid Command Opcode", 0x002: "Invalid Field in Command", 0x006: "Internal Error",
	0x00b: "Invalid Namespace or Format", 0x00c: "Command Sequence Error", 0x018: "Host Identifier Inconsistent Format",
	0x080: "LBA Out of Range", 0x082: "Namespace Not Ready", 0x083: "Reservation Conflict",
	0x280: "Write Fault", 0x281: "Unrecovered Read Error", 0x285: "Compare Failure", 0x286: "Access Denied",
	0x301: "Asymmetric Access Persistent Loss", 0x302: "Asymmetric Access Inaccessible", 0x303: "Asymmetric Access Transition",
}

func (s Status) String() string {
	str := fmt.Sprintf("status %#x/%#02x (SCT/SC)", s.SCT(), s.SC())
	if name, ok := statusNames[uint16(s.SCT())<<8|uint16(s.SC())]; ok {
		str = name + ", " + str
	}
	if s.DNR() {
		str += ", do not retry"
	}
	return str
}

// Completion is a completion queue entry: the command-specific result
// (DW0, DW1), the submission queue head and ID, the command's CID, its
// status and the phase tag.
type Completion struct {
	DW0, DW1 uint32
	SQHD     uint16
	SQID     uint16
	CID      uint16
	Status   Status
	Phase    bool
}

// Encode writes the entry into b.
func (c *Completion) Encode(b *[CQELen]byte) {
	binary.LittleEndian.PutUint32(b[0:], c.DW0)
	binary.LittleEndian.PutUint32(b[4:], c.DW1)
	binary.LittleEndian.PutUint16(b[8:], c.SQHD)
	binary.LittleEndian.PutUint16(b[10:], c.SQID)
	binary.LittleEndian.PutUint16(b[12:], c.CID)
	sf := uint16(c.Status&0x7fff) << 1
	if c.Phase {
		sf |= 1
	}
	binary.LittleEndian.PutUint16(b[14:], sf)
}

// Decode reads the entry from b.
func (c *Completion) Decode(b *[CQELen]byte) {
	sf := binary.LittleEndian.Uint16(b[14:])
	*c = Completion{DW0: binary.LittleEndian.Uint32(b[0:]), DW1: binary.LittleEndian.Uint32(b[4:]),
		SQHD: binary.LittleEndian.Uint16(b[8:]), SQID: binary.LittleEndian.Uint16(b[10:]), CID: binary.LittleEndian.Uint16(b[12:]),
		Status: Status(sf >> 1), Phase: sf&1 != 0}
}
