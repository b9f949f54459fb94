// Package file is a backend on a regular file or a block device. A missing
// file is created sparse at the requested size, an existing one is served at
// its own size (grown only when asked, never shrunk); Flush is fdatasync and Unmap
// punches holes.
//
// Reads and writes go through an io_uring (internal/uring) or through
// pread/pwrite, as Options.Engine says; FUA writes are RWF_DSYNC writes
// either way. EngineAuto takes the ring where it saves work and only
// there (measured in docs/bench/journal.md):
//   - O_DIRECT reads and writes: the ring (the device works while no
//     thread waits);
//   - buffered reads on a filesystem with RWF_NOWAIT reads (ext4, xfs,
//     block devices): the ring — cached data is copied inline, a miss
//     waits on the page without a thread;
//   - buffered writes, and every buffered I/O on a filesystem without
//     RWF_NOWAIT (tmpfs): pread/pwrite — the ring could only hand them
//     to a kernel worker thread (36 µs against 0.6 µs for a 4 KiB tmpfs
//     read), while the plain call copies to or from the page cache at
//     once.
//
// Options.Direct opens the file with O_DIRECT: the page cache is bypassed
// and I/O must be aligned to the file's direct-I/O alignment (its offsets
// by the LU's block size, checked at Open; buffers that are not aligned
// in memory go through an aligned bounce buffer, and so does the rare
// I/O of less than the alignment — a residual underflow's partial block
// — a write as a read-modify-write of the blocks it touches).
package file

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/blockwire/blockwire/internal/uring"
	"golang.org/x/sys/unix"
)

// Engines: how reads and writes reach the kernel.
const (
	EngineAuto  = "auto"     // io_uring where it saves work (see above), else pread
	EngineURing = "io_uring" // io_uring or fail
	EnginePread = "pread"    // pread/pwrite from the caller's goroutine
)

// ringEntries bounds the operations in flight on one file's ring; more
// callers wait for a slot.
const ringEntries = 256

// File is a file-backed disk. It is safe for concurrent use.
type File struct {
	f         *os.File
	fd        int
	size      atomic.Int64 // read on every I/O, changed by Resize
	regular   bool         // a regular file (not a block device): it can be resized
	readOnly  bool
	ring      *uring.Ring // nil: pread/pwrite
	ringRead  bool        // reads go through ring
	ringWrite bool        // writes go through ring
	why       string      // why some I/O does not take the ring (Engine)
	refused   error       // the kernel's refusal of io_uring, if any
	direct    bool
	poll      time.Duration // Options.Poll where there is a ring
	memAlign  int           // with direct: the alignment buffers need in memory
	offAlign  int           // with direct: the alignment offsets and lengths need
	bounce    sync.Pool     // with direct: *[]byte aligned to memAlign
	// rmw serializes direct writes of less than offAlign (a residual
	// underflow's partial block): each reads the blocks it touches,
	// patches and writes them back, disk I/O under the lock (no other
	// lock is taken with it).
	rmw     sync.Mutex
	noDsync atomic.Bool // pwritev2 without RWF_DSYNC support: write, then fdatasync
}

// Options say how to open a file.
type Options struct {
	// Size is the capacity wanted, in bytes. For a file that does not
	// exist it is the size the file is created with (sparse); for an
	// existing file or block device 0 means its own size, and any other
	// value must equal it — unless Grow is set and Size is larger, when a
	// regular file is extended (sparse). Nothing ever shrinks a file.
	Size     int64
	Grow     bool
	ReadOnly bool
	// Engine is EngineAuto (also ""), EngineURing or EnginePread.
	Engine string
	// Direct opens the file with O_DIRECT. BlockSize (default 512), the
	// LU's logical block, must then be a multiple of the file's direct-I/O
	// offset alignment.
	Direct    bool
	BlockSize int
	// Poll has an I/O alone on the file's ring poll for its completion up
	// to this long, adapting within it (internal/spin), before it sleeps
	// in the kernel (serve --poll): the wake-up of an idle core is saved
	// where the device answers within it. 0: it sleeps at once.
	Poll time.Duration

	newRing func(entries uint32, poll time.Duration) (*uring.Ring, error) // tests: io_uring unavailable
}

// Open opens path read-write (read-only with o.ReadOnly), as o says.
func Open(path string, o Options) (*File, error) {
	flag := os.O_RDWR
	if o.ReadOnly {
		flag = os.O_RDONLY
	}
	switch o.Engine {
	case "", EngineAuto, EngineURing, EnginePread:
	default:
		return nil, fmt.Errorf("file: I/O engine %q: want %s, %s or %s", o.Engine, EngineAuto, EngineURing, EnginePread)
	}
	size := o.Size
	created := false // by this Open: removed again if Open fails
	f, err := os.OpenFile(path, flag, 0)
	if errors.Is(err, os.ErrNotExist) && !o.ReadOnly {
		if size <= 0 {
			return nil, fmt.Errorf("file: %s does not exist and no size was given to create it", path)
		}
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		created = err == nil
		if err == nil {
			if err = f.Truncate(size); err != nil {
				f.Close()
				os.Remove(path)
				return nil, fmt.Errorf("file: create %s: %w", path, err)
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("file: %w", err)
	}
	// Locked before anything can change it: an image has one server.
	if err := lock(f, path, o.ReadOnly); err != nil {
		f.Close()
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("file: %w", err)
	}
	cur := st.Size()
	if !st.Mode().IsRegular() {
		// Block device: the size is where it ends.
		if cur, err = f.Seek(0, 2); err != nil {
			f.Close()
			return nil, fmt.Errorf("file: size of %s: %w", path, err)
		}
	}
	switch {
	case size == 0 || size == cur:
		size = cur
	case size < cur:
		f.Close()
		return nil, fmt.Errorf("file: %s holds %d bytes; a size of %d would hide the rest of it (blockwire never shrinks an existing file): give its own size or none", path, cur, size)
	case !o.Grow:
		f.Close()
		return nil, fmt.Errorf("file: %s holds %d bytes, not %d: give its own size or none, or ask to grow it (--grow, grow = true)", path, cur, size)
	case !st.Mode().IsRegular():
		f.Close()
		return nil, fmt.Errorf("file: %s is a %d-byte device; it cannot grow to %d", path, cur, size)
	case o.ReadOnly:
		f.Close()
		return nil, fmt.Errorf("file: %s is %d bytes and opened read-only; it cannot grow to %d", path, cur, size)
	default:
		if err := f.Truncate(size); err != nil {
			f.Close()
			return nil, fmt.Errorf("file: grow %s: %w", path, err)
		}
	}
	if size == 0 {
		f.Close()
		return nil, fmt.Errorf("file: %s is empty", path)
	}
	b := &File{f: f, fd: int(f.Fd()), regular: st.Mode().IsRegular(), readOnly: o.ReadOnly}
	b.size.Store(size)
	fail := func(err error) (*File, error) {
		f.Close()
		if created {
			os.Remove(path)
		}
		return nil, err
	}
	if o.Direct {
		if err := b.openDirect(path, o.BlockSize); err != nil {
			return fail(err)
		}
	}
	if o.Engine != EnginePread {
		newRing := o.newRing
		if newRing == nil {
			newRing = uring.New
		}
		ring, err := newRing(ringEntries, o.Poll)
		switch {
		case err == nil:
			b.ring = ring
			b.ringRead, b.ringWrite = true, true
			if o.Engine != EngineURing && !b.direct {
				b.ringWrite = false
				b.why = "buffered writes take pwrite (the ring would hand them to a kernel worker)"
				if !nowaitReads(b.fd) {
					b.ringRead = false
					b.why = "the filesystem has no RWF_NOWAIT reads (tmpfs?): the ring would hand every I/O to a kernel worker"
					ring.Close()
					b.ring = nil
				}
			}
		case o.Engine == EngineURing:
			return fail(fmt.Errorf("file: %s: io_engine %s asked for, but the kernel refuses it: %w", path, EngineURing, err))
		default:
			b.why, b.refused = "the kernel refuses io_uring: "+err.Error(), err
		}
		if b.ring != nil {
			b.poll = o.Poll
		}
	}
	return b, nil
}

// nowaitReads reports whether fd takes RWF_NOWAIT reads, the sign that
// a buffered read through io_uring completes inline when cached and
// waits on the page, not in a worker thread, when not.
func nowaitReads(fd int) bool {
	var c [1]byte
	iov := unix.Iovec{Base: &c[0]}
	iov.SetLen(1)
	_, _, errno := unix.Syscall6(unix.SYS_PREADV2, uintptr(fd), uintptr(unsafe.Pointer(&iov)), 1, 0, 0, unix.RWF_NOWAIT)
	return errno != unix.EOPNOTSUPP && errno != unix.ENOSYS && errno != unix.EINVAL
}

// openDirect switches the file to O_DIRECT after checking that blocks of
// blockSize bytes are aligned as the file's direct I/O needs.
func (b *File) openDirect(path string, blockSize int) error {
	if blockSize == 0 {
		blockSize = 512
	}
	memAlign, offAlign := 4096, 4096 // safe guesses when the kernel cannot tell
	var stx unix.Statx_t
	if err := unix.Statx(b.fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &stx); err == nil && stx.Mask&unix.STATX_DIOALIGN != 0 {
		if stx.Dio_offset_align == 0 {
			return fmt.Errorf("file: %s: the filesystem does not support direct I/O (O_DIRECT); leave direct off", path)
		}
		memAlign, offAlign = int(stx.Dio_mem_align), int(stx.Dio_offset_align)
	} else if !b.regular {
		if ssz, err := unix.IoctlGetInt(b.fd, unix.BLKSSZGET); err == nil && ssz > 0 {
			memAlign, offAlign = ssz, ssz
		}
	}
	fl, err := unix.FcntlInt(uintptr(b.fd), unix.F_GETFL, 0)
	if err == nil {
		_, err = unix.FcntlInt(uintptr(b.fd), unix.F_SETFL, fl|unix.O_DIRECT)
	}
	if err != nil {
		return fmt.Errorf("file: %s: O_DIRECT: %w (the filesystem may not support direct I/O; leave direct off)", path, err)
	}
	if blockSize%offAlign != 0 {
		return fmt.Errorf("file: %s: direct I/O on it needs offsets aligned to %d bytes; a block size of %d is not (give --block-size %d or block_size = %[4]d, or leave direct off)", path, offAlign, blockSize, max(offAlign, 4096))
	}
	b.direct, b.memAlign, b.offAlign = true, memAlign, offAlign
	return nil
}

// Engine names the paths reads and writes take ("io_uring", "pread", or
// "io_uring reads, pwrite writes"), and why some I/O does not take the
// ring.
func (b *File) Engine() (engine, why string) {
	switch {
	case b.ringRead && b.ringWrite:
		return EngineURing, b.why
	case b.ringRead:
		return "io_uring reads, pwrite writes", b.why
	}
	return EnginePread, b.why
}

// RingRefused is the kernel's refusal of io_uring when EngineAuto fell
// back to pread/pwrite because of it (nil otherwise).
func (b *File) RingRefused() error { return b.refused }

// Poll is how long an I/O alone on the ring polls for its completion at
// most (Options.Poll; 0 without a ring).
func (b *File) Poll() time.Duration { return b.poll }

// Direct reports whether the file is open with O_DIRECT.
func (b *File) Direct() bool { return b.direct }

// Size returns the capacity in bytes.
func (b *File) Size() int64 { return b.size.Load() }

// Resize changes a regular file's capacity (backend.Resizer): it grows
// sparse (new space reads as zeroes) or is cut, and the new size holds
// for I/O from then on. Whether a shrink is wanted is the caller's to ask
// (admin resize --shrink); a block device keeps its size.
func (b *File) Resize(size int64) error {
	switch {
	case !b.regular:
		return errors.New("file: a block device keeps its size (resize the device itself)")
	case b.readOnly:
		return errors.New("file: opened read-only")
	case size <= 0:
		return fmt.Errorf("file: size %d", size)
	}
	if size < b.size.Load() {
		b.size.Store(size) // no I/O beyond the new end from now on
		if err := b.f.Truncate(size); err != nil {
			return fmt.Errorf("file: shrink: %w", err)
		}
		return nil
	}
	if err := b.f.Truncate(size); err != nil {
		return fmt.Errorf("file: grow: %w", err)
	}
	b.size.Store(size)
	return nil
}

// ReadAt implements io.ReaderAt.
func (b *File) ReadAt(p []byte, off int64) (int, error) {
	if size := b.size.Load(); off < 0 || off+int64(len(p)) > size {
		return 0, fmt.Errorf("file: read [%d,%d) outside %d bytes", off, off+int64(len(p)), size)
	}
	if lo, hi, ok := b.partial(p, off); ok {
		bp := b.getBounce(int(hi - lo))
		defer b.bounce.Put(bp)
		if _, err := b.read((*bp)[:hi-lo], lo); err != nil {
			return 0, err
		}
		return copy(p, (*bp)[off-lo:]), nil
	}
	if b.misaligned(p) {
		bp := b.getBounce(len(p))
		defer b.bounce.Put(bp)
		n, err := b.read((*bp)[:len(p)], off)
		copy(p, (*bp)[:n])
		return n, err
	}
	return b.read(p, off)
}

// partial reports whether a direct I/O of p at off is not aligned in
// offset or length, and the aligned range [lo, hi) that covers it (within
// the file: its size is a multiple of the block size, itself of offAlign).
func (b *File) partial(p []byte, off int64) (lo, hi int64, ok bool) {
	if !b.direct || len(p) == 0 {
		return 0, 0, false
	}
	a := int64(b.offAlign)
	end := off + int64(len(p))
	if off%a == 0 && end%a == 0 {
		return 0, 0, false
	}
	return off - off%a, (end + a - 1) / a * a, true
}

func (b *File) read(p []byte, off int64) (int, error) {
	var n int
	var err error
	if b.ringRead {
		if n, err = b.ring.ReadAt(b.fd, p, off); err != nil {
			err = fmt.Errorf("file: read [%d,%d) through io_uring: %w", off, off+int64(len(p)), err)
		}
	} else {
		n, err = b.f.ReadAt(p, off)
	}
	if n == len(p) {
		return n, nil
	}
	if err == nil {
		// The file ends before the LU does (a block device shrunk
		// underneath, a file cut by someone else).
		err = fmt.Errorf("file: read [%d,%d): the file ends at %d", off, off+int64(len(p)), off+int64(n))
	}
	return n, err
}

// WriteAt implements io.WriterAt.
func (b *File) WriteAt(p []byte, off int64) (int, error) {
	return b.write(p, off, 0)
}

// WriteAtDurable implements backend.DurableWriter: a write with
// RWF_DSYNC (the data and what is needed to read it back are on stable
// storage when it returns), where an older kernel or filesystem refuses
// that flag, a write and an fdatasync.
func (b *File) WriteAtDurable(p []byte, off int64) (int, error) {
	if b.noDsync.Load() {
		n, err := b.write(p, off, 0)
		if err == nil {
			err = b.Flush()
		}
		return n, err
	}
	n, err := b.write(p, off, unix.RWF_DSYNC)
	if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS) {
		if n != 0 {
			return n, err
		}
		b.noDsync.Store(true)
		return b.WriteAtDurable(p, off)
	}
	return n, err
}

func (b *File) write(p []byte, off int64, flags uint32) (int, error) {
	if size := b.size.Load(); off < 0 || off+int64(len(p)) > size {
		return 0, fmt.Errorf("file: write [%d,%d) outside %d bytes", off, off+int64(len(p)), size)
	}
	if lo, hi, ok := b.partial(p, off); ok {
		// Less than the direct-I/O alignment: the blocks it touches are
		// read, patched and written back whole.
		b.rmw.Lock()
		defer b.rmw.Unlock()
		bp := b.getBounce(int(hi - lo))
		defer b.bounce.Put(bp)
		whole := (*bp)[:hi-lo]
		if _, err := b.read(whole, lo); err != nil {
			return 0, err
		}
		copy(whole[off-lo:], p)
		if _, err := b.writeAligned(whole, lo, flags); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	if b.misaligned(p) {
		bp := b.getBounce(len(p))
		defer b.bounce.Put(bp)
		copy(*bp, p)
		p = (*bp)[:len(p)]
	}
	return b.writeAligned(p, off, flags)
}

// writeAligned writes p at off as the engine says (p aligned as direct
// I/O needs, when it is on).
func (b *File) writeAligned(p []byte, off int64, flags uint32) (int, error) {
	switch {
	case b.ringWrite:
		n, err := b.ring.WriteAt(b.fd, p, off, flags)
		if err != nil {
			err = fmt.Errorf("file: write [%d,%d) through io_uring: %w", off, off+int64(len(p)), err)
		}
		return n, err
	case flags != 0:
		return pwrite2(b.fd, p, off, int(flags))
	default:
		return b.f.WriteAt(p, off)
	}
}

// pwrite2 is pwritev2 with one buffer, retried until all of p is written.
func pwrite2(fd int, p []byte, off int64, flags int) (int, error) {
	done := 0
	for done < len(p) {
		q := p[done:]
		iov := unix.Iovec{Base: &q[0]}
		iov.SetLen(len(q))
		n, _, errno := unix.Syscall6(unix.SYS_PWRITEV2, uintptr(fd), uintptr(unsafe.Pointer(&iov)), 1, uintptr(off+int64(done)), 0, uintptr(flags))
		switch {
		case errno == syscall.EINTR || errno == syscall.EAGAIN:
			continue
		case errno != 0:
			return done, fmt.Errorf("file: pwritev2: %w", errno)
		case n == 0:
			return done, fmt.Errorf("file: pwritev2 at %d: %w", off+int64(done), syscall.EIO)
		}
		done += int(n)
	}
	return done, nil
}

// misaligned reports whether p must go through a bounce buffer: direct
// I/O with p's memory off the alignment.
func (b *File) misaligned(p []byte) bool {
	return b.direct && len(p) > 0 && uintptr(unsafe.Pointer(&p[0]))%uintptr(b.memAlign) != 0
}

// getBounce returns an aligned buffer of at least n bytes.
func (b *File) getBounce(n int) *[]byte {
	if bp, _ := b.bounce.Get().(*[]byte); bp != nil && len(*bp) >= n {
		return bp
	}
	raw := make([]byte, n+b.memAlign)
	skip := (b.memAlign - int(uintptr(unsafe.Pointer(&raw[0]))%uintptr(b.memAlign))) % b.memAlign
	buf := raw[skip : skip+n]
	return &buf
}

// Flush makes completed writes durable (fdatasync).
func (b *File) Flush() error {
	for {
		err := syscall.Fdatasync(b.fd)
		if err != syscall.EINTR {
			if err != nil {
				return fmt.Errorf("file: fdatasync: %w", err)
			}
			return nil
		}
	}
}

// Unmap punches a hole so the range reads as zeroes and frees its blocks.
func (b *File) Unmap(off, length int64) error {
	const punchHole, keepSize = 0x02, 0x01 // FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
	if err := syscall.Fallocate(b.fd, punchHole|keepSize, off, length); err != nil {
		return fmt.Errorf("file: punch hole [%d,+%d): %w", off, length, err)
	}
	return nil
}

// Close flushes and closes the file.
func (b *File) Close() error {
	if b.ring != nil {
		b.ring.Close()
	}
	ferr := b.Flush()
	cerr := b.f.Close()
	return errors.Join(ferr, cerr)
}

// Mapped implements backend.Mapper with SEEK_DATA / SEEK_HOLE.
func (b *File) Mapped(off int64) (bool, int64, error) {
	const seekData, seekHole = 3, 4
	size := b.size.Load()
	fd := b.fd
	data, err := syscall.Seek(fd, off, seekData)
	if err == syscall.ENXIO {
		return false, size, nil // no data after off
	}
	if err != nil {
		return true, size, nil // no hole support: all mapped
	}
	if data > off {
		return false, min(data, size), nil
	}
	hole, err := syscall.Seek(fd, off, seekHole)
	if err != nil {
		return true, size, nil
	}
	return true, min(hole, size), nil
}
