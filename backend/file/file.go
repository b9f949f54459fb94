// Package file is a backend on a regular file or a block device. A missing
// file is created sparse at the requested size, an existing one is served at
// its own size (grown only when asked, never shrunk); Flush is fdatasync and Unmap
// punches holes.
package file

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
)

// File is a file-backed disk. It is safe for concurrent use.
type File struct {
	f        *os.File
	size     atomic.Int64 // read on every I/O, changed by Resize
	regular  bool         // a regular file (not a block device): it can be resized
	readOnly bool
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
}

// Open opens path read-write (read-only with o.ReadOnly), as o says.
func Open(path string, o Options) (*File, error) {
	flag := os.O_RDWR
	if o.ReadOnly {
		flag = os.O_RDONLY
	}
	size := o.Size
	f, err := os.OpenFile(path, flag, 0)
	if errors.Is(err, os.ErrNotExist) && !o.ReadOnly {
		if size <= 0 {
			return nil, fmt.Errorf("file: %s does not exist and no size was given to create it", path)
		}
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
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
	b := &File{f: f, regular: st.Mode().IsRegular(), readOnly: o.ReadOnly}
	b.size.Store(size)
	return b, nil
}

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
	n, err := b.f.ReadAt(p, off)
	if n == len(p) {
		return n, nil
	}
	return n, err
}

// WriteAt implements io.WriterAt.
func (b *File) WriteAt(p []byte, off int64) (int, error) {
	if size := b.size.Load(); off < 0 || off+int64(len(p)) > size {
		return 0, fmt.Errorf("file: write [%d,%d) outside %d bytes", off, off+int64(len(p)), size)
	}
	return b.f.WriteAt(p, off)
}

// Flush makes completed writes durable (fdatasync).
func (b *File) Flush() error {
	for {
		err := syscall.Fdatasync(int(b.f.Fd()))
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
	if err := syscall.Fallocate(int(b.f.Fd()), punchHole|keepSize, off, length); err != nil {
		return fmt.Errorf("file: punch hole [%d,+%d): %w", off, length, err)
	}
	return nil
}

// Close flushes and closes the file.
func (b *File) Close() error {
	ferr := b.Flush()
	cerr := b.f.Close()
	return errors.Join(ferr, cerr)
}

// Mapped implements backend.Mapper with SEEK_DATA / SEEK_HOLE.
func (b *File) Mapped(off int64) (bool, int64, error) {
	const seekData, seekHole = 3, 4
	size := b.size.Load()
	fd := int(b.f.Fd())
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
