// Package sockpoll reads a TCP socket by polling it for a while before
// sleeping in Go's network poller: iSCSI's TCP datamover and the NVMe/TCP
// target read their connections through it when serve polls (--poll).
package sockpoll

import (
	"io"
	"net"
	"os"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"github.com/blockwire/blockwire/internal/prefixconn"
	"github.com/blockwire/blockwire/internal/spin"
	"golang.org/x/sys/unix"
)

// Reader reads a TCP socket that it polls, without blocking, for up to
// spin after finding it empty, before it waits in Go's network poller. A
// target core that would halt between a response and the next command
// (and take a wake-up to run again: tens of microseconds in a virtual
// machine) then reads the command as it lands. It spins only while
// traffic flows: once spin passes with nothing to read, the reader sleeps
// as before, so an idle connection costs no CPU. While it spins it yields
// to the process's other goroutines between attempts.
//
// Its reads are raw system calls (as datamover/tcp's writes are then,
// its rawWriter): read(2) on the non-blocking socket never waits, so Go's
// scheduler need not be told of it, and it does not then retake the
// reader's P or park a thread after the call. Measured with the target
// polling 50 µs (docs/bench/journal.md): 4 KiB random reads at QD 32 +8-12 %
// at 0.4-0.8 µs less target CPU per read, QD 1 +7-13 %. Without polling
// the same raw calls cost QD 1 a tenth of its IOPS or more (the ordinary
// calls' extra thread wake-ups had been catching the next PDU sooner), so
// a connection that does not poll reads and writes as Go's net package
// does.
type Reader struct {
	nc net.Conn // read through while it holds bytes of its own, and to sleep
	// direct reports whether the socket can be read directly, nothing
	// being held in front of it (a portal's look-ahead, prefixconn).
	direct func() bool
	rc     syscall.RawConn
	spin   spin.Budget

	// One read(2), made by read (built once: a closure per call would
	// allocate). With wait, read leaves an empty socket to the network
	// poller, which calls it again once there is something to read.
	buf   []byte
	n     int
	err   error
	empty bool
	wait  bool // read waits for the socket (spin has passed)
	read  func(fd uintptr) bool

	// Reads that found data while polling, and that slept (for tests).
	polled, slept int
}

// New returns a Reader of nc that polls up to d, or nil when nc is no
// TCP socket.
func New(nc net.Conn, d time.Duration) *Reader {
	var tc *net.TCPConn
	direct := func() bool { return true }
	switch c := nc.(type) {
	case *net.TCPConn:
		tc = c
	case prefixconn.Socketed:
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
	r := &Reader{nc: nc, direct: direct, rc: rc, spin: spin.New(d)}
	r.read = func(fd uintptr) bool {
		for {
			n, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(r.buf))), uintptr(len(r.buf)))
			if e == unix.EINTR {
				continue
			}
			if e == unix.EAGAIN && r.wait {
				return false // the network poller waits, then calls again
			}
			r.empty = e == unix.EAGAIN
			r.n, r.err = int(n), nil
			if e != 0 {
				r.n, r.err = 0, e
			}
			return true
		}
	}
	return r
}

func (r *Reader) Read(p []byte) (int, error) {
	if len(p) == 0 || !r.direct() {
		return r.nc.Read(p)
	}
	r.spin.Start()
	for {
		r.buf = p
		slept := r.wait
		err := r.rc.Read(r.read)
		r.buf, r.wait = nil, false
		if err != nil {
			return 0, err // closed, or past a read deadline
		}
		if !r.empty {
			if r.spin.Polled() {
				r.polled++
			}
			if slept {
				r.spin.Woke() // the next waits poll as long as this one took, within spin
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
			// Spun out: the next read waits in the network poller.
			r.slept++
			r.wait = true
			continue
		}
		runtime.Gosched()
	}
}

// Counts reports the reads that found data while polling, and those that
// slept first (for tests and measurements; call it from the reading
// goroutine, or once it ended).
func (r *Reader) Counts() (polled, slept int) { return r.polled, r.slept }
