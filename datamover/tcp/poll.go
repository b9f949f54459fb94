package tcp

import (
	"io"
	"net"
	"os"
	"runtime"
	"syscall"
	"time"

	"github.com/blockwire/blockwire/internal/spin"
)

// poller reads a TCP socket that it polls, without blocking, for up to
// spin after finding it empty, before it waits in Go's network poller. A
// target core that would halt between a response and the next command
// (and take a wake-up to run again: tens of microseconds in a virtual
// machine) then reads the command as it lands. It spins only while
// traffic flows: once spin passes with nothing to read, the reader sleeps
// as before, so an idle connection costs no CPU. While it spins it yields
// to the process's other goroutines between attempts.
type poller struct {
	nc net.Conn // read through while it holds bytes of its own, and to sleep
	// direct reports whether the socket can be read directly, nothing
	// being held in front of it (a portal's look-ahead, prefixconn).
	direct func() bool
	rc     syscall.RawConn
	spin   spin.Budget

	// One read(2), made by read (built once: a closure per call would
	// allocate).
	buf   []byte
	n     int
	err   error
	empty bool
	read  func(fd uintptr) bool

	// Reads that found data while polling, and that slept (for tests).
	polled, slept int
}

// newPoller returns a poller of nc, or nil when nc is no TCP socket.
func newPoller(nc net.Conn, d time.Duration) *poller {
	var tc *net.TCPConn
	direct := func() bool { return true }
	switch c := nc.(type) {
	case *net.TCPConn:
		tc = c
	case interface{ Socket() (*net.TCPConn, bool) }:
		tc, _ = c.Socket()
		direct = func() bool {
			_, ok := c.Socket()
			return ok
		}
	default:
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	r := &poller{nc: nc, direct: direct, rc: rc, spin: spin.New(d)}
	r.read = func(fd uintptr) bool {
		for {
			n, err := syscall.Read(int(fd), r.buf)
			if err == syscall.EINTR {
				continue
			}
			r.empty = err == syscall.EAGAIN
			r.n, r.err = max(n, 0), err
			return true // never wait here: Read decides
		}
	}
	return r
}

func (r *poller) Read(p []byte) (int, error) {
	if len(p) == 0 || !r.direct() {
		return r.nc.Read(p)
	}
	r.spin.Start()
	for {
		r.buf = p
		err := r.rc.Read(r.read)
		r.buf = nil
		if err != nil {
			return 0, err // closed, or past a read deadline
		}
		if !r.empty {
			if r.spin.Polled() {
				r.polled++
			}
			if r.err != nil {
				// As net.Conn's Read reports it.
				return 0, &net.OpError{Op: "read", Net: "tcp", Source: r.nc.LocalAddr(), Addr: r.nc.RemoteAddr(), Err: os.NewSyscallError("read", r.err)}
			}
			if r.n == 0 {
				return 0, io.EOF
			}
			return r.n, nil
		}
		if !r.spin.Again() {
			r.slept++
			return r.nc.Read(p)
		}
		runtime.Gosched()
	}
}
