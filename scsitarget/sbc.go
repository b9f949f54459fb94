package scsitarget

import (
	"encoding/binary"
	"errors"

	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/scsi"
)

// Block commands beyond plain reads and writes (SBC-4).

// Limits reported in the Block Limits VPD page (B0h).
const (
	maxCompareAndWriteBlocks = 255     // MAXIMUM COMPARE AND WRITE LENGTH (one byte)
	maxWriteSameBlocks       = 1 << 22 // MAXIMUM WRITE SAME LENGTH
	maxAtomicBlocks          = 2048    // MAXIMUM ATOMIC TRANSFER LENGTH
)

// cmdWriteAtomic is WRITE ATOMIC(16) (SBC-4 §5.48): the write is all or
// nothing for readers and other writers — it runs with the LU's writes
// excluded. Atomic boundaries are not offered (MAXIMUM ATOMIC BOUNDARY
// SIZE 0), so ATOMIC BOUNDARY must be 0.
func cmdWriteAtomic(lu *LU, c *Command) error {
	lba := binary.BigEndian.Uint64(c.CDB[2:10])
	if binary.BigEndian.Uint16(c.CDB[10:12]) != 0 {
		return scsi.InvalidFieldInCDB(10, -1)
	}
	blocks := uint32(binary.BigEndian.Uint16(c.CDB[12:14]))
	if blocks > maxAtomicBlocks {
		return scsi.InvalidFieldInCDB(12, -1)
	}
	rw := scsi.RW{LBA: lba, Blocks: blocks, FUA: c.CDB[1]&0x08 != 0}
	if err := lu.rangeCheck(lba, uint64(blocks)); err != nil {
		return err
	}
	defer lu.store.Exclusive()()
	want := int(blocks) << lu.blockBits
	c.Transfer = want
	n := min(want, len(c.Data))
	if n == 0 {
		return nil
	}
	if _, err := lu.be.WriteAt(c.Data[:n], int64(lba)<<lu.blockBits); err != nil {
		return ioFailed(err, true, lba)
	}
	return lu.flushIf(rw.FUA, lba)
}

// cmdPreFetch is PRE-FETCH(10/16) (SBC-4 §5.9, §5.10): our backends have
// no cache to load, so a valid range is simply GOOD (CONDITION MET is only
// for caches that could hold the range).
func cmdPreFetch(lu *LU, c *Command) error {
	rw, err := scsi.DecodeRW(c.CDB)
	if err != nil {
		return scsi.InvalidFieldInCDB(0, -1)
	}
	return lu.rangeCheck(rw.LBA, uint64(rw.Blocks))
}

// cmdReadDefectData is READ DEFECT DATA(10/12) (SBC-4 §5.12, §5.13): the
// lists are valid and empty, in the format asked for.
func cmdReadDefectData(lu *LU, c *Command) error {
	if c.CDB[0] == scsi.OpReadDefectData10 {
		b := []byte{0, c.CDB[2] & 0x1f, 0, 0} // PLISTV, GLISTV, format; length 0
		c.putData(b, int(binary.BigEndian.Uint16(c.CDB[7:9])))
		return nil
	}
	b := []byte{0, c.CDB[1] & 0x1f, 0, 0, 0, 0, 0, 0}
	c.putData(b, int(binary.BigEndian.Uint32(c.CDB[6:10])))
	return nil
}

// cmdWriteSame is WRITE SAME(10/16) (SBC-4 §5.50, §5.51): one block of
// data-out (or zeroes with NDOB) written over the range, or — UNMAP set —
// the range deallocated, reading back as zeroes (LBPRZ), whatever the
// block holds (as LIO does; initiators such as libiscsi's tests send a
// non-zero block with UNMAP and expect zeroes).
func cmdWriteSame(lu *LU, c *Command) error {
	rw, err := scsi.DecodeRW(c.CDB)
	if err != nil {
		return scsi.InvalidFieldInCDB(0, -1)
	}
	unmap := c.CDB[1]&0x08 != 0
	if c.CDB[1]&0x10 != 0 { // ANCHOR: anchored blocks are not supported (ANC_SUP 0)
		return scsi.InvalidFieldInCDB(1, 4)
	}
	ndob := c.CDB[0] == scsi.OpWriteSame16 && c.CDB[1]&0x01 != 0
	if rw.LBA >= lu.Blocks() {
		return scsi.LBAOutOfRange(rw.LBA)
	}
	blocks := uint64(rw.Blocks)
	if blocks == 0 {
		// WSNZ is 0: zero blocks means to the end of the medium (SBC-4
		// §5.50), within MAXIMUM WRITE SAME LENGTH.
		blocks = lu.Blocks() - rw.LBA
	}
	if blocks > maxWriteSameBlocks {
		return scsi.InvalidFieldInCDB(c.lenField(), -1)
	}
	if err := lu.rangeCheck(rw.LBA, blocks); err != nil {
		return err
	}
	if unmap && lu.unmapper == nil {
		return scsi.InvalidFieldInCDB(1, 3)
	}
	block := make([]byte, lu.blockSize)
	if !ndob {
		c.Transfer = lu.blockSize
		if len(c.Data) != lu.blockSize {
			// Exactly one logical block of data-out (SBC-4 §5.50).
			return scsi.InvalidFieldInCDB(c.lenField(), -1)
		}
		copy(block, c.Data[:lu.blockSize])
	}
	off, n := int64(rw.LBA)<<lu.blockBits, int64(blocks)<<lu.blockBits
	defer lu.store.Shared()()
	if unmap {
		if err := lu.unmapper.Unmap(off, n); err != nil {
			return ioFailed(err, true, rw.LBA)
		}
		return lu.flushIf(rw.FUA, rw.LBA)
	}
	// Write in chunks of up to 1 MiB of repeated blocks.
	chunk := make([]byte, min(n, 1<<20))
	for i := 0; i < len(chunk); i += lu.blockSize {
		copy(chunk[i:], block)
	}
	for done := int64(0); done < n; {
		k := min(n-done, int64(len(chunk)))
		if _, err := lu.be.WriteAt(chunk[:k], off+done); err != nil {
			return ioFailed(err, true, rw.LBA+uint64(done>>lu.blockBits))
		}
		done += k
	}
	return lu.flushIf(rw.FUA, rw.LBA)
}

// lenField is the byte offset of a CDB's transfer length field.
func (c *Command) lenField() int {
	switch len(c.CDB) {
	case 10:
		return 7
	case 12:
		return 6
	}
	return 10
}

// flushIf makes the writes just done durable when FUA asks or the write
// cache is off (SBC-4 §4.15).
func (lu *LU) flushIf(fua bool, lba uint64) error {
	if fua || !lu.writeCache() {
		if err := lu.Flush(); err != nil {
			return ioFailed(err, true, lba)
		}
	}
	return nil
}

// cmdCompareAndWrite is COMPARE AND WRITE (SBC-4 §5.3): the first half of
// data-out is compared with the medium and, only if every byte matches,
// the second half is written — atomically against every other write to
// the LU. A mismatch is MISCOMPARE with the offset of the first differing
// byte in INFORMATION.
func cmdCompareAndWrite(lu *LU, c *Command) error {
	lba := binary.BigEndian.Uint64(c.CDB[2:10])
	blocks := uint64(c.CDB[13])
	if blocks == 0 {
		if len(c.Data) > 0 {
			// Data-out with nothing to compare: a NUMBER OF LOGICAL
			// BLOCKS the initiator could not encode (256 wraps to 0).
			return scsi.InvalidFieldInCDB(13, -1)
		}
		return nil
	}
	if blocks > uint64(lu.cawBlocks()) {
		return scsi.InvalidFieldInCDB(13, -1)
	}
	if err := lu.rangeCheck(lba, blocks); err != nil {
		return err
	}
	n := int(blocks) << lu.blockBits
	c.Transfer = 2 * n
	if len(c.Data) != 2*n {
		// The verify and write data, exactly (SBC-4 §5.3).
		return scsi.InvalidFieldInCDB(13, -1)
	}
	verify, data := c.Data[:n], c.Data[n:2*n]
	// The block core's compare-and-write (blockcore.Store), which NVMe's
	// fused Compare and Write shares.
	readErr, err := lu.store.CompareAndWrite(verify, data, int64(lba)<<lu.blockBits, c.CDB[1]&0x08 != 0 || !lu.writeCache())
	var mis *backend.MiscompareError
	if errors.As(err, &mis) {
		return scsi.Miscompare(uint64(mis.Offset))
	}
	if err != nil {
		return ioFailed(err, !readErr, lba)
	}
	return nil
}

// cawBlocks is MAXIMUM COMPARE AND WRITE LENGTH (VPD B0h): what the
// storage compares and writes atomically when it does so itself (shared
// storage, backend.CompareWriter), else what fits the one-byte field.
// Storage whose atomic unit is smaller than a block is compared here,
// under the store's write lock — atomic against this LU's writes only.
func (lu *LU) cawBlocks() int {
	if cw, ok := lu.be.(backend.CompareWriter); ok && cw.MaxCompareAndWrite() >= lu.blockSize {
		return min(maxCompareAndWriteBlocks, cw.MaxCompareAndWrite()/lu.blockSize)
	}
	return maxCompareAndWriteBlocks
}

// cmdOrWrite is ORWRITE(16) (SBC-4 §5.8): the data-out is ORed into the
// medium, atomically against other writes.
func cmdOrWrite(lu *LU, c *Command) error {
	rw, n, err := lu.dataRange(c)
	if err != nil || n == 0 {
		return err
	}
	cur := make([]byte, n)
	defer lu.store.Exclusive()()
	if _, err := lu.be.ReadAt(cur, int64(rw.LBA)<<lu.blockBits); err != nil {
		return ioFailed(err, false, rw.LBA)
	}
	for i := range cur {
		cur[i] |= c.Data[i]
	}
	if _, err := lu.be.WriteAt(cur, int64(rw.LBA)<<lu.blockBits); err != nil {
		return ioFailed(err, true, rw.LBA)
	}
	return lu.flushIf(rw.FUA, rw.LBA)
}

// SPC-2 reservations (RESERVE and RELEASE, SPC-2 §7.21–7.24): one
// nexus holds the LU; the others get RESERVATION CONFLICT for every
// command but INQUIRY, REPORT LUNS, REQUEST SENSE and RELEASE. The
// reservation ends with RELEASE, the holder's nexus loss, a LU reset or a
// target reset. The third-party and extent forms are not supported (their
// CDB bits are refused as INVALID FIELD IN CDB).

// errReservationConflict makes a handler end with RESERVATION CONFLICT
// status (no sense data).
var errReservationConflict = errors.New("reservation conflict")

func (lu *LU) reservedByOther(n *Nexus) bool {
	lu.stateMu.Lock()
	defer lu.stateMu.Unlock()
	return lu.reserver != nil && lu.reserver != n
}

// reservedByAny reports whether a nexus holds an SPC-2 reservation.
func (lu *LU) reservedByAny() bool {
	lu.stateMu.Lock()
	defer lu.stateMu.Unlock()
	return lu.reserver != nil
}

func cmdReserve(lu *LU, c *Command) error {
	if c.Nexus == nil {
		return scsi.InvalidOpcode()
	}
	if lu.prActive() {
		return errReservationConflict // SPC-4 §5.13.3: persistent reservations win
	}
	lu.stateMu.Lock()
	defer lu.stateMu.Unlock()
	if lu.reserver != nil && lu.reserver != c.Nexus {
		return errReservationConflict // lost a race with another RESERVE
	}
	lu.reserver = c.Nexus
	return nil
}

func cmdRelease(lu *LU, c *Command) error {
	if lu.prActive() {
		return errReservationConflict
	}
	// Releasing someone else's reservation, or none, is GOOD and changes
	// nothing (SPC-2 §7.21.2).
	lu.stateMu.Lock()
	if lu.reserver == c.Nexus {
		lu.reserver = nil
	}
	lu.stateMu.Unlock()
	return nil
}

// cmdSanitize is SANITIZE (SBC-4 §5.27, §4.11): OVERWRITE writes the
// initialization pattern (inverted between passes when INVERT is set)
// over every block, OVERWRITE COUNT times; BLOCK ERASE deallocates every
// block (they read back as zeroes, LBPRZ). EXIT FAILURE MODE is GOOD: a
// sanitize here never ends in the failure mode. While one runs (IMMED
// returns at once), media access is NOT READY, SANITIZE IN PROGRESS.
// CRYPTOGRAPHIC ERASE is not offered: nothing here is encrypted.
func cmdSanitize(lu *LU, c *Command) error {
	immed := c.CDB[1]&0x80 != 0
	plen := int(binary.BigEndian.Uint16(c.CDB[7:9]))
	var run func() error
	switch c.CDB[1] & 0x1f {
	case scsi.SASanitizeOverwrite:
		if plen < 5 || plen > lu.blockSize+4 {
			return scsi.InvalidFieldInCDB(7, -1)
		}
		c.Transfer = plen
		if len(c.Data) < plen {
			return scsi.ParameterListLengthError()
		}
		p := c.Data[:plen]
		count := int(p[0] & 0x1f)
		invert := p[0]&0x80 != 0
		ipl := int(binary.BigEndian.Uint16(p[2:4]))
		if count == 0 || ipl == 0 || ipl > lu.blockSize || ipl != plen-4 {
			return scsi.InvalidFieldInCDB(7, -1)
		}
		pattern := append([]byte(nil), p[4:4+ipl]...)
		run = func() error { return lu.overwrite(pattern, count, invert) }
	case scsi.SASanitizeBlockErase:
		if plen != 0 {
			return scsi.InvalidFieldInCDB(7, -1)
		}
		if lu.unmapper == nil {
			return scsi.InvalidFieldInCDB(1, 4)
		}
		run = func() error { return lu.unmapper.Unmap(0, int64(lu.Blocks())<<lu.blockBits) }
	case scsi.SASanitizeExitFailure:
		if plen != 0 {
			return scsi.InvalidFieldInCDB(7, -1)
		}
		return nil
	default:
		return scsi.InvalidFieldInCDB(1, 4)
	}
	if !lu.sanitizing.CompareAndSwap(false, true) {
		return scsi.NotReadySanitizing()
	}
	finish := func() error {
		defer lu.sanitizing.Store(false)
		defer lu.store.Exclusive()()
		if err := run(); err != nil {
			lu.dev.log.Error("sanitize failed", "lun", lu.lun, "err", err)
			return ioFailed(err, true, 0)
		}
		return lu.flushIf(true, 0)
	}
	if immed {
		go finish()
		return nil
	}
	return finish()
}

// overwrite fills the LU with pattern repeated, count times.
func (lu *LU) overwrite(pattern []byte, count int, invert bool) error {
	chunk := make([]byte, 1<<20)
	for pass := 0; pass < count; pass++ {
		for i := range chunk {
			v := pattern[(i%lu.blockSize)%len(pattern)]
			if invert && pass%2 == 1 {
				v = ^v
			}
			chunk[i] = v
		}
		size := int64(lu.Blocks()) << lu.blockBits
		for off := int64(0); off < size; off += int64(len(chunk)) {
			n := min(int64(len(chunk)), size-off)
			if _, err := lu.be.WriteAt(chunk[:n], off); err != nil {
				return err
			}
		}
	}
	return nil
}
