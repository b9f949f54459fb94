package srp

import "errors"

// Desc is a direct data buffer descriptor: a piece of initiator memory
// (virtual address, memory key — R_Key on InfiniBand, STag on iWARP —
// and length).
type Desc struct {
	VA  uint64
	Key uint32
	Len uint32
}

func putDesc(p []byte, d Desc) {
	be.PutUint64(p, d.VA)
	be.PutUint32(p[8:], d.Key)
	be.PutUint32(p[12:], d.Len)
}

// DescAt reads descriptor i of a descriptor list (16 bytes each): an
// indirect table fetched from initiator memory, for one. The caller
// checks that the list holds i+1 descriptors.
func DescAt(list []byte, i int) Desc {
	p := list[i*DirectLen:]
	return Desc{VA: be.Uint64(p), Key: be.Uint32(p[8:]), Len: be.Uint32(p[12:])}
}

// Buffer is one direction's data buffer in SRP_CMD.
type Buffer struct {
	Format uint8 // FmtNone, FmtDirect, FmtIndirect or FmtImmediate
	// Indirect only: where the whole descriptor list lives in initiator
	// memory (Table.Len/16 descriptors).
	Table Desc
	// Total is the data length: the direct descriptor's length, the
	// indirect TOTAL LENGTH, or the immediate data's length.
	Total  uint32
	list   []byte // indirect: descriptors present in the IU
	direct Desc   // direct: the descriptor
	count  int    // descriptors in the whole list
	// Imm is the immediate data (aliases the IU).
	Imm []byte
}

// Direct describes a buffer with one direct descriptor.
func Direct(d Desc) Buffer {
	return Buffer{Format: FmtDirect, Total: d.Len, direct: d, count: 1}
}

// Indirect describes a buffer with an indirect descriptor carrying descs
// in the IU; table is where the whole list lives in initiator memory.
// When table.Len covers more descriptors than descs, the list is external
// and the caller sets Total; a zero table.Len means descs is the list.
func Indirect(table Desc, descs []Desc) Buffer {
	list := make([]byte, len(descs)*DirectLen)
	var total uint32
	for i, d := range descs {
		putDesc(list[i*DirectLen:], d)
		total += d.Len
	}
	if table.Len == 0 {
		table.Len = uint32(len(list))
	}
	return Buffer{Format: FmtIndirect, Table: table, Total: total, list: list, count: max(len(descs), int(table.Len/DirectLen))}
}

// Immediate describes data-out carried in the SRP_CMD itself (SRP-2).
func Immediate(data []byte) Buffer {
	return Buffer{Format: FmtImmediate, Total: uint32(len(data)), Imm: data}
}

// Count is the number of descriptors in the whole list (1 for direct).
func (b *Buffer) Count() int { return b.count }

// InIU is the number of descriptors the IU carries.
func (b *Buffer) InIU() int {
	if b.Format == FmtDirect {
		return 1
	}
	return len(b.list) / DirectLen
}

// External reports an indirect buffer whose list is only partly in the
// IU: the rest must be fetched from Table by RDMA Read.
func (b *Buffer) External() bool { return b.InIU() < b.count }

// Desc returns descriptor i of those in the IU.
func (b *Buffer) Desc(i int) Desc {
	if b.Format == FmtDirect {
		return b.direct
	}
	return DescAt(b.list, i)
}

// size is the buffer's descriptor bytes in the IU.
func (b *Buffer) size() int {
	switch b.Format {
	case FmtDirect:
		return DirectLen
	case FmtIndirect:
		return IndirectLen + len(b.list)
	case FmtImmediate:
		return ImmediateLen
	}
	return 0
}

func (b *Buffer) put(p []byte) {
	switch b.Format {
	case FmtDirect:
		putDesc(p, b.direct)
	case FmtIndirect:
		putDesc(p, b.Table)
		be.PutUint32(p[16:], b.Total)
		copy(p[IndirectLen:], b.list)
	case FmtImmediate:
		be.PutUint32(p, b.Total)
	}
}

// Cmd is SRP_CMD.
type Cmd struct {
	SolNT    uint8 // SolSuccess, SolFailure
	Tag      uint64
	LUN      uint64
	TaskAttr uint8 // 0 SIMPLE, 1 HEAD OF QUEUE, 2 ORDERED, 4 ACA
	// CDB is the 16-byte CDB field followed by the additional CDB
	// (aliases the IU on decode). Append pads a shorter CDB to 16 bytes.
	CDB     []byte
	Out, In Buffer
}

// ErrImmediateOffset is returned by Append when the descriptors reach
// past the immediate-data offset agreed at login.
var ErrImmediateOffset = errors.New("srp: descriptors overlap the immediate data offset")

// Append appends the IU. immOffset is the login's IMMEDIATE DATA OFFSET,
// used when Out is immediate.
func (c *Cmd) Append(b []byte, immOffset int) ([]byte, error) {
	add := 0
	if len(c.CDB) > 16 {
		add = (len(c.CDB) - 16 + 3) &^ 3
	}
	n := CmdLen + add + c.Out.size() + c.In.size()
	end := n
	if c.Out.Format == FmtImmediate {
		if immOffset < n {
			return b, ErrImmediateOffset
		}
		end = immOffset + len(c.Out.Imm)
	}
	b, p := grow(b, end)
	p[0] = byte(OpCmd)
	p[1] = c.SolNT
	p[5] = c.Out.Format<<4 | c.In.Format&0x0F
	if c.Out.Format == FmtIndirect {
		p[6] = byte(c.Out.InIU())
	}
	if c.In.Format == FmtIndirect {
		p[7] = byte(c.In.InIU())
	}
	be.PutUint64(p[8:], c.Tag)
	be.PutUint64(p[20:], c.LUN)
	p[29] = c.TaskAttr & 7
	p[31] = byte(add)
	copy(p[32:], c.CDB)
	at := CmdLen + add
	c.Out.put(p[at:])
	at += c.Out.size()
	c.In.put(p[at:])
	if c.Out.Format == FmtImmediate {
		copy(p[immOffset:], c.Out.Imm)
	}
	return b, nil
}

// Decode reads SRP_CMD. immOffset is the login's IMMEDIATE DATA OFFSET
// (0 when immediate data was not agreed: an immediate data-out buffer is
// then an unsupported format).
func (c *Cmd) Decode(b []byte, immOffset int) error {
	if err := need(OpCmd, b, CmdLen); err != nil {
		return err
	}
	c.SolNT = b[1] & (SolSuccess | SolFailure)
	c.Tag = be.Uint64(b[8:])
	c.LUN = be.Uint64(b[20:])
	c.TaskAttr = b[29] & 7
	add := int(b[31] &^ 3) // ADDITIONAL CDB LENGTH: 4-byte words in bits 7–2
	at := CmdLen + add
	if at > len(b) {
		return errf(OpCmd, LogoutInvalidIULength, "additional CDB of %d bytes in a %d-byte IU", add, len(b))
	}
	c.CDB = b[32:at]
	outFmt, inFmt := b[5]>>4, b[5]&0x0F
	var err error
	if at, err = c.Out.decode(b, at, outFmt, int(b[6]), immOffset, LogoutDataOutFormat); err != nil {
		return err
	}
	if inFmt == FmtImmediate {
		return errf(OpCmd, LogoutDataInFormat, "immediate data-in buffer")
	}
	if at, err = c.In.decode(b, at, inFmt, int(b[7]), 0, LogoutDataInFormat); err != nil {
		return err
	}
	if c.Out.Format == FmtImmediate && immOffset < at {
		return errf(OpCmd, LogoutInvalidIULength, "immediate data at offset %d overlaps descriptors ending at %d", immOffset, at)
	}
	return nil
}

func (x *Buffer) decode(b []byte, at int, f uint8, inIU int, immOffset int, bad LogoutReason) (int, error) {
	*x = Buffer{Format: f}
	short := func(n int) error {
		return errf(OpCmd, LogoutInvalidIULength, "%d-byte IU ends inside a %d-byte data buffer descriptor at %d", len(b), n, at)
	}
	switch f {
	case FmtNone:
		return at, nil
	case FmtDirect:
		if at+DirectLen > len(b) {
			return at, short(DirectLen)
		}
		x.direct, x.count = DescAt(b[at:], 0), 1
		x.Total = x.direct.Len
		return at + DirectLen, nil
	case FmtIndirect:
		n := IndirectLen + inIU*DirectLen
		if at+n > len(b) {
			return at, short(n)
		}
		x.Table = DescAt(b[at:], 0)
		x.Total = be.Uint32(b[at+16:])
		x.list = b[at+IndirectLen : at+n]
		if x.Table.Len%DirectLen != 0 {
			return at, errf(OpCmd, bad, "indirect table of %d bytes is not a whole number of descriptors", x.Table.Len)
		}
		x.count = int(x.Table.Len / DirectLen)
		if x.count < inIU {
			return at, errf(OpCmd, bad, "indirect table of %d descriptors, %d in the IU", x.count, inIU)
		}
		if !x.External() {
			var sum uint64
			for i := 0; i < inIU; i++ {
				sum += uint64(x.Desc(i).Len)
			}
			if sum != uint64(x.Total) {
				return at, errf(OpCmd, bad, "indirect descriptors add up to %d bytes, TOTAL LENGTH says %d", sum, x.Total)
			}
		}
		return at + n, nil
	case FmtImmediate:
		if immOffset == 0 {
			return at, errf(OpCmd, bad, "immediate data, which the login did not agree")
		}
		if at+ImmediateLen > len(b) {
			return at, short(ImmediateLen)
		}
		x.Total = be.Uint32(b[at:])
		if immOffset < at+ImmediateLen || uint64(immOffset)+uint64(x.Total) > uint64(len(b)) {
			return at, errf(OpCmd, LogoutInvalidIULength, "%d bytes of immediate data at offset %d in a %d-byte IU", x.Total, immOffset, len(b))
		}
		x.Imm = b[immOffset : immOffset+int(x.Total)]
		return at + ImmediateLen, nil
	}
	return at, errf(OpCmd, bad, "buffer format %d", f)
}
