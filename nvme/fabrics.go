package nvme

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// Connect is the fabrics Connect command (NVMe over Fabrics 1.1, “Connect
// Command and Response”): the queue it creates (QID 0: the admin queue),
// that queue's size (SQSIZE, 0's based), the keep alive timeout the host
// asks for (KATO, in milliseconds; admin queue only) and, in its data, who
// connects to what.
type Connect struct {
	RecFmt uint16 // record format: 0
	QID    uint16
	SQSize uint16 // entries less one
	CAttr  uint8
	KATO   uint32
	Data   ConnectData
}

// ConnectDataLen is the size of the Connect command's data.
const ConnectDataLen = 1024

// NQNLen is the room an NVMe Qualified Name has in a fabrics structure.
const NQNLen = 256

// ConnectData is the Connect command's data: the host's identifier, the
// controller it asks for on an I/O queue (or 0xffff on the admin queue of
// the dynamic controller model: any), the subsystem and host NQNs.
type ConnectData struct {
	HostID  [16]byte
	CNTLID  uint16
	SubNQN  string
	HostNQN string
}

// DecodeConnect reads a Connect command from its entry and data.
func DecodeConnect(c *Command, data []byte) (Connect, error) {
	if c.Opcode != AdminFabrics || c.FCType() != FabricsConnect {
		return Connect{}, fmt.Errorf("nvme: opcode %#x/%#x is not Connect", c.Opcode, c.FCType())
	}
	k := Connect{RecFmt: uint16(c.CDW[0]), QID: uint16(c.CDW[0] >> 16), SQSize: uint16(c.CDW[1]), CAttr: uint8(c.CDW[1] >> 16), KATO: c.CDW[2]}
	if len(data) < ConnectDataLen {
		return k, fmt.Errorf("nvme: Connect data of %d bytes, not %d", len(data), ConnectDataLen)
	}
	copy(k.Data.HostID[:], data[0:16])
	k.Data.CNTLID = binary.LittleEndian.Uint16(data[16:])
	var err error
	if k.Data.SubNQN, err = nqn(data[256 : 256+NQNLen]); err != nil {
		return k, fmt.Errorf("nvme: Connect SUBNQN: %w", err)
	}
	// An empty HOSTNQN is accepted (SPDK's spdk_nvme_perf sends one
	// unless told a name; Linux nvmet and SPDK's target take it): a host
	// without a name, which no access list names.
	if k.Data.HostNQN, err = nqn(data[512 : 512+NQNLen]); err != nil && data[512] != 0 {
		return k, fmt.Errorf("nvme: Connect HOSTNQN: %w", err)
	}
	return k, nil
}

// Encode writes the Connect command into c (CID and DPTR are the
// caller's) and its data into data[:ConnectDataLen].
func (k *Connect) Encode(c *Command, data []byte) {
	c.Opcode, c.NSID = AdminFabrics, FabricsConnect
	c.CDW = [6]uint32{uint32(k.QID)<<16 | uint32(k.RecFmt), uint32(k.CAttr)<<16 | uint32(k.SQSize), k.KATO}
	d := data[:ConnectDataLen]
	clear(d)
	copy(d[0:16], k.Data.HostID[:])
	binary.LittleEndian.PutUint16(d[16:], k.Data.CNTLID)
	copy(d[256:256+NQNLen-1], k.Data.SubNQN)
	copy(d[512:512+NQNLen-1], k.Data.HostNQN)
}

// nqn reads a NUL-terminated NQN from its field.
func nqn(b []byte) (string, error) {
	n := bytes.IndexByte(b, 0)
	if n < 0 {
		return "", errors.New("not NUL-terminated")
	}
	if n == 0 {
		return "", errors.New("empty")
	}
	return string(b[:n]), nil
}

// Controller properties a host reads and writes with Property Get and Set
// (the registers of a PCIe controller, by offset).
const (
	PropCAP  = 0x00 // Controller Capabilities, 8 bytes
	PropVS   = 0x08 // Version
	PropCC   = 0x14 // Controller Configuration
	PropCSTS = 0x1c // Controller Status
	PropNSSR = 0x20 // NVM Subsystem Reset
)

// Property is a Property Get or Set command: the property's offset, its
// size (4 or 8 bytes) and, for Set, the value.
type Property struct {
	Set    bool
	Size   int // 4 or 8
	Offset uint32
	Value  uint64
}

// DecodeProperty reads a Property Get or Set command.
func DecodeProperty(c *Command) (Property, error) {
	if c.Opcode != AdminFabrics || (c.FCType() != FabricsPropertyGet && c.FCType() != FabricsPropertySet) {
		return Property{}, fmt.Errorf("nvme: opcode %#x/%#x is not Property Get or Set", c.Opcode, c.FCType())
	}
	p := Property{Set: c.FCType() == FabricsPropertySet, Size: 4, Offset: c.CDW[1]}
	switch c.CDW[0] & 7 {
	case 0:
	case 1:
		p.Size = 8
	default:
		return p, fmt.Errorf("nvme: property size code %d (0: 4 bytes, 1: 8)", c.CDW[0]&7)
	}
	if p.Set {
		p.Value = uint64(c.CDW[2]) | uint64(c.CDW[3])<<32
		if p.Size == 4 {
			p.Value &= 0xffffffff
		}
	}
	return p, nil
}

// Encode writes the command into c (CID is the caller's).
func (p *Property) Encode(c *Command) {
	c.Opcode, c.NSID = AdminFabrics, FabricsPropertyGet
	if p.Set {
		c.NSID = FabricsPropertySet
	}
	var size uint32
	if p.Size == 8 {
		size = 1
	}
	c.CDW = [6]uint32{size, p.Offset, uint32(p.Value), uint32(p.Value >> 32)}
}

// CAP builds the Controller Capabilities property: the largest queue
// (mqes entries less one), the time a host waits for readiness (to, in
// 500 ms units), the NVM command set supported, 4 KiB memory pages.
func CAP(mqes uint16, to uint8) uint64 {
	const nvmCommandSet = 1 << 37
	return uint64(mqes) | 1<<16 /* CQR: contiguous queues */ | uint64(to)<<24 | nvmCommandSet
}

// Controller Configuration (CC) and Status (CSTS) fields.
const (
	CCEnable       = 1 << 0
	CCShutdownMask = 3 << 14 // SHN: 01 normal, 10 abrupt
	CSTSReady      = 1 << 0
	CSTSFatal      = 1 << 1
	CSTSShutdown   = 2 << 2 // SHST 10b: shutdown processing complete
)

// Version is the VS property of an NVMe version major.minor.
func Version(major, minor uint8) uint32 { return uint32(major)<<16 | uint32(minor)<<8 }
