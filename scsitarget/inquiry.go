package scsitarget

import (
	"encoding/binary"

	"github.com/blockwire/blockwire/scsi"
)

// versionDescriptors are the standards claimed in INQUIRY (SPC-4 Table
// 53): SAM-5, SPC-4, SBC-3, iSCSI.
func versionDescriptors() [4]uint16 { return [4]uint16{0x00a0, 0x0460, 0x04c0, 0x0960} }

func inquiryNoLU(c *Command) error {
	if c.CDB[1]&0x01 != 0 || c.CDB[2] != 0 {
		// VPD pages of a LUN that does not exist: only the qualifier matters.
		b := []byte{0x7f, c.CDB[2], 0, 0}
		c.putData(b, allocLen(c.CDB))
		return nil
	}
	// SPC-4 §6.6.2: peripheral qualifier 011b, device type 1Fh: no LU here.
	var b [36]byte
	b[0] = 0x7f
	b[2] = 0x06
	b[3] = 0x12
	b[4] = byte(len(b) - 5)
	scsi.PadASCII(b[8:16], "BLOCKWIR")
	scsi.PadASCII(b[16:32], "blockwire")
	scsi.PadASCII(b[32:36], "0001")
	c.putData(b[:], allocLen(c.CDB))
	return nil
}

func cmdInquiry(lu *LU, c *Command) error {
	evpd := c.CDB[1]&0x01 != 0
	page := c.CDB[2]
	alloc := allocLen(c.CDB)
	if !evpd {
		if page != 0 {
			return scsi.InvalidFieldInCDB(2, -1)
		}
		var b [96]byte
		b[0] = 0x00 // connected, direct access block device
		if lu.removable {
			b[1] = 0x80 // RMB
		}
		b[2] = 0x06 // SPC-4
		b[3] = 0x12 // HISUP, response data format 2
		b[4] = byte(len(b) - 5)
		// 3PC: the copy manager takes EXTENDED COPY and RECEIVE COPY
		// RESULTS (xcopy.go; SPC-4 §6.4.2). ESXi offloads clones (VAAI
		// XCOPY) only to targets that set it.
		b[5] = 0x08
		b[7] = 0x02 // CMDQUE
		if d := lu.device(); d != nil {
			if groups, _, _ := d.portGroup(nil); len(groups) > 0 {
				b[5] |= 0x30 // TPGS 11b: implicit and explicit ALUA (alua.go)
			}
		}
		scsi.PadASCII(b[8:16], lu.vendor)
		scsi.PadASCII(b[16:32], lu.product)
		scsi.PadASCII(b[32:36], "0001")
		for i, v := range versionDescriptors() {
			binary.BigEndian.PutUint16(b[58+2*i:], v)
		}
		c.putData(b[:], alloc)
		return nil
	}
	var b []byte
	switch page {
	case 0x00:
		b = []byte{0, 0x00, 0, 0, 0x00, 0x80, 0x83, 0x8f, 0xb0, 0xb1, 0xb2}
	case 0x80:
		b = append([]byte{0, 0x80, 0, 0}, lu.serial...)
	case 0x83:
		b = lu.deviceIdentification(c.Nexus)
	case 0x8f:
		b = thirdPartyCopyVPD()
	case 0xb0:
		b = make([]byte, 64)
		b[1] = 0xb0
		if !lu.readOnly {
			b[5] = byte(lu.cawBlocks())                            // WSNZ 0: WRITE SAME of 0 blocks runs to the end
			binary.BigEndian.PutUint64(b[36:], maxWriteSameBlocks) // MAXIMUM WRITE SAME LENGTH
			binary.BigEndian.PutUint32(b[44:], maxAtomicBlocks)    // MAXIMUM ATOMIC TRANSFER LENGTH
			binary.BigEndian.PutUint32(b[48:], 1)                  // ATOMIC ALIGNMENT
			binary.BigEndian.PutUint32(b[52:], 1)                  // ATOMIC TRANSFER LENGTH GRANULARITY
		}
		binary.BigEndian.PutUint16(b[6:], 1)                            // optimal transfer length granularity
		binary.BigEndian.PutUint32(b[8:], maxTransferBlocks)            // maximum transfer length
		binary.BigEndian.PutUint32(b[12:], uint32(1<<20>>lu.blockBits)) // optimal transfer length: 1 MiB
		if lu.unmapper != nil && !lu.readOnly {
			binary.BigEndian.PutUint32(b[20:], maxUnmapBlocks)
			binary.BigEndian.PutUint32(b[24:], maxUnmapDescriptors)
			binary.BigEndian.PutUint32(b[28:], 1)
		}
	case 0xb1:
		b = make([]byte, 64)
		b[1] = 0xb1
		binary.BigEndian.PutUint16(b[4:], 1) // non-rotating medium
		b[7] = 0x40                          // WABEREQ 01b: reads after a BLOCK ERASE sanitize succeed (zeroes)
	case 0xb2:
		b = make([]byte, 8)
		b[1] = 0xb2
		if lu.unmapper != nil && !lu.readOnly {
			// LBPU, LBPWS, LBPWS10: UNMAP and WRITE SAME(16/10) with
			// UNMAP; LBPRZ: unmapped blocks read as zeroes.
			b[5] = 0x80 | 0x40 | 0x20 | 0x04
			b[6] = 0x02 // provisioning type: thin
		}
	default:
		return scsi.InvalidFieldInCDB(2, -1)
	}
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)-4))
	c.putData(b, alloc)
	return nil
}

// deviceIdentification builds VPD page 83h (SPC-4 §7.8.6): the LU's NAA
// and T10 vendor ID designators, the target device name as a SCSI name
// string, and — when the nexus is known — the target port's name, relative
// port identifier and target port group.
func (lu *LU) deviceIdentification(n *Nexus) []byte {
	b := []byte{0, 0x83, 0, 0}
	// NAA, binary, associated with the LU.
	b = append(b, 0x01, 0x03, 0, 16)
	b = append(b, lu.naa[:]...)
	// T10 vendor ID, ASCII, LU.
	t10 := make([]byte, 8, 8+len(lu.serial))
	scsi.PadASCII(t10, lu.vendor)
	t10 = append(t10, lu.serial...)
	b = append(b, 0x02, 0x01, 0, byte(len(t10)))
	b = append(b, t10...)
	// SCSI name string (UTF-8), associated with the target device; PIV=1
	// with protocol identifier 5 (iSCSI) since the name is an iSCSI name.
	if lu.dev != nil && lu.dev.name != "" {
		b = appendNameDesignator(b, 0x20, lu.dev.name)
	}
	if n != nil {
		if n.TargetPort != "" {
			b = appendNameDesignator(b, 0x10, n.TargetPort)
		}
		// Relative target port (type 4) and target port group (type 5),
		// associated with the target port.
		b = append(b, 0x51, 0x94, 0, 4, 0, 0, byte(n.RelativePort>>8), byte(n.RelativePort))
		// With ALUA each port is a group of its own, named by the port's
		// identifier; without, all ports are group 1.
		group := uint16(1)
		if d := lu.device(); d != nil {
			if _, g, ok := d.portGroup(n); ok {
				group = g.ID
			}
		}
		b = append(b, 0x51, 0x95, 0, 4, 0, 0, byte(group>>8), byte(group))
	}
	return b
}

func appendNameDesignator(b []byte, assoc byte, name string) []byte {
	l := len(name) + 1 // null-terminated
	l = (l + 3) &^ 3   // padded to a multiple of four (SPC-4 §7.8.6.11)
	b = append(b, 0x53, 0x80|assoc|0x08, 0, byte(l))
	b = append(b, name...)
	for i := len(name); i < l; i++ {
		b = append(b, 0)
	}
	return b
}

// Mode pages (SPC-4 §7.5, SBC-4 §6.5).

func (lu *LU) modePage(page byte, pc byte) []byte {
	wce := lu.store.WriteCache()
	lu.stateMu.Lock()
	dsense, swp := lu.dsense, lu.swp
	if pc == 2 {
		wce, dsense, swp = lu.store.InitialWriteCache(), lu.defaults.dsense, false
	}
	lu.stateMu.Unlock()
	switch page {
	case 0x08: // caching
		p := make([]byte, 20)
		p[0], p[1] = 0x08, 18
		switch pc {
		case 1:
			p[2] = 0x04 // WCE changeable
		default:
			if wce {
				p[2] = 0x04
			}
		}
		return p
	case 0x0a: // control
		p := make([]byte, 12)
		p[0], p[1] = 0x0a, 10
		switch pc {
		case 1:
			p[2] = 0x04 // D_SENSE changeable
			if !lu.readOnly {
				p[4] = 0x08 // SWP changeable
			}
		default:
			if dsense {
				p[2] |= 0x04
			}
			if swp {
				p[4] |= 0x08
			}
			p[3] = 0x10                               // queue algorithm modifier 1: unrestricted reordering
			binary.BigEndian.PutUint16(p[8:], 0xffff) // busy timeout: unlimited
		}
		return p
	case 0x1c: // informational exceptions control
		p := make([]byte, 12)
		p[0], p[1] = 0x1c, 10
		return p
	}
	return nil
}

// modePages lists the supported mode pages in the order MODE SENSE returns
// them for page 3Fh.
func modePages() [3]byte { return [3]byte{0x08, 0x0a, 0x1c} }

func cmdModeSense(lu *LU, c *Command) error {
	ten := c.CDB[0] == scsi.OpModeSense10
	dbd := c.CDB[1]&0x08 != 0
	llbaa := ten && c.CDB[1]&0x10 != 0
	pc := c.CDB[2] >> 6
	page := c.CDB[2] & 0x3f
	sub := c.CDB[3]
	if pc == 3 {
		return scsi.SavingParametersNotSupported()
	}
	var pages []byte
	switch {
	case page == 0x3f && (sub == 0 || sub == 0xff):
		for _, p := range modePages() {
			pages = append(pages, lu.modePage(p, pc)...)
		}
	case sub != 0:
		return scsi.InvalidFieldInCDB(3, -1)
	default:
		pages = lu.modePage(page, pc)
		if pages == nil {
			return scsi.InvalidFieldInCDB(2, 5)
		}
	}
	var hdr []byte
	var desc []byte
	if !dbd {
		blocks := lu.Blocks()
		if llbaa {
			desc = make([]byte, 16)
			binary.BigEndian.PutUint64(desc[0:], blocks)
			binary.BigEndian.PutUint32(desc[12:], uint32(lu.blockSize))
		} else {
			desc = make([]byte, 8)
			if blocks > 0xffffffff {
				blocks = 0xffffffff
			}
			binary.BigEndian.PutUint32(desc[0:], uint32(blocks))
			desc[5] = byte(lu.blockSize >> 16)
			desc[6] = byte(lu.blockSize >> 8)
			desc[7] = byte(lu.blockSize)
		}
	}
	var devSpecific byte = 0x10 // DPOFUA
	if wp, _ := lu.writeProtected(); wp {
		devSpecific |= 0x80 // WP
	}
	if ten {
		hdr = make([]byte, 8)
		binary.BigEndian.PutUint16(hdr[0:], uint16(6+len(desc)+len(pages)))
		hdr[3] = devSpecific
		if llbaa {
			hdr[4] = 0x01
		}
		binary.BigEndian.PutUint16(hdr[6:], uint16(len(desc)))
	} else {
		hdr = make([]byte, 4)
		hdr[0] = byte(3 + len(desc) + len(pages))
		hdr[2] = devSpecific
		hdr[3] = byte(len(desc))
	}
	out := append(append(hdr, desc...), pages...)
	c.putData(out, allocLen(c.CDB))
	return nil
}

func cmdModeSelect(lu *LU, c *Command) error {
	ten := c.CDB[0] == scsi.OpModeSelect10
	if c.CDB[1]&0x01 != 0 {
		return scsi.SavingParametersNotSupported()
	}
	plen := allocLen(c.CDB)
	if plen == 0 {
		return nil
	}
	if len(c.Data) < plen {
		return scsi.InvalidFieldInIU()
	}
	p := c.Data[:plen]
	c.Transfer = plen
	hlen, bdl := 4, 0
	if ten {
		hlen = 8
		if len(p) < hlen {
			return scsi.ParameterListLengthError()
		}
		bdl = int(binary.BigEndian.Uint16(p[6:8]))
	} else {
		if len(p) < hlen {
			return scsi.ParameterListLengthError()
		}
		bdl = int(p[3])
	}
	if hlen+bdl > len(p) {
		return scsi.ParameterListLengthError()
	}
	if bdl != 0 && bdl != 8 && bdl != 16 {
		return scsi.InvalidFieldInParameterList(hlen-1, -1)
	}
	rest := p[hlen+bdl:]
	off := hlen + bdl
	wce, dsense := lu.writeCache(), lu.descriptorSense()
	lu.stateMu.Lock()
	swp := lu.swp
	lu.stateMu.Unlock()
	for len(rest) > 0 {
		if len(rest) < 2 {
			return scsi.ParameterListLengthError()
		}
		code := rest[0] & 0x3f
		if rest[0]&0x40 != 0 { // sub-page format
			return scsi.InvalidFieldInParameterList(off, 6)
		}
		l := int(rest[1]) + 2
		if l > len(rest) {
			return scsi.ParameterListLengthError()
		}
		cur := lu.modePage(code, 0)
		chg := lu.modePage(code, 1)
		if cur == nil {
			return scsi.InvalidFieldInParameterList(off, 5)
		}
		if l != len(cur) {
			return scsi.InvalidFieldInParameterList(off+1, -1)
		}
		// Any bit that differs from the current value must be changeable.
		for i := 2; i < l; i++ {
			if diff := (rest[i] ^ cur[i]) &^ chg[i]; diff != 0 {
				return scsi.InvalidFieldInParameterList(off+i, -1)
			}
		}
		switch code {
		case 0x08:
			wce = rest[2]&0x04 != 0
		case 0x0a:
			dsense = rest[2]&0x04 != 0
			swp = rest[4]&0x08 != 0
		}
		rest = rest[l:]
		off += l
	}
	cacheChanged, flushErr := lu.store.SetWriteCache(wce) // turned off: what it held is flushed
	lu.stateMu.Lock()
	changed := cacheChanged || lu.dsense != dsense || lu.swp != swp
	lu.dsense, lu.swp = dsense, swp
	lu.stateMu.Unlock()
	if changed && lu.dev != nil {
		// SPC-4 §7.5.1: other nexuses learn of changed mode parameters.
		lu.dev.forEachNexus(func(o *Nexus) {
			if o != c.Nexus {
				o.addUA(lu.lun, scsi.UAModeParamsChanged())
			}
		})
	}
	return flushErr
}

// cmdReportOpcodes answers REPORT SUPPORTED OPERATION CODES (SPC-4 §6.35)
// from the command table.
func cmdReportOpcodes(lu *LU, c *Command) error {
	rctd := c.CDB[2]&0x80 != 0
	opts := c.CDB[2] & 0x07
	reqOp := c.CDB[3]
	reqSA := binary.BigEndian.Uint16(c.CDB[4:6])
	alloc := allocLen(c.CDB)
	all := lu.dev.ops.all
	timeouts := func(b []byte) []byte {
		if !rctd {
			return b
		}
		return append(b, 0, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	}
	switch opts {
	case 0:
		b := make([]byte, 4)
		for _, o := range all {
			d := []byte{o.op, 0, byte(o.sa >> 8), byte(o.sa), 0, 0, byte(len(o.usage) >> 8), byte(len(o.usage))}
			if o.hasSA {
				d[5] |= 0x01
			}
			if rctd {
				d[5] |= 0x02
			}
			b = timeouts(append(b, d...))
		}
		binary.BigEndian.PutUint32(b, uint32(len(b)-4))
		c.putData(b, alloc)
		return nil
	case 1, 2, 3:
		var found *opInfo
		usesSA := false
		for i := range all {
			o := &all[i]
			if o.op != reqOp {
				continue
			}
			usesSA = o.hasSA
			if !o.hasSA || o.sa == reqSA {
				found = o
				break
			}
		}
		switch {
		case opts == 1 && usesSA:
			return scsi.InvalidFieldInCDB(2, 2)
		case opts == 2 && found != nil && !found.hasSA:
			return scsi.InvalidFieldInCDB(2, 2)
		case opts == 2 && found == nil && !usesSA && lu.dev.ops.byOp[reqOp] != nil:
			return scsi.InvalidFieldInCDB(2, 2)
		}
		b := []byte{0, 0, 0, 0}
		if rctd {
			b[1] |= 0x80
		}
		if found == nil {
			b[1] |= 0x01 // not supported
		} else {
			b[1] |= 0x03 // supported, standard conformant
			binary.BigEndian.PutUint16(b[2:], uint16(len(found.usage)))
			b = append(b, found.usage...)
			b[4] = found.op // CDB usage data starts with the operation code (SPC-4 §6.35.3)
		}
		b = timeouts(b)
		c.putData(b, alloc)
		return nil
	}
	return scsi.InvalidFieldInCDB(2, 0)
}
