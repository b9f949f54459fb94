//go:build linux

package siw

import (
	"io"
	"net"
	"syscall"
	"unsafe"

	"github.com/blockwire/blockwire/internal/prefixconn"
)

// vectored reads a payload and what follows it with one readv(2): the
// payload into its destination, the pad, CRC and next header into the
// reader's look-ahead buffer. It saves a system call per FPDU on a busy
// stream. A plain *net.TCPConn qualifies, and a wrapper that holds bytes
// read before (internal/prefixconn) once those are gone; any other
// connection is read with Read.
type vectored struct {
	raw  syscall.RawConn
	fn   func(fd uintptr) bool // x.readv, bound once: no allocation per read
	iov  [2]syscall.Iovec
	niov int
	n    int
	err  error
	// wrapped is a connection that puts bytes it already read in front
	// of a TCP socket (a portal's classifier): usable once they are gone.
	wrapped prefixconn.Socketed
}

func (v *vectored) init(c net.Conn) {
	if w, ok := c.(prefixconn.Socketed); ok {
		v.wrapped = w
		return
	}
	if tc, ok := c.(*net.TCPConn); ok {
		v.use(tc)
	}
}

func (v *vectored) use(tc *net.TCPConn) {
	raw, err := tc.SyscallConn()
	if err != nil {
		return
	}
	v.raw, v.fn = raw, v.readv
}

func (v *vectored) ok() bool {
	if v.raw == nil && v.wrapped != nil {
		if tc, drained := v.wrapped.Socket(); drained {
			v.wrapped = nil
			v.use(tc)
		}
	}
	return v.raw != nil
}

func (v *vectored) readv(fd uintptr) bool {
	n, _, e := syscall.Syscall(syscall.SYS_READV, fd, uintptr(unsafe.Pointer(&v.iov[0])), uintptr(v.niov))
	switch e {
	case 0:
		v.n, v.err = int(n), nil
	case syscall.EAGAIN, syscall.EINTR:
		return false // wait until readable
	default:
		v.n, v.err = 0, e
	}
	return true
}

// fill reads rem completely, and as much of x.ahead plus one minimal FPDU
// into x.buf (empty) as arrives with it.
func (v *vectored) fill(x *reader, rem []byte) error {
	limit := min(x.ahead+lookAhead, len(x.buf))
	defer func() { v.iov = [2]syscall.Iovec{} }() // keep no pointer into user memory
	for len(rem) > 0 {
		v.iov[0].Base = &rem[0]
		v.iov[0].SetLen(len(rem))
		v.niov = 1
		if x.w < limit {
			v.iov[1].Base = &x.buf[x.w]
			v.iov[1].SetLen(limit - x.w)
			v.niov = 2
		}
		if err := v.raw.Read(v.fn); err != nil {
			return err
		}
		if v.err != nil {
			return v.err
		}
		if v.n == 0 {
			return io.ErrUnexpectedEOF
		}
		if v.n <= len(rem) {
			rem = rem[v.n:]
			continue
		}
		x.w += v.n - len(rem)
		rem = rem[len(rem):]
	}
	return nil
}
