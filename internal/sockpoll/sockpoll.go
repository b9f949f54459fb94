// Package sockpoll reads a TCP socket by polling it for a while before
// sleeping in Go's network poller: iSCSI's TCP datamover and the NVMe/TCP
// target read their connections through it when serve polls (--poll).
package sockpoll

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync/atomic"
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
	g  *Group
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
	// young: the reader sleeps counted in g.young, its socket's read
	// deadline set to end that (it then sleeps on, uncounted).
	young    bool
	idle     bool // it slept past g.youngFor: it sleeps on uncounted
	spinning bool // it holds one of g's spinMax places
	// deadline is the owner's read deadline (SetReadDeadline), in Unix
	// nanoseconds; 0: none.
	deadline atomic.Int64

	// Reads that found data while polling, and that slept (for tests).
	polled, slept int
}

// Group is the polling readers of one process (serve --poll), which
// share its cores: the most each polls, and how many of them sleep young
// — went to sleep in Go's network poller less than a millisecond ago, so that
// their peer is likely to send again soon. A reader polls only while none
// does. Polling, it yields to the process's other goroutines, but Go's
// scheduler looks into the network poller only when nothing else can
// run (or every 10 ms, sysmon): a reader polling on a core would hold
// back the wake-up of every reader asleep on it. With four hosts'
// connections at queue depth 1 on one target core, each polling in turn
// while the others slept, NVMe/TCP 4 KiB reads fell from 26.5k (not
// polling) to 4.0k. A reader that has slept for a millisecond counts as idle:
// its peer is not in the middle of a run of commands. The zero Group
// never polls; it is safe for concurrent use.
type Group struct {
	most     time.Duration
	youngFor time.Duration // how long a sleeping reader holds the others' polling back
	young    atomic.Int32
	// At most spinMax readers poll at once (one a core: GOMAXPROCS at
	// NewGroup); the others sleep. Sixteen connections at queue depth 32
	// on one target core, each polling when it emptied, spent the core
	// on empty reads: 0.90-0.97x of not polling, against 1.0x with one.
	spinners atomic.Int32
	spinMax  int32
}

// NewGroup returns the group of readers that poll up to most; nil when
// most is not positive (readers sleep at once).
func NewGroup(most time.Duration) *Group {
	if most <= 0 {
		return nil
	}
	return &Group{most: most, youngFor: time.Millisecond, spinMax: int32(max(runtime.GOMAXPROCS(0), 1))}
}

// New returns a Reader of nc that polls as g says, or nil when nc is no
// TCP socket or g is nil. The Reader owns nc's read deadline: set it
// through Reader.SetReadDeadline.
func New(nc net.Conn, g *Group) *Reader {
	if g == nil {
		return nil
	}
	d := g.most
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
	r := &Reader{g: g, nc: nc, direct: direct, rc: rc, spin: spin.New(d)}
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
		if slept && !r.idle {
			r.sleepYoung(true)
		}
		err := r.rc.Read(r.read)
		r.buf, r.wait = nil, false
		if r.young {
			r.sleepYoung(false)
			if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && !r.past() {
				// Asleep for g.youngFor: idle now, it no longer holds the
				// others back. It sleeps on.
				r.idle, r.wait = true, true
				continue
			}
		}
		if err != nil {
			r.dropSpin()
			return 0, err // closed
		}
		r.idle = false
		if !r.empty {
			r.dropSpin()
			if !slept && r.spin.Polled() {
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
		if !r.spin.Again() || r.g.young.Load() > 0 || !r.takeSpin() {
			// Spun out, another reader of the group has just gone to
			// sleep (polling would delay its wake-up), or enough of them
			// poll already: the next read waits in the network poller.
			r.dropSpin()
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

// takeSpin reports whether the reader may poll on: it holds, or takes,
// one of its group's places.
func (r *Reader) takeSpin() bool {
	if r.spinning {
		return true
	}
	if r.g.spinners.Add(1) > r.g.spinMax {
		r.g.spinners.Add(-1)
		return false
	}
	r.spinning = true
	return true
}

// dropSpin gives the reader's place back, if it holds one.
func (r *Reader) dropSpin() {
	if r.spinning {
		r.spinning = false
		r.g.spinners.Add(-1)
	}
}

// sleepYoung begins (on) or ends a young sleep: counted in the group, and
// bounded by the socket's read deadline (or the owner's, if sooner).
func (r *Reader) sleepYoung(on bool) {
	r.young = on
	owner := r.deadline.Load()
	if on {
		r.g.young.Add(1)
		dl := time.Now().Add(r.g.youngFor)
		if owner != 0 && owner < dl.UnixNano() {
			dl = time.Unix(0, owner)
		}
		r.nc.SetReadDeadline(dl)
		return
	}
	r.g.young.Add(-1)
	var dl time.Time
	if owner != 0 {
		dl = time.Unix(0, owner)
	}
	r.nc.SetReadDeadline(dl)
}

// past reports whether the owner's read deadline has passed.
func (r *Reader) past() bool {
	owner := r.deadline.Load()
	return owner != 0 && time.Now().UnixNano() >= owner
}

// SetReadDeadline sets the read deadline of the Reader's connection, as
// net.Conn's does (the zero time: none). Set it here, not on the
// connection: the Reader's young sleeps bound themselves by the
// connection's deadline, and put the owner's back.
func (r *Reader) SetReadDeadline(t time.Time) error {
	var ns int64
	if !t.IsZero() {
		ns = t.UnixNano()
	}
	r.deadline.Store(ns)
	return r.nc.SetReadDeadline(t)
}
