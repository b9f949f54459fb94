package scsitarget

import (
	"bytes"
	"encoding/binary"

	"github.com/blockwire/blockwire/scsi"
)

// EXTENDED COPY (LID1) and RECEIVE COPY RESULTS (SPC-4 §6.3, §6.18,
// originally SPC-3): the copy manager copies between logical units of this
// target device, named by identification descriptors (CSCD type E4h)
// matching their VPD 83h designators, with block-device-to-block-device
// segments (type 02h). Data never leaves the target.

const (
	xcMaxCSCD       = 2                               // MAXIMUM CSCD DESCRIPTOR COUNT
	xcMaxSegments   = 64                              // MAXIMUM SEGMENT DESCRIPTOR COUNT
	xcMaxDescList   = xcMaxCSCD*32 + xcMaxSegments*28 // MAXIMUM DESCRIPTOR LIST LENGTH
	xcMaxSegmentLen = 64 << 20                        // MAXIMUM SEGMENT LENGTH (bytes)
	xcHeaderLen     = 16
	xcRetained      = 16 // copy statuses kept for RECEIVE COPY RESULTS
)

func copyAborted(asc, ascq byte) *scsi.Sense {
	return &scsi.Sense{Key: scsi.SenseCopyAborted, ASC: asc, ASCQ: ascq, Bit: -1}
}

func illegal(asc, ascq byte) *scsi.Sense {
	return &scsi.Sense{Key: scsi.SenseIllegalRequest, ASC: asc, ASCQ: ascq, Bit: -1}
}

// copyStatus is a finished copy's result, kept for COPY STATUS.
type copyStatus struct {
	nexus    *Nexus
	listID   byte
	status   byte // 01h completed without errors, 02h with errors
	segments uint16
	bytes    uint64
}

func (d *Device) keepCopyStatus(s copyStatus) {
	d.copyMu.Lock()
	defer d.copyMu.Unlock()
	for i, o := range d.copies {
		if o.nexus == s.nexus && o.listID == s.listID {
			d.copies = append(d.copies[:i], d.copies[i+1:]...)
			break
		}
	}
	d.copies = append(d.copies, s)
	if len(d.copies) > xcRetained {
		d.copies = d.copies[1:]
	}
}

// resolveCSCD finds the LU an identification descriptor names: one whose
// LU-associated VPD 83h designator (NAA or T10 vendor ID) it repeats.
func (d *Device) resolveCSCD(desc []byte) *LU {
	codeSet, typ := desc[4]&0x0f, desc[5]&0x0f
	assoc := (desc[5] >> 4) & 0x03
	n := int(desc[7])
	if assoc != 0 || n > 20 {
		return nil
	}
	want := desc[8 : 8+n]
	for _, l := range d.LUNs() {
		lu := d.LU(l)
		if lu == nil {
			continue
		}
		p := lu.deviceIdentification(nil)[4:]
		for len(p) >= 4 {
			l := int(p[3])
			if 4+l > len(p) {
				break
			}
			if p[0]&0x0f == codeSet && p[1]&0x0f == typ && (p[1]>>4)&0x03 == 0 && bytes.Equal(p[4:4+l], want) {
				return lu
			}
			p = p[4+l:]
		}
	}
	return nil
}

func cmdExtendedCopy(lu *LU, c *Command) error {
	plen := int(binary.BigEndian.Uint32(c.CDB[10:14]))
	if plen == 0 {
		return nil
	}
	c.Transfer = plen
	if len(c.Data) < plen {
		return scsi.ParameterListLengthError()
	}
	if plen < xcHeaderLen {
		return scsi.ParameterListLengthError()
	}
	p := c.Data[:plen]
	listID := p[0]
	usage := (p[1] >> 3) & 0x03
	cscdLen := int(binary.BigEndian.Uint16(p[2:4]))
	segLen := int(binary.BigEndian.Uint32(p[8:12]))
	inline := int(binary.BigEndian.Uint32(p[12:16]))
	if xcHeaderLen+cscdLen+segLen+inline != plen {
		return scsi.ParameterListLengthError()
	}
	if cscdLen+segLen > xcMaxDescList {
		return scsi.ParameterListLengthError()
	}
	if inline != 0 {
		return scsi.InvalidFieldInParameterList(12, -1) // no inline data: MAXIMUM INLINE DATA LENGTH 0
	}
	if usage == 0x01 {
		return scsi.InvalidFieldInParameterList(1, 4) // reserved LIST ID USAGE
	}
	if usage == 0x03 && listID != 0 {
		return scsi.InvalidFieldInParameterList(0, -1)
	}
	// CSCD descriptors: 32 bytes each.
	if cscdLen%32 != 0 {
		return scsi.ParameterListLengthError()
	}
	if cscdLen/32 > xcMaxCSCD {
		return illegal(0x26, 0x06) // TOO MANY TARGET DESCRIPTORS
	}
	cscd := p[xcHeaderLen : xcHeaderLen+cscdLen]
	segs := p[xcHeaderLen+cscdLen : xcHeaderLen+cscdLen+segLen]
	// Count segment descriptors first (each declares its length).
	nseg := 0
	for q := segs; len(q) > 0; nseg++ {
		if len(q) < 4 {
			return scsi.ParameterListLengthError()
		}
		l := 4 + int(binary.BigEndian.Uint16(q[2:4]))
		if l > len(q) {
			return scsi.ParameterListLengthError()
		}
		q = q[l:]
	}
	if nseg > xcMaxSegments {
		return illegal(0x26, 0x08) // TOO MANY SEGMENT DESCRIPTORS
	}
	targets := make([]*LU, cscdLen/32)
	for i := range targets {
		desc := cscd[i*32 : (i+1)*32]
		if desc[0] != 0xe4 {
			return illegal(0x26, 0x07) // UNSUPPORTED TARGET DESCRIPTOR TYPE CODE
		}
		if desc[1]&0x1f != 0 { // peripheral device type: block devices only
			return illegal(0x26, 0x07)
		}
		targets[i] = lu.dev.resolveCSCD(desc) // nil: not reachable (checked when used)
	}
	// Segment descriptors: validate all before copying anything.
	type seg struct {
		src, dst       *LU
		srcLBA, dstLBA uint64
		blocks         uint32
		srcIdx, dstIdx int
	}
	var list []seg
	for q := segs; len(q) > 0; {
		l := 4 + int(binary.BigEndian.Uint16(q[2:4]))
		d := q[:l]
		q = q[l:]
		if d[0] != 0x02 {
			return illegal(0x26, 0x09) // UNSUPPORTED SEGMENT DESCRIPTOR TYPE CODE
		}
		if l != 28 {
			return scsi.InvalidFieldInParameterList(xcHeaderLen+cscdLen+2, -1)
		}
		s := seg{srcIdx: int(binary.BigEndian.Uint16(d[4:6])), dstIdx: int(binary.BigEndian.Uint16(d[6:8])),
			blocks: uint32(binary.BigEndian.Uint16(d[10:12])),
			srcLBA: binary.BigEndian.Uint64(d[12:20]), dstLBA: binary.BigEndian.Uint64(d[20:28])}
		if s.srcIdx >= len(targets) || s.dstIdx >= len(targets) || targets[s.srcIdx] == nil || targets[s.dstIdx] == nil {
			return copyAborted(0x0d, 0x02) // COPY TARGET DEVICE NOT REACHABLE
		}
		s.src, s.dst = targets[s.srcIdx], targets[s.dstIdx]
		if s.src.blockSize != s.dst.blockSize && d[1]&0x02 == 0 {
			return copyAborted(0x26, 0x0a) // UNEXPECTED INEXACT SEGMENT
		}
		if uint64(s.blocks)*uint64(s.src.blockSize) > xcMaxSegmentLen {
			return scsi.InvalidFieldInParameterList(xcHeaderLen+cscdLen+10, -1) // longer than MAXIMUM SEGMENT LENGTH
		}
		// A segment past either LU's capacity aborts the copy before it
		// starts (COPY ABORTED with no additional sense, as libiscsi's
		// ValidSegDescr expects).
		if s.src.rangeCheck(s.srcLBA, uint64(s.blocks)) != nil || s.dst.rangeCheck(s.dstLBA, uint64(s.blocks)) != nil {
			return copyAborted(0x00, 0x00)
		}
		if wp, _ := s.dst.writeProtected(); wp {
			return copyAborted(0x27, 0x00)
		}
		list = append(list, s)
	}
	st := copyStatus{nexus: c.Nexus, listID: listID, status: 0x01}
	buf := make([]byte, 1<<20)
	for _, s := range list {
		n := int64(s.blocks) << s.src.blockBits
		so, do := int64(s.srcLBA)<<s.src.blockBits, int64(s.dstLBA)<<s.dst.blockBits
		for done := int64(0); done < n; {
			k := min(n-done, int64(len(buf)))
			if _, err := s.src.be.ReadAt(buf[:k], so+done); err != nil {
				st.status = 0x02
				lu.dev.keepCopyStatus(st)
				return copyAborted(0x11, 0x00) // UNRECOVERED READ ERROR
			}
			err := s.dst.store.WriteAt(buf[:k], do+done, false)
			if err != nil {
				st.status = 0x02
				lu.dev.keepCopyStatus(st)
				return copyAborted(0x0c, 0x00) // WRITE ERROR
			}
			done += k
			st.bytes += uint64(k)
		}
		if err := s.dst.flushIf(false, s.dstLBA); err != nil {
			return err
		}
		st.segments++
	}
	if usage == 0x00 {
		lu.dev.keepCopyStatus(st)
	}
	return nil
}

// thirdPartyCopyVPD is VPD page 8Fh (SPC-4 §7.8.17): what the copy
// manager does, in the descriptors an initiator of EXTENDED COPY (LID1)
// looks for — the commands, the copy parameters, the segment and CSCD
// descriptor types, the general copy limits. The same figures as RECEIVE
// COPY RESULTS (OPERATING PARAMETERS).
func thirdPartyCopyVPD() []byte {
	b := []byte{0, 0x8f, 0, 0}
	// desc appends a descriptor of type typ with body (after its 4-byte
	// header), padded to a multiple of 4 bytes.
	desc := func(typ uint16, body []byte) {
		for (4+len(body))%4 != 0 {
			body = append(body, 0)
		}
		b = binary.BigEndian.AppendUint16(b, typ)
		b = binary.BigEndian.AppendUint16(b, uint16(len(body)))
		b = append(b, body...)
	}
	// Supported Commands (0001h): EXTENDED COPY (LID1), RECEIVE COPY
	// RESULTS (COPY STATUS, OPERATING PARAMETERS).
	cmds := []byte{scsi.OpExtendedCopy, 1, 0x00, scsi.OpReceiveCopyResults, 2, 0x00, 0x03}
	desc(0x0001, append([]byte{byte(len(cmds))}, cmds...))
	// Parameter Data (0004h).
	pd := make([]byte, 28)
	binary.BigEndian.PutUint16(pd[4:], xcMaxCSCD)
	binary.BigEndian.PutUint16(pd[6:], xcMaxSegments)
	binary.BigEndian.PutUint32(pd[8:], xcMaxDescList)
	desc(0x0004, pd) // MAXIMUM INLINE DATA LENGTH 0
	// Supported Descriptors (0008h): block→block segments, identification
	// CSCDs.
	desc(0x0008, []byte{2, 0x02, 0xe4})
	// General Copy Operations (8001h).
	g := make([]byte, 32)
	binary.BigEndian.PutUint32(g[0:], 1)               // TOTAL CONCURRENT COPIES
	binary.BigEndian.PutUint32(g[4:], 1)               // MAXIMUM IDENTIFIED CONCURRENT COPIES
	binary.BigEndian.PutUint32(g[8:], xcMaxSegmentLen) // MAXIMUM SEGMENT LENGTH
	g[12] = 9                                          // DATA SEGMENT GRANULARITY: 2^9 bytes
	desc(0x8001, g)
	return b
}

func cmdReceiveCopyResults(lu *LU, c *Command) error {
	alloc := int(binary.BigEndian.Uint32(c.CDB[10:14]))
	switch c.CDB[1] & 0x1f {
	case 0x03: // OPERATING PARAMETERS
		b := make([]byte, 46)
		binary.BigEndian.PutUint32(b[0:], uint32(len(b)-4))
		b[4] = 0x01 // SNLID: LIST ID USAGE 11b (no list identifier) supported
		binary.BigEndian.PutUint16(b[8:], xcMaxCSCD)
		binary.BigEndian.PutUint16(b[10:], xcMaxSegments)
		binary.BigEndian.PutUint32(b[12:], xcMaxDescList)
		binary.BigEndian.PutUint32(b[16:], xcMaxSegmentLen)
		// MAXIMUM INLINE DATA LENGTH, HELD DATA LIMIT, MAXIMUM STREAM
		// DEVICE TRANSFER SIZE: 0.
		binary.BigEndian.PutUint16(b[34:], 1) // TOTAL CONCURRENT COPIES
		b[36] = 1                             // MAXIMUM CONCURRENT COPIES
		b[37] = 9                             // DATA SEGMENT GRANULARITY: 2^9 bytes
		b[43] = 2                             // implemented descriptor types:
		b[44], b[45] = 0x02, 0xe4             // block→block segments, identification CSCDs
		c.putData(b, alloc)
		return nil
	case 0x00: // COPY STATUS
		listID := c.CDB[2]
		d := lu.dev
		d.copyMu.Lock()
		var st *copyStatus
		for i := range d.copies {
			if d.copies[i].nexus == c.Nexus && d.copies[i].listID == listID {
				st = &d.copies[i]
			}
		}
		var b []byte
		if st != nil {
			b = make([]byte, 12)
			binary.BigEndian.PutUint32(b[0:], 8)
			b[4] = st.status
			binary.BigEndian.PutUint16(b[5:], st.segments)
			b[7] = 0x00 // TRANSFER COUNT UNITS: bytes
			binary.BigEndian.PutUint32(b[8:], uint32(min(st.bytes, 0xffffffff)))
		}
		d.copyMu.Unlock()
		if b == nil {
			return scsi.InvalidFieldInCDB(2, -1) // no such copy operation
		}
		c.putData(b, alloc)
		return nil
	}
	return scsi.InvalidFieldInCDB(1, 4)
}
