package main

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

// logBuilder writes a log as dm-log-writes lays it out (see logwrites.go).
type logBuilder struct {
	ss      int
	buf     []byte
	entries uint64
}

func newLog(ss int) *logBuilder { return &logBuilder{ss: ss, buf: make([]byte, ss)} }

func (l *logBuilder) entry(sector, sectors, flags uint64, mark string, data []byte) {
	hdr := make([]byte, l.ss)
	le := binary.LittleEndian
	le.PutUint64(hdr, sector)
	le.PutUint64(hdr[8:], sectors)
	le.PutUint64(hdr[16:], flags)
	if mark != "" {
		le.PutUint64(hdr[24:], uint64(len(mark)))
		copy(hdr[entryLen:], mark)
	}
	l.buf = append(append(l.buf, hdr...), data...)
	l.entries++
}

func (l *logBuilder) write(sector uint64, fill byte, sectors int, flags uint64) {
	l.entry(sector, uint64(sectors), flags, "", bytes.Repeat([]byte{fill}, sectors*l.ss))
}

func (l *logBuilder) bytes() []byte {
	le := binary.LittleEndian
	le.PutUint64(l.buf, logMagic)
	le.PutUint64(l.buf[8:], logVersion)
	le.PutUint64(l.buf[16:], l.entries)
	le.PutUint32(l.buf[24:], uint32(l.ss))
	return l.buf
}

// image is an io.WriterAt over a byte slice.
type image []byte

func (m image) WriteAt(p []byte, off int64) (int, error) { return copy(m[off:], p), nil }

func TestReplayUpToTheMark(t *testing.T) {
	for _, ss := range []int{512, 4096} {
		l := newLog(ss)
		l.write(0, 'a', 2, 0) // flushed by the flush below
		l.write(4, 'b', 1, 0) //
		l.entry(0, 0, flagFlush, "", nil)
		l.write(1, 'c', 1, flagFUA) // a FUA write over part of 'a'
		l.entry(5, 2, flagDiscard, "", nil)
		l.entry(0, 0, flagMark, "other", nil)
		l.write(6, 'd', 1, flagFUA)
		l.entry(0, 0, flagMark, "powercut", nil)
		l.write(0, 'x', 8, 0) // durable only after the cut: lost
		l.write(2, 'y', 1, flagFUA)
		l.write(7, 'z', 1, 0)
		l.entry(0, 0, flagMark, "dm-log-writes-end", nil)
		img := image(bytes.Repeat([]byte{'.'}, 8*ss))
		st, err := replay(bytes.NewReader(l.bytes()), img, int64(len(img)), "powercut", region{Off: int64(2 * ss), Len: int64(ss)})
		if err != nil {
			t.Fatal(err)
		}
		// Of the three lost writes, two touch sector 2.
		want := replayStats{Writes: 4, Discards: 1, Flushes: 1, FUA: 2, Lost: 3, LostIn: 2}
		if st != want {
			t.Errorf("sector size %d: %+v, want %+v", ss, st, want)
		}
		var got strings.Builder
		for i := range 8 {
			got.WriteByte(img[i*ss])
		}
		// Sector 5 discarded, then sector 6 written by 'd'.
		if got.String() != "ac..b\x00d." {
			t.Errorf("sector size %d: image %q", ss, got.String())
		}
	}
}

func TestReplayRefusesWhatIsNotALog(t *testing.T) {
	l := newLog(512)
	l.write(0, 'a', 1, 0)
	good := l.bytes()
	for name, c := range map[string]struct {
		log  []byte
		want string
	}{
		"no mark":   {good, `no mark "powercut"`},
		"magic":     {append([]byte{0}, good[1:]...), "magic"},
		"truncated": {good[:len(good)-100], "the data of entry 0"},
		"sector":    {func() []byte { b := bytes.Clone(good); b[24] = 100; return b }(), "sector size"},
		"outside":   {func() []byte { l := newLog(512); l.write(8, 'a', 1, 0); return l.bytes() }(), "of a device of 8"},
	} {
		_, err := replay(bytes.NewReader(c.log), image(make([]byte, 4096)), 4096, "powercut", region{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
}

// FuzzReplay: whatever the log holds, replay neither panics nor writes
// outside the device (the image below panics if it does), nor allocates
// more than the device's size for an entry.
func FuzzReplay(f *testing.F) {
	l := newLog(512)
	l.write(0, 'a', 2, 0)
	l.entry(0, 0, flagFlush, "", nil)
	l.write(3, 'b', 1, flagFUA)
	l.entry(0, 0, flagMark, "powercut", nil)
	l.write(1, 'c', 1, 0)
	f.Add(l.bytes())
	f.Add(newLog(4096).bytes())
	f.Fuzz(func(t *testing.T, log []byte) {
		img := image(make([]byte, 8*512))
		replay(bytes.NewReader(log), img, int64(len(img)), "powercut", region{Off: 512, Len: 512})
	})
}
