package scsitarget

import (
	"encoding/binary"
	"errors"

	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/scsi"
)

// handler runs one command on an LU. It returns a *scsi.Sense for CHECK
// CONDITION; any other error is reported as a hardware failure.
type handler func(lu *LU, c *Command) error

// opInfo is one row of the command d.ops. The table drives dispatch, the
// CDB reserved-bit check and REPORT SUPPORTED OPERATION CODES, so the three
// can never disagree.
type opInfo struct {
	op    byte
	sa    uint16
	hasSA bool
	name  string
	// usage is the CDB usage data of SPC-4 §6.35.3: a bit set where the CDB
	// field is supported. A set bit outside it is INVALID FIELD IN CDB.
	usage []byte
	fn    handler
	// noUA: not affected by unit attentions (INQUIRY, REPORT LUNS, REQUEST
	// SENSE; SPC-4 §5.14).
	noUA bool
	// media: needs the LU started (NOT READY after START STOP UNIT stop).
	media bool
	// writes: modifies the medium (refused on a read-only LU).
	writes bool
	// noConflict: allowed from other nexuses while an SPC-2 reservation
	// is held (SPC-2 §5.5.1).
	noConflict bool
	// prAllowed: allowed whatever the persistent reservation (SPC-4
	// §5.13.1); prWrite: conflicts with the Write Exclusive types like a
	// write does.
	prAllowed, prWrite bool
}

// commandTable returns the table of supported commands.
func commandTable() []opInfo {
	u := func(b ...byte) []byte { return b }
	return []opInfo{
		{op: scsi.OpTestUnitReady, name: "TEST UNIT READY", usage: u(0xff, 0, 0, 0, 0, 0), fn: cmdTestUnitReady, prAllowed: true},
		{op: scsi.OpRequestSense, name: "REQUEST SENSE", usage: u(0xff, 0x01, 0, 0, 0xff, 0), fn: cmdRequestSense, noUA: true, noConflict: true, prAllowed: true},
		{op: scsi.OpRead6, name: "READ(6)", usage: u(0xff, 0x1f, 0xff, 0xff, 0xff, 0), fn: cmdRead, media: true},
		{op: scsi.OpWrite6, name: "WRITE(6)", usage: u(0xff, 0x1f, 0xff, 0xff, 0xff, 0), fn: cmdWrite, media: true, writes: true},
		{op: scsi.OpInquiry, name: "INQUIRY", usage: u(0xff, 0x01, 0xff, 0xff, 0xff, 0), fn: cmdInquiry, noUA: true, noConflict: true, prAllowed: true},
		{op: scsi.OpModeSelect6, name: "MODE SELECT(6)", usage: u(0xff, 0x11, 0, 0, 0xff, 0), fn: cmdModeSelect, prWrite: true},
		{op: scsi.OpModeSense6, name: "MODE SENSE(6)", usage: u(0xff, 0x08, 0xff, 0xff, 0xff, 0), fn: cmdModeSense},
		{op: scsi.OpStartStopUnit, name: "START STOP UNIT", usage: u(0xff, 0x01, 0, 0x0f, 0xf7, 0), fn: cmdStartStop, prWrite: true},
		{op: scsi.OpReadCapacity10, name: "READ CAPACITY(10)", usage: u(0xff, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0x01, 0), fn: cmdReadCapacity10, media: true, prAllowed: true},
		{op: scsi.OpRead10, name: "READ(10)", usage: u(0xff, 0x1e, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0), fn: cmdRead, media: true},
		{op: scsi.OpWrite10, name: "WRITE(10)", usage: u(0xff, 0x1a, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0), fn: cmdWrite, media: true, writes: true},
		{op: scsi.OpWriteAndVerify10, name: "WRITE AND VERIFY(10)", usage: u(0xff, 0x16, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0), fn: cmdWriteVerify, media: true, writes: true},
		{op: scsi.OpVerify10, name: "VERIFY(10)", usage: u(0xff, 0x16, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0), fn: cmdVerify, media: true},
		{op: scsi.OpSynchronizeCache10, name: "SYNCHRONIZE CACHE(10)", usage: u(0xff, 0x06, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0), fn: cmdSyncCache, media: true, prWrite: true},
		{op: scsi.OpUnmap, name: "UNMAP", usage: u(0xff, 0, 0, 0, 0, 0, 0x3f, 0xff, 0xff, 0), fn: cmdUnmap, media: true, writes: true},
		{op: scsi.OpModeSelect10, name: "MODE SELECT(10)", usage: u(0xff, 0x11, 0, 0, 0, 0, 0, 0xff, 0xff, 0), fn: cmdModeSelect, prWrite: true},
		{op: scsi.OpModeSense10, name: "MODE SENSE(10)", usage: u(0xff, 0x18, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0), fn: cmdModeSense},
		{op: scsi.OpRead16, name: "READ(16)", usage: u(0xff, 0x1e, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0), fn: cmdRead, media: true},
		{op: scsi.OpWrite16, name: "WRITE(16)", usage: u(0xff, 0x1a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0), fn: cmdWrite, media: true, writes: true},
		{op: scsi.OpWriteAndVerify16, name: "WRITE AND VERIFY(16)", usage: u(0xff, 0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0), fn: cmdWriteVerify, media: true, writes: true},
		{op: scsi.OpVerify16, name: "VERIFY(16)", usage: u(0xff, 0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0), fn: cmdVerify, media: true},
		{op: scsi.OpSynchronizeCache16, name: "SYNCHRONIZE CACHE(16)", usage: u(0xff, 0x06, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0), fn: cmdSyncCache, media: true, prWrite: true},
		{op: scsi.OpServiceActionIn16, sa: scsi.SAReadCapacity16, hasSA: true, name: "READ CAPACITY(16)", usage: u(0xff, 0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0), fn: cmdReadCapacity16, media: true, prAllowed: true},
		{op: scsi.OpServiceActionIn16, sa: scsi.SAGetLBAStatus, hasSA: true, name: "GET LBA STATUS", usage: u(0xff, 0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0), fn: cmdGetLBAStatus, media: true},
		{op: scsi.OpReportLuns, name: "REPORT LUNS", usage: u(0xff, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0), fn: nil, noUA: true, noConflict: true, prAllowed: true},
		{op: scsi.OpMaintenanceIn, sa: scsi.SAReportTargetPortGroups, hasSA: true, name: "REPORT TARGET PORT GROUPS", usage: u(0xff, 0xff, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0), fn: cmdReportTargetPortGroups, noConflict: true, prAllowed: true},
		{op: scsi.OpMaintenanceOut, sa: scsi.SASetTargetPortGroups, hasSA: true, name: "SET TARGET PORT GROUPS", usage: u(0xff, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0), fn: cmdSetTargetPortGroups},
		{op: scsi.OpMaintenanceIn, sa: scsi.SAReportSupportedOpcodes, hasSA: true, name: "REPORT SUPPORTED OPERATION CODES", usage: u(0xff, 0x1f, 0x87, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0), fn: cmdReportOpcodes, prAllowed: true},
		{op: scsi.OpRead12, name: "READ(12)", usage: u(0xff, 0x1e, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0), fn: cmdRead, media: true},
		{op: scsi.OpWrite12, name: "WRITE(12)", usage: u(0xff, 0x1a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0), fn: cmdWrite, media: true, writes: true},
		{op: scsi.OpWriteAndVerify12, name: "WRITE AND VERIFY(12)", usage: u(0xff, 0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0), fn: cmdWriteVerify, media: true, writes: true},
		{op: scsi.OpVerify12, name: "VERIFY(12)", usage: u(0xff, 0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0), fn: cmdVerify, media: true},
		{op: scsi.OpPersistentReserveIn, name: "PERSISTENT RESERVE IN", usage: u(0xff, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0), fn: cmdPRIn, noConflict: true, prAllowed: true},
		{op: scsi.OpPersistentReserveOut, name: "PERSISTENT RESERVE OUT", usage: u(0xff, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0), fn: cmdPROut, prAllowed: true},
		{op: scsi.OpPreventAllowMediumRemoval, name: "PREVENT ALLOW MEDIUM REMOVAL", usage: u(0xff, 0, 0, 0, 0x03, 0), fn: cmdPreventAllow, prWrite: true},
		{op: scsi.OpReserve6, name: "RESERVE(6)", usage: u(0xff, 0, 0, 0, 0, 0), fn: cmdReserve},
		{op: scsi.OpRelease6, name: "RELEASE(6)", usage: u(0xff, 0, 0, 0, 0, 0), fn: cmdRelease, noConflict: true},
		{op: scsi.OpReserve10, name: "RESERVE(10)", usage: u(0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0), fn: cmdReserve},
		{op: scsi.OpRelease10, name: "RELEASE(10)", usage: u(0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0), fn: cmdRelease, noConflict: true},
		{op: scsi.OpPreFetch10, name: "PRE-FETCH(10)", usage: u(0xff, 0x02, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0), fn: cmdPreFetch, media: true},
		{op: scsi.OpPreFetch16, name: "PRE-FETCH(16)", usage: u(0xff, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0), fn: cmdPreFetch, media: true},
		{op: scsi.OpReadDefectData10, name: "READ DEFECT DATA(10)", usage: u(0xff, 0, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0), fn: cmdReadDefectData, media: true},
		{op: scsi.OpReadDefectData12, name: "READ DEFECT DATA(12)", usage: u(0xff, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0), fn: cmdReadDefectData, media: true},
		{op: scsi.OpWriteSame10, name: "WRITE SAME(10)", usage: u(0xff, 0x18, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0), fn: cmdWriteSame, media: true, writes: true},
		{op: scsi.OpWriteSame16, name: "WRITE SAME(16)", usage: u(0xff, 0x19, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0), fn: cmdWriteSame, media: true, writes: true},
		{op: scsi.OpCompareAndWrite, name: "COMPARE AND WRITE", usage: u(0xff, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0xff, 0x3f, 0), fn: cmdCompareAndWrite, media: true, writes: true},
		{op: scsi.OpSanitize, sa: scsi.SASanitizeOverwrite, hasSA: true, name: "SANITIZE OVERWRITE", usage: u(0xff, 0xbf, 0, 0, 0, 0, 0, 0xff, 0xff, 0), fn: cmdSanitize, writes: true},
		{op: scsi.OpSanitize, sa: scsi.SASanitizeBlockErase, hasSA: true, name: "SANITIZE BLOCK ERASE", usage: u(0xff, 0xbf, 0, 0, 0, 0, 0, 0xff, 0xff, 0), fn: cmdSanitize, writes: true},
		{op: scsi.OpSanitize, sa: scsi.SASanitizeExitFailure, hasSA: true, name: "SANITIZE EXIT FAILURE MODE", usage: u(0xff, 0xbf, 0, 0, 0, 0, 0, 0xff, 0xff, 0), fn: cmdSanitize, writes: true},
		{op: scsi.OpExtendedCopy, sa: 0x00, hasSA: true, name: "EXTENDED COPY(LID1)", usage: u(0xff, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0), fn: cmdExtendedCopy, media: true, prWrite: true},
		{op: scsi.OpReceiveCopyResults, sa: 0x00, hasSA: true, name: "RECEIVE COPY RESULTS(COPY STATUS)", usage: u(0xff, 0x1f, 0xff, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0), fn: cmdReceiveCopyResults},
		{op: scsi.OpReceiveCopyResults, sa: 0x03, hasSA: true, name: "RECEIVE COPY RESULTS(OPERATING PARAMETERS)", usage: u(0xff, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0), fn: cmdReceiveCopyResults},
		{op: scsi.OpWriteAtomic16, name: "WRITE ATOMIC(16)", usage: u(0xff, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0), fn: cmdWriteAtomic, media: true, writes: true},
		{op: scsi.OpOrWrite16, name: "ORWRITE(16)", usage: u(0xff, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0), fn: cmdOrWrite, media: true, writes: true},
	}
}

// dispatch indexes the command table by opcode; service-action opcodes
// hold a list.
type dispatch struct {
	byOp [256][]*opInfo
	all  []opInfo
}

func newDispatch() *dispatch {
	d := &dispatch{all: commandTable()}
	for i := range d.all {
		o := &d.all[i]
		d.byOp[o.op] = append(d.byOp[o.op], o)
	}
	return d
}

// serviceAction returns the service action of a CDB whose opcode uses one.
func serviceAction(cdb []byte) uint16 {
	return uint16(cdb[1] & 0x1f)
}

func (d *dispatch) lookup(cdb []byte) (*opInfo, error) {
	rows := d.byOp[cdb[0]]
	if len(rows) == 0 {
		return nil, scsi.InvalidOpcode()
	}
	if !rows[0].hasSA {
		return rows[0], nil
	}
	if len(cdb) < 2 {
		return nil, scsi.InvalidOpcode()
	}
	sa := serviceAction(cdb)
	for _, r := range rows {
		if r.sa == sa {
			return r, nil
		}
	}
	// SPC-4 §4.2.5.1: an unsupported service action is INVALID FIELD IN
	// CDB pointing at the service action field.
	return nil, scsi.InvalidFieldInCDB(1, 4)
}

// checkUsage reports the first CDB bit set outside the usage data.
func checkUsage(o *opInfo, cdb []byte) error {
	if len(cdb) < len(o.usage) {
		return scsi.InvalidFieldInCDB(len(cdb)-1, -1)
	}
	for i := 1; i < len(o.usage); i++ {
		if bad := cdb[i] &^ o.usage[i]; bad != 0 {
			bit := 7
			for bad&(1<<uint(bit)) == 0 {
				bit--
			}
			return scsi.InvalidFieldInCDB(i, bit)
		}
	}
	return nil
}

// Execute runs a command to completion and fills in its outcome. The fabric
// calls Begin before and End after. Execute is safe to call concurrently
// for different commands.
func (d *Device) Execute(c *Command) {
	c.Status = scsi.StatusGood
	c.SenseLen = 0
	c.Transfer = 0
	if len(c.CDB) == 0 {
		d.fail(nil, c, scsi.InvalidOpcode())
		return
	}
	lu := c.lu
	if lu == nil {
		lu = d.LUFor(c.Nexus, c.LUN)
	}
	op := c.CDB[0]
	if op == scsi.OpReportLuns {
		// REPORT LUNS is answered by every LUN, present or not (SPC-4 §6.33).
		if err := checkUsage(d.ops.byOp[op][0], c.CDB); err != nil {
			d.fail(lu, c, err)
			return
		}
		d.fail(lu, c, d.reportLuns(c))
		return
	}
	if lu == nil {
		switch op {
		case scsi.OpInquiry:
			d.fail(nil, c, inquiryNoLU(c))
		case scsi.OpRequestSense:
			// SPC-4 §6.39: report LOGICAL UNIT NOT SUPPORTED as sense data.
			s := scsi.LUNNotSupported()
			c.putData(s.AppendFixed(nil), allocLen(c.CDB))
		default:
			d.fail(nil, c, scsi.LUNNotSupported())
		}
		return
	}
	if c.Aborted() {
		return
	}
	lu.pr.freshen()
	o, err := d.ops.lookup(c.CDB)
	if err == nil {
		err = checkUsage(o, c.CDB)
	}
	if err != nil {
		// An unsupported command still reports a pending unit attention
		// first (SPC-4 §5.14: UA takes precedence except for the listed
		// commands).
		if c.Nexus != nil && op != scsi.OpInquiry && op != scsi.OpRequestSense {
			if ua, ok := c.Nexus.takeUA(lu.lun); ok {
				d.fail(lu, c, &ua)
				return
			}
		}
		d.fail(lu, c, err)
		return
	}
	if !o.noUA && c.Nexus != nil && c.Nexus.pending.Load() != 0 {
		if ua, ok := c.Nexus.takeUA(lu.lun); ok {
			u := ua // escapes only on this path
			d.fail(lu, c, &u)
			return
		}
	}
	if !o.noConflict && c.Nexus != nil && lu.reservedByOther(c.Nexus) {
		c.Status = scsi.StatusReservationConflict
		return
	}
	if c.Nexus != nil {
		conflict, gated, epoch := lu.prCheck(c.Nexus, o)
		if conflict {
			c.Status = scsi.StatusReservationConflict
			return
		}
		if gated {
			defer lu.pr.gate.leave(epoch)
		}
	}
	if lu.sanitizing.Load() && !o.noUA {
		// SBC-4 §4.11.2: only INQUIRY, REPORT LUNS and REQUEST SENSE
		// are served while a sanitize operation runs.
		d.fail(lu, c, scsi.NotReadySanitizing())
		return
	}
	if s := d.aluaRefuses(c.Nexus, o); s != nil {
		d.fail(lu, c, s)
		return
	}
	if o.media {
		if s := lu.notReady(); s != nil {
			d.fail(lu, c, s)
			return
		}
	}
	if o.writes {
		if wp, s := lu.writeProtected(); wp {
			d.fail(lu, c, s)
			return
		}
		if lu.store.Latched() != nil {
			d.fail(lu, c, scsi.MediumError(true, 0)) // WRITE ERROR: see blockcore.Store.Latched
			return
		}
	}
	d.fail(lu, c, o.fn(lu, c))
}

// fail records err as the command's outcome (nil is success).
func (d *Device) fail(lu *LU, c *Command, err error) {
	if err == nil {
		return
	}
	if err == errReservationConflict {
		c.Status = scsi.StatusReservationConflict
		return
	}
	var s *scsi.Sense
	if !errors.As(err, &s) {
		d.log.Error("scsi command failed", "lun", c.LUN, "op", c.CDB[0], "err", err)
		s = &scsi.Sense{Key: scsi.SenseHardwareError, ASC: 0x44, Bit: -1} // internal target failure
	}
	c.Status = scsi.StatusCheckCondition
	var out []byte
	if lu != nil && lu.descriptorSense() {
		out = s.AppendDescriptor(c.Sense[:0])
	} else {
		out = s.AppendFixed(c.Sense[:0])
	}
	c.SenseLen = len(out)
}

// putData copies the response data of a non-media command into c.Data,
// bounded by the allocation length, and sets Transfer.
func (c *Command) putData(data []byte, alloc int) {
	n := min(len(data), alloc)
	c.Transfer = n
	copy(c.Data, data[:n])
}

func allocLen(cdb []byte) int {
	n, _ := scsi.AllocationLength(cdb)
	return int(n)
}

func cmdTestUnitReady(lu *LU, c *Command) error {
	if s := lu.notReady(); s != nil {
		return s
	}
	return nil
}

func cmdRequestSense(lu *LU, c *Command) error {
	desc := c.CDB[1]&0x01 != 0
	s := &scsi.Sense{Bit: -1}
	if c.Nexus != nil {
		if ua, ok := c.Nexus.takeUA(lu.lun); ok {
			s = &ua
		}
	}
	if s.Key == scsi.SenseNoSense {
		if nr := lu.notReady(); nr != nil {
			s = nr
		}
	}
	var b []byte
	if desc {
		b = s.AppendDescriptor(nil)
	} else {
		b = s.AppendFixed(nil)
	}
	c.putData(b, allocLen(c.CDB))
	return nil
}

func (d *Device) reportLuns(c *Command) error {
	sel := c.CDB[2]
	alloc := int(binary.BigEndian.Uint32(c.CDB[6:10]))
	if alloc < 16 && alloc != 0 {
		// SPC-4 §6.33: allocation length below 16 is INVALID FIELD IN CDB.
		return scsi.InvalidFieldInCDB(6, -1)
	}
	var luns []uint64
	switch sel {
	case 0x00, 0x02:
		luns = d.visibleLUNs(c.Nexus) // the nexus's view (Nexus.LUNs)
	case 0x01:
		// Well-known LUNs only: we have none.
	default:
		return scsi.InvalidFieldInCDB(2, -1)
	}
	b := make([]byte, 8, 8+8*len(luns))
	binary.BigEndian.PutUint32(b[0:], uint32(8*len(luns)))
	for _, l := range luns {
		e := scsi.EncodeLUN(l)
		b = append(b, e[:]...)
	}
	c.putData(b, alloc)
	return nil
}

func cmdReadCapacity10(lu *LU, c *Command) error {
	lba := binary.BigEndian.Uint32(c.CDB[2:6])
	if c.CDB[8]&1 == 0 && lba != 0 {
		// SBC-4 §5.20.2: with PMI 0 the LBA field must be zero.
		return scsi.InvalidFieldInCDB(2, -1)
	}
	var b [8]byte
	last := lu.Blocks() - 1
	if last > 0xffffffff {
		last = 0xffffffff // READ CAPACITY(16) needed
	}
	binary.BigEndian.PutUint32(b[0:], uint32(last))
	binary.BigEndian.PutUint32(b[4:], uint32(lu.blockSize))
	c.putData(b[:], 8)
	return nil
}

func cmdReadCapacity16(lu *LU, c *Command) error {
	alloc := allocLen(c.CDB)
	var b [32]byte
	binary.BigEndian.PutUint64(b[0:], lu.Blocks()-1)
	binary.BigEndian.PutUint32(b[8:], uint32(lu.blockSize))
	// LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT stays 0: provisioning is
	// tracked per logical block, and GET LBA STATUS answers at that
	// granularity (libiscsi's GetLBAStatus.UnmapSingle expects descriptors
	// on physical-block boundaries otherwise).
	if lu.unmapper != nil && !lu.readOnly {
		b[14] = 0x80 | 0x40 // LBPME: provisioning management; LBPRZ: unmapped blocks read zeroes
	}
	c.putData(b[:], alloc)
	return nil
}

// rangeCheck validates [lba, lba+blocks) against the capacity.
func (lu *LU) rangeCheck(lba uint64, blocks uint64) error {
	n := lu.Blocks()
	if lba > n || blocks > n-lba {
		return scsi.LBAOutOfRange(lba)
	}
	return nil
}

// dataRange decodes a READ/WRITE-style CDB, checks its range and sets
// Transfer; n is how much of the fabric's buffer the command moves.
func (lu *LU) dataRange(c *Command) (rw scsi.RW, n int, err error) {
	rw, err = scsi.DecodeRW(c.CDB)
	if err != nil {
		return rw, 0, scsi.InvalidFieldInCDB(0, -1)
	}
	if err := lu.rangeCheck(rw.LBA, uint64(rw.Blocks)); err != nil {
		return rw, 0, err
	}
	want := int(rw.Blocks) << lu.blockBits
	c.Transfer = want
	return rw, min(want, len(c.Data)), nil
}

func cmdRead(lu *LU, c *Command) error {
	rw, n, err := lu.dataRange(c)
	if err != nil || n == 0 {
		return err
	}
	if _, err := lu.be.ReadAt(c.Data[:n], int64(rw.LBA)<<lu.blockBits); err != nil {
		lu.dev.log.Error("backend read failed", "lun", lu.lun, "lba", rw.LBA, "err", err)
		return ioFailed(err, false, rw.LBA)
	}
	return nil
}

func cmdWrite(lu *LU, c *Command) error {
	rw, err := scsi.DecodeRW(c.CDB)
	if err != nil {
		return scsi.InvalidFieldInCDB(0, -1)
	}
	return lu.write(c, rw)
}

func (lu *LU) write(c *Command, rw scsi.RW) error {
	if err := lu.rangeCheck(rw.LBA, uint64(rw.Blocks)); err != nil {
		return err
	}
	want := int(rw.Blocks) << lu.blockBits
	c.Transfer = want
	// When the fabric's transfer length is shorter than the CDB asks for,
	// the command is processed normally except that data beyond it is
	// neither requested nor written (FCP-4 §9.4.2 a, the behaviour
	// libiscsi's residual tests expect); the fabric reports the overflow.
	n := min(want, len(c.Data))
	if n == 0 {
		return nil
	}
	// SBC-4 §4.15: FUA, or a disabled write cache, makes the write durable
	// before status is returned (blockcore.Store.Write).
	if err := lu.store.Write(c.Data[:n], int64(rw.LBA)<<lu.blockBits, rw.FUA); err != nil {
		return ioFailed(err, true, rw.LBA)
	}
	return nil
}

func cmdWriteVerify(lu *LU, c *Command) error {
	rw, err := scsi.DecodeRW(c.CDB)
	if err != nil {
		return scsi.InvalidFieldInCDB(0, -1)
	}
	if rw.BytChk > 1 {
		// SBC-4 §5.41: BYTCHK 10b and 11b are reserved for WRITE AND VERIFY.
		return scsi.InvalidFieldInCDB(1, 2)
	}
	// The data is verified by the write itself: the backend either stored
	// it or failed. Force durability so a verify is meaningful.
	rw.FUA = true
	return lu.write(c, rw)
}

func cmdVerify(lu *LU, c *Command) error {
	rw, err := scsi.DecodeRW(c.CDB)
	if err != nil {
		return scsi.InvalidFieldInCDB(0, -1)
	}
	if err := lu.rangeCheck(rw.LBA, uint64(rw.Blocks)); err != nil {
		return err
	}
	if rw.BytChk == 2 {
		return scsi.InvalidFieldInCDB(1, 2)
	}
	if rw.BytChk == 0 || rw.Blocks == 0 {
		return nil // medium verification: our media have no unreadable blocks
	}
	want := int(rw.Blocks) << lu.blockBits
	cmpLen := want
	if rw.BytChk == 3 {
		cmpLen = lu.blockSize // one block compared against each
	}
	c.Transfer = cmpLen
	if len(c.Data) < cmpLen {
		return scsi.InvalidFieldInIU()
	}
	buf := make([]byte, lu.blockSize)
	for i := uint32(0); i < rw.Blocks; i++ {
		lba := rw.LBA + uint64(i)
		if _, err := lu.be.ReadAt(buf, int64(lba)<<lu.blockBits); err != nil {
			return ioFailed(err, false, lba)
		}
		ref := c.Data[:lu.blockSize]
		if rw.BytChk == 1 {
			ref = c.Data[int(i)<<lu.blockBits:][:lu.blockSize]
		}
		for j := range buf {
			if buf[j] != ref[j] {
				off := uint64(i)<<lu.blockBits + uint64(j)
				if rw.BytChk == 3 {
					off = uint64(i) << lu.blockBits
				}
				return scsi.Miscompare(off)
			}
		}
	}
	return nil
}

func cmdSyncCache(lu *LU, c *Command) error {
	rw, err := scsi.DecodeRW(c.CDB)
	if err != nil {
		return scsi.InvalidFieldInCDB(0, -1)
	}
	// SBC-4 §5.24: NUMBER OF LOGICAL BLOCKS 0 means to the end of the medium.
	if err := lu.rangeCheck(rw.LBA, uint64(rw.Blocks)); err != nil {
		return err
	}
	if err := lu.Flush(); err != nil {
		lu.dev.log.Error("backend flush failed", "lun", lu.lun, "err", err)
		return ioFailed(err, true, rw.LBA)
	}
	return nil
}

func cmdUnmap(lu *LU, c *Command) error {
	if lu.unmapper == nil {
		return scsi.InvalidOpcode()
	}
	plen := int(binary.BigEndian.Uint16(c.CDB[7:9]))
	if plen == 0 {
		return nil
	}
	if plen < 8 || len(c.Data) < plen {
		return scsi.ParameterListLengthError()
	}
	p := c.Data[:plen]
	c.Transfer = plen
	bdl := int(binary.BigEndian.Uint16(p[2:4]))
	if int(binary.BigEndian.Uint16(p[0:2])) < 6 || bdl%16 != 0 || 8+bdl > plen {
		return scsi.ParameterListLengthError()
	}
	if bdl/16 > maxUnmapDescriptors {
		return scsi.InvalidFieldInParameterList(2, -1)
	}
	type ext struct{ lba, n uint64 }
	// Validate every descriptor before touching the medium (SBC-4 §5.31).
	for i := 0; i < bdl; i += 16 {
		d := p[8+i:]
		lba := binary.BigEndian.Uint64(d[0:8])
		n := uint64(binary.BigEndian.Uint32(d[8:12]))
		if err := lu.rangeCheck(lba, n); err != nil {
			return err
		}
		if n > maxUnmapBlocks {
			return scsi.InvalidFieldInParameterList(8+i+8, -1)
		}
	}
	for i := 0; i < bdl; i += 16 {
		d := p[8+i:]
		e := ext{binary.BigEndian.Uint64(d[0:8]), uint64(binary.BigEndian.Uint32(d[8:12]))}
		if e.n == 0 {
			continue
		}
		// Through the unit: against compare-and-write as a write is.
		if err := lu.unit.Unmap(int64(e.lba)<<lu.blockBits, int64(e.n)<<lu.blockBits); err != nil {
			lu.dev.log.Error("backend unmap failed", "lun", lu.lun, "lba", e.lba, "err", err)
			return ioFailed(err, true, e.lba)
		}
	}
	return nil
}

const (
	maxUnmapDescriptors = 256
	maxUnmapBlocks      = 1 << 20
	maxTransferBlocks   = 1 << 16
)

// cmdGetLBAStatus answers GET LBA STATUS (SBC-4 §5.7) from the backend's
// provisioning map; a backend without one is fully mapped.
func cmdGetLBAStatus(lu *LU, c *Command) error {
	start := binary.BigEndian.Uint64(c.CDB[2:10])
	alloc := allocLen(c.CDB)
	n := lu.Blocks()
	if start >= n {
		return scsi.LBAOutOfRange(start)
	}
	b := make([]byte, 8, 8+16*8)
	lba := start
	for len(b) < 8+16*64 && lba < n && len(b)+16 <= max(alloc, 24) {
		mapped, endBlk := true, n
		if m, ok := lu.be.(backend.Mapper); ok {
			mp, end, err := m.Mapped(int64(lba) << lu.blockBits)
			if err != nil {
				return ioFailed(err, false, lba)
			}
			mapped = mp
			endBlk = min(uint64(end+int64(lu.blockSize)-1)>>lu.blockBits, n)
		}
		if endBlk <= lba {
			endBlk = lba + 1
		}
		count := min(endBlk-lba, 0xffffffff)
		var d [16]byte
		binary.BigEndian.PutUint64(d[0:], lba)
		binary.BigEndian.PutUint32(d[8:], uint32(count))
		if !mapped {
			d[12] = 0x01 // deallocated
		}
		b = append(b, d[:]...)
		lba += count
	}
	binary.BigEndian.PutUint32(b[0:], uint32(len(b)-4))
	c.putData(b, alloc)
	return nil
}

func cmdStartStop(lu *LU, c *Command) error {
	pc := c.CDB[4] >> 4
	if pc != 0 {
		// Power conditions other than START_VALID are accepted and leave the
		// LU ready: we have no power states.
		return nil
	}
	start, loej := c.CDB[4]&0x01 != 0, c.CDB[4]&0x02 != 0
	if loej && !lu.removable {
		if !start {
			// LOEJ with START=0 ejects: the medium is not removable (RMB=0).
			return scsi.InvalidFieldInCDB(4, 1)
		}
		loej = false
	}
	if !start && c.CDB[4]&0x04 == 0 {
		if err := lu.Flush(); err != nil {
			return ioFailed(err, true, 0)
		}
	}
	lu.stateMu.Lock()
	defer lu.stateMu.Unlock()
	if loej && len(lu.prevent) > 0 {
		// SBC-4 §5.25: MEDIUM REMOVAL PREVENTED, for loading as for
		// ejecting.
		return &scsi.Sense{Key: scsi.SenseIllegalRequest, ASC: 0x53, ASCQ: 0x02, Bit: -1}
	}
	if lu.removable {
		// A removable medium is ready while loaded: only LOEJ changes
		// that (as LIO and tgt behave; libiscsi's NoLoej expects it).
		if loej {
			lu.ejected = !start
		}
		return nil
	}
	lu.stopped = !start
	return nil
}

// cmdPreventAllow is PREVENT ALLOW MEDIUM REMOVAL (SBC-4 §5.11): each
// nexus's prevention counts until it allows again, its nexus ends or the
// LU is reset.
func cmdPreventAllow(lu *LU, c *Command) error {
	prevent := c.CDB[4] & 0x03
	if prevent > 1 {
		return scsi.InvalidFieldInCDB(4, 1) // the changer forms do not apply
	}
	lu.stateMu.Lock()
	defer lu.stateMu.Unlock()
	if prevent == 1 {
		if lu.prevent == nil {
			lu.prevent = map[*Nexus]bool{}
		}
		lu.prevent[c.Nexus] = true
	} else {
		delete(lu.prevent, c.Nexus)
	}
	return nil
}

// ioFailed is the sense for a failed backend operation: a medium error,
// or — when the storage is only out of reach for now (a gateway's remote
// target reconnecting, backend.ErrUnavailable) — ABORTED COMMAND, LOGICAL
// UNIT COMMUNICATION FAILURE (0B/08/00), which initiators retry.
func ioFailed(err error, write bool, lba uint64) *scsi.Sense {
	if errors.Is(err, backend.ErrUnavailable) {
		return &scsi.Sense{Key: scsi.SenseAbortedCommand, ASC: 0x08, ASCQ: 0x00, Bit: -1}
	}
	return scsi.MediumError(write, lba)
}
