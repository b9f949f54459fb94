package tcp

import (
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/blockwire/blockwire/internal/prefixconn"
)

// rawWriter writes a batch's buffers with writev(2) on the non-blocking
// socket as a raw system call, as the poller reads (see poller for why and
// what it measured): a full socket is left to Go's network poller, which
// calls it again once there is room, under the connection's write
// deadline (sendguard's stretches). One writer per connection, used by the
// goroutine flushing its batches.
type rawWriter struct {
	nc   net.Conn
	rc   syscall.RawConn
	iov  []unix.Iovec
	bufs *net.Buffers
	n    int64
	err  syscall.Errno
	full int                   // writes that found the socket full (for tests)
	call func(fd uintptr) bool // built once: a closure per write would allocate
}

// newRawWriter returns a rawWriter of nc's socket, or nil when nc is no TCP
// socket. A portal's look-ahead (prefixconn) only reads ahead: writes go to
// its socket from the start.
func newRawWriter(nc net.Conn) *rawWriter {
	tc := prefixconn.TCP(nc)
	if tc == nil {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	w := &rawWriter{nc: nc, rc: rc, iov: make([]unix.Iovec, 0, 3*batchSize)}
	w.call = func(fd uintptr) bool {
		for len(*w.bufs) > 0 {
			w.iov = w.iov[:0]
			for _, b := range *w.bufs {
				if len(w.iov) == cap(w.iov) {
					break
				}
				if len(b) > 0 {
					v := unix.Iovec{Base: unsafe.SliceData(b)}
					v.SetLen(len(b))
					w.iov = append(w.iov, v)
				}
			}
			if len(w.iov) == 0 {
				consume(w.bufs, 0)
				return true
			}
			r, _, e := unix.RawSyscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&w.iov[0])), uintptr(len(w.iov)))
			switch e {
			case 0:
				w.n += int64(r)
				consume(w.bufs, int64(r))
			case unix.EINTR:
			case unix.EAGAIN:
				w.full++
				return false // the socket is full: the poller waits for room
			default:
				w.err = e
				return true
			}
		}
		return true
	}
	return w
}

// write writes *bufs, consuming what it wrote, as net.Buffers.WriteTo does
// (sendguard.WriteWith), and returns how much it wrote.
func (w *rawWriter) write(bufs *net.Buffers) (int64, error) {
	w.bufs, w.n, w.err = bufs, 0, 0
	err := w.rc.Write(w.call) // its own errors (closed, past the deadline) come as net.OpErrors
	w.bufs = nil
	if err == nil && w.err != 0 {
		err = &net.OpError{Op: "write", Net: "tcp", Source: w.nc.LocalAddr(), Addr: w.nc.RemoteAddr(), Err: os.NewSyscallError("writev", w.err)}
	}
	return w.n, err
}

// consume drops the first n bytes of *v, and the empty buffers in front.
func consume(v *net.Buffers, n int64) {
	for len(*v) > 0 {
		l := int64(len((*v)[0]))
		if l > n {
			(*v)[0] = (*v)[0][n:]
			return
		}
		n -= l
		(*v)[0] = nil
		*v = (*v)[1:]
	}
}
