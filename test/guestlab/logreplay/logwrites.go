package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

// The log that Linux's dm-log-writes target (drivers/md/dm-log-writes.c)
// writes: a super block at byte 0, then its entries one after another,
// each an entry header in one sector of the data device's logical block
// size, followed by the data written (nr_sectors such sectors) unless it
// is a discard, a flush without data or a mark. The target logs a write
// only once it is on stable storage as the block layer sees it — after a
// flush that followed its completion, or at once for a FUA write — so the
// log read in order is the order in which writes became durable, and a
// mark sent to the target (dmsetup message … mark NAME) falls between
// what was durable then and what was not.
const (
	logMagic   = 0x6a736677736872
	logVersion = 1

	flagFlush   = 1 << 0
	flagFUA     = 1 << 1
	flagDiscard = 1 << 2
	flagMark    = 1 << 3 // (1 << 4 marks metadata writes: replayed as any other)

	superLen = 28 // magic, version, nr_entries (8 each), sectorsize (4)
	entryLen = 32 // sector, nr_sectors, flags, data_len (8 each)
)

// logSuper is the log's super block.
type logSuper struct {
	Entries    uint64
	SectorSize uint32
}

// logEntry is one entry: a write of Sectors sectors at Sector (in units
// of the super block's sector size), a discard of them, a flush, or a
// mark named Mark. DataOff is where a write's data starts in the log.
type logEntry struct {
	Sector, Sectors, Flags uint64
	Mark                   string
	DataOff                int64
}

func (e logEntry) is(f uint64) bool { return e.Flags&f != 0 }

// parseSuper decodes the super block.
func parseSuper(b []byte) (logSuper, error) {
	if len(b) < superLen {
		return logSuper{}, errors.New("log-writes: short super block")
	}
	le := binary.LittleEndian
	if m := le.Uint64(b); m != logMagic {
		return logSuper{}, fmt.Errorf("log-writes: magic %#x, want %#x (not a dm-log-writes log)", m, logMagic)
	}
	if v := le.Uint64(b[8:]); v != logVersion {
		return logSuper{}, fmt.Errorf("log-writes: version %d, want %d", v, logVersion)
	}
	s := logSuper{Entries: le.Uint64(b[16:]), SectorSize: le.Uint32(b[24:])}
	if s.SectorSize < 512 || s.SectorSize > 64<<10 || s.SectorSize&(s.SectorSize-1) != 0 {
		return logSuper{}, fmt.Errorf("log-writes: sector size %d", s.SectorSize)
	}
	return s, nil
}

// parseEntry decodes the header sector of the entry at off (hdr is that
// sector).
func parseEntry(hdr []byte, off int64) (logEntry, error) {
	if len(hdr) < entryLen {
		return logEntry{}, errors.New("log-writes: short entry")
	}
	le := binary.LittleEndian
	e := logEntry{Sector: le.Uint64(hdr), Sectors: le.Uint64(hdr[8:]), Flags: le.Uint64(hdr[16:]), DataOff: off + int64(len(hdr))}
	dataLen := le.Uint64(hdr[24:])
	switch {
	case e.is(flagMark):
		if dataLen > uint64(len(hdr)-entryLen) {
			return logEntry{}, fmt.Errorf("log-writes: a mark of %d bytes in a %d-byte sector", dataLen, len(hdr))
		}
		e.Mark = strings.TrimRight(string(hdr[entryLen:entryLen+dataLen]), "\x00")
	case dataLen != 0:
		// The target writes inline data for nothing a block device sends.
		return logEntry{}, fmt.Errorf("log-writes: an entry at %d with %d bytes of inline data", off, dataLen)
	}
	return e, nil
}

// size is how many bytes of the log the entry takes, its header included.
func (e logEntry) size(sector uint32) int64 {
	n := int64(sector)
	if !e.is(flagDiscard) && !e.is(flagMark) {
		n += int64(e.Sectors) * int64(sector)
	}
	return n
}

// replayStats says what a replay did.
type replayStats struct {
	Writes, Discards, Flushes, FUA int // applied, up to the mark
	Lost                           int // writes logged after the mark: not durable when it was set
	LostIn                         int // of them, those that touch the region replay was given
}

// region is a byte range of the device (Len 0: none).
type region struct{ Off, Len int64 }

func (r region) touches(off, n int64) bool { return r.Len > 0 && off < r.Off+r.Len && r.Off < off+n }

// replay applies the log's writes and discards to img, a device of size
// bytes, in order up to the mark named mark, and counts the writes after
// it, and of them those that touch watch. It fails when the mark is not
// in the log, and on an entry outside the device (a log of another
// device, or a damaged one).
func replay(log io.ReaderAt, img io.WriterAt, size int64, mark string, watch region) (replayStats, error) {
	var st replayStats
	sb := make([]byte, 512)
	if _, err := log.ReadAt(sb, 0); err != nil {
		return st, fmt.Errorf("log-writes: reading the super block: %w", err)
	}
	sup, err := parseSuper(sb)
	if err != nil {
		return st, err
	}
	ss := int64(sup.SectorSize)
	hdr := make([]byte, ss)
	var data []byte
	found := false
	off := ss
	for i := uint64(0); i < sup.Entries; i++ {
		if _, err := log.ReadAt(hdr, off); err != nil {
			return st, fmt.Errorf("log-writes: entry %d of %d at %d: %w", i, sup.Entries, off, err)
		}
		e, err := parseEntry(hdr, off)
		if err != nil {
			return st, err
		}
		off += e.size(sup.SectorSize)
		switch {
		case e.is(flagMark):
			if e.Mark == mark && !found {
				found = true
			}
			continue
		case found:
			if e.Sectors > 0 && !e.is(flagDiscard) {
				st.Lost++
				if watch.touches(int64(e.Sector)*ss, int64(e.Sectors)*ss) {
					st.LostIn++
				}
			}
			continue
		}
		if e.is(flagFlush) {
			st.Flushes++
		}
		if e.is(flagFUA) {
			st.FUA++
		}
		if e.Sectors == 0 {
			continue
		}
		if devSectors := uint64(size / ss); e.Sector >= devSectors || e.Sectors > devSectors-e.Sector {
			return st, fmt.Errorf("log-writes: entry %d writes sectors [%d,+%d) of a device of %d", i, e.Sector, e.Sectors, devSectors)
		}
		n := int64(e.Sectors) * ss
		if int64(cap(data)) < n {
			data = make([]byte, n)
		}
		b := data[:n]
		if e.is(flagDiscard) {
			clear(b)
			st.Discards++
		} else {
			if _, err := log.ReadAt(b, e.DataOff); err != nil {
				return st, fmt.Errorf("log-writes: the data of entry %d: %w", i, err)
			}
			st.Writes++
		}
		if _, err := img.WriteAt(b, int64(e.Sector)*ss); err != nil {
			return st, err
		}
	}
	if !found {
		return st, fmt.Errorf("log-writes: no mark %q among the log's %d entries", mark, sup.Entries)
	}
	return st, nil
}
