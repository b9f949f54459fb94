// Package uring is a Linux io_uring for positional file I/O: reads and
// writes (optionally RWF_DSYNC), each a call that returns
// when the kernel has completed it, for many goroutines at once.
//
// It is written over golang.org/x/sys/unix (raw io_uring_setup/enter/
// register and mmap): the module proxy this project builds from serves
// no io_uring library, and the three system calls plus two shared rings
// are small enough to own. The layout of the rings, SQEs and CQEs is the
// kernel's (include/uapi/linux/io_uring.h).
//
// How a call runs:
//   - it takes one of the ring's slots (the bound on operations in
//     flight; a full ring makes callers wait, never fails them);
//   - writes its SQE under sqMu, then submits it with io_uring_enter
//     outside any lock (each caller submits exactly one SQE, so every
//     SQE placed is submitted by someone);
//   - reaps the completion queue: an operation the kernel completed
//     inline (page-cache hits, tmpfs) is done when the submit returns —
//     one system call, no hand-off between goroutines;
//   - a caller alone on the ring submits and waits in one
//     io_uring_enter (submitAndWait), as a blocking pread would: its
//     completion, task work of its own thread, wakes it once; on a ring
//     that polls (New's poll, serve --poll) it submits, then polls the
//     CQ before it sleeps there (pollWait), and runs the task work that
//     posts its completion itself when the kernel flags it (a ring that
//     polls defers task work: no interrupt of the polling thread). While
//     it sleeps there it alone reaps (enterWait);
//   - otherwise it waits on its slot's channel. The completion then
//     arrives from the kernel's worker or from task work; the ring's
//     eventfd, watched by Go's netpoller (no thread blocked in the
//     kernel), wakes the reaper goroutine, which delivers it. The eventfd
//     is switched on (IORING_CQ_EVENTFD_DISABLED cleared) only while some
//     caller waits this way, so the inline path costs no wake-ups.
//
// The two system calls of that path that cannot wait — a submission
// without IORING_ENTER_GETEVENTS (io_uring issues each operation
// nonblocking and hands one that would block to its own workers) and the
// read of the nonblocking eventfd — are raw system calls, which Go's
// scheduler is not told of (a submission that completes inline, a
// page-cache hit, copies its data in that call: as long as a pread of it).
// An ordinary one wakes the runtime's monitor thread (sysmon) whenever the
// process had gone idle, and it then ticks every 20 µs for a millisecond
// or more: a process waiting for a disk goes idle often. Measured with
// BenchmarkQD32 (backend/file, 4 KiB O_DIRECT on a loop device, 32
// goroutines, the process's CPU time divided by the operations): reads
// 9.6-11.3 µs against 12.0-13.2 µs, writes 11.2-12.5 against 15.0-18.2, in
// alternating runs; for 60 000 reads, sysmon's sleeps 0.9-1.1k against
// 5.1-6.7k and thread switches 8.3-8.9k against 17.9-22.4k (perf stat).
// A caller alone submits and waits in an ordinary system call: that one
// sleeps.
//
// Lock order: sqMu, cqMu and evMu are never held together, and none is
// held across a system call that sleeps; a channel send under cqMu never
// blocks (each slot's channel holds one result and has one operation).
package uring

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/blockwire/blockwire/internal/spin"
	"golang.org/x/sys/unix"
)

// Opcodes and flags of the kernel's ABI.
const (
	opRead  = 22 // IORING_OP_READ (5.6)
	opWrite = 23 // IORING_OP_WRITE (5.6)

	offSQRing = 0
	offSQEs   = 0x10000000

	featSingleMmap = 1 << 0 // IORING_FEAT_SINGLE_MMAP (5.4)
	featNoDrop     = 1 << 1 // IORING_FEAT_NODROP (5.5)

	setupCQSize      = 1 << 3 // IORING_SETUP_CQSIZE
	setupCoopTaskrun = 1 << 8 // IORING_SETUP_COOP_TASKRUN (5.19)
	setupTaskrunFlag = 1 << 9 // IORING_SETUP_TASKRUN_FLAG (5.19)
	sqTaskrun        = 1 << 2 // IORING_SQ_TASKRUN: task work of the ring is pending
	enterGetEvents   = 1 << 0 // IORING_ENTER_GETEVENTS

	registerEventfd = 4 // IORING_REGISTER_EVENTFD

	cqEventfdDisabled = 1 << 0 // IORING_CQ_EVENTFD_DISABLED (5.8)
)

// sqe is struct io_uring_sqe (64 bytes).
type sqe struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	rwFlags     uint32 // rw_flags, fsync_flags, …
	userData    uint64
	bufIndex    uint16
	personality uint16
	spliceFdIn  int32
	addr3       uint64
	_           uint64
}

// cqe is struct io_uring_cqe (16 bytes, without CQE32).
type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

type sqOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

// params is struct io_uring_params (120 bytes).
type params struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqOffsets
	cqOff                                                                  cqOffsets
}

// ErrClosed is an operation on a closed ring.
var ErrClosed = errors.New("uring: ring closed")

// slot is one operation in flight.
type slot struct {
	done chan int32 // the CQE's res; capacity 1
	buf  unsafe.Pointer
	pin  runtime.Pinner
}

// Ring is an io_uring shared by many goroutines. It is safe for
// concurrent use.
type Ring struct {
	fd      int
	entries uint32

	sqMu    sync.Mutex // guards the SQ tail and the SQE array; first in no order (held alone)
	sqTail  *uint32
	sqMask  uint32
	sqArray []uint32
	sqes    []sqe
	sqFlags *uint32 // the SQ ring's flags where the kernel flags pending task work (IORING_SETUP_TASKRUN_FLAG), else nil

	cqMu    sync.Mutex // guards the CQ head and kwait (held alone)
	kwait   bool       // a caller sleeps in io_uring_enter for completions: nobody else reaps (enterWait)
	cqHead  *uint32
	cqTail  *uint32
	cqMask  uint32
	cqes    []cqe
	cqFlags *uint32 // nil: the kernel has no CQ flags (before 5.8)

	evMu      sync.Mutex // guards waiting and the eventfd switch (held alone)
	waiting   int        // callers waiting for an asynchronous completion
	ev        *os.File   // the eventfd, nonblocking, in the netpoller
	reaperEnd chan struct{}

	inflight atomic.Int32 // operations between taking a slot and giving it back

	// poll is the polling of the caller alone on the ring (pollWait);
	// polls says whether there is any. One caller at a time is alone
	// (inflight went from 0 to 1 for it), so whichever is owns poll.
	poll  spin.Budget
	polls bool

	slots  []slot
	free   chan uint32 // free slot indices
	closed chan struct{}
	once   sync.Once
	mmaps  [][]byte
}

// New sets up a ring for up to entries operations in flight (a power of
// two, at most 4096). A caller alone on the ring polls the CQ for its
// completion up to poll (adapting within it; 0: never) before it sleeps
// in the kernel. New fails where the kernel has no io_uring or forbids it
// (ENOSYS; EPERM with kernel.io_uring_disabled or a seccomp filter): the
// caller then falls back to plain system calls.
func New(entries uint32, poll time.Duration) (*Ring, error) {
	if entries == 0 || entries > 4096 || entries&(entries-1) != 0 {
		return nil, fmt.Errorf("uring: %d entries: want a power of two in [1, 4096]", entries)
	}
	p := params{flags: setupCQSize, cqEntries: 2 * entries}
	if poll > 0 {
		// The completions of a ring that polls come as task work the kernel
		// flags in the SQ ring (pollWait runs it) instead of interrupting
		// the thread that is polling for them. At depth, a completion
		// whose submitting thread is busy in user space is then posted
		// when that thread next enters the kernel (at worst on a timer
		// tick); measured, the tails did not move (docs/bench/journal.md).
		p.flags |= setupCoopTaskrun | setupTaskrunFlag
	}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno == unix.EINVAL && p.flags != setupCQSize {
		// A kernel before 5.19: the ring polls, and the kernel interrupts
		// the polling thread to run its completions.
		p = params{flags: setupCQSize, cqEntries: 2 * entries}
		fd, _, errno = unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	}
	if errno != 0 {
		return nil, fmt.Errorf("uring: io_uring_setup: %w", errno)
	}
	r := &Ring{fd: int(fd), entries: entries, closed: make(chan struct{}), reaperEnd: make(chan struct{}),
		poll: spin.New(poll), polls: poll > 0}
	if err := r.setup(&p); err != nil {
		r.unmap()
		unix.Close(r.fd)
		return nil, err
	}
	r.slots = make([]slot, entries)
	r.free = make(chan uint32, entries)
	for i := range r.slots {
		r.slots[i].done = make(chan int32, 1)
		r.free <- uint32(i)
	}
	go r.reaper()
	return r, nil
}

func (r *Ring) setup(p *params) error {
	if p.features&featSingleMmap == 0 || p.features&featNoDrop == 0 {
		return fmt.Errorf("uring: kernel too old (features %#x: no single mmap or no CQ overflow protection)", p.features)
	}
	sqSize := uintptr(p.sqOff.array) + uintptr(p.sqEntries)*4
	cqSize := uintptr(p.cqOff.cqes) + uintptr(p.cqEntries)*unsafe.Sizeof(cqe{})
	ring, err := unix.Mmap(r.fd, offSQRing, int(max(sqSize, cqSize)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("uring: mmap rings: %w", err)
	}
	r.mmaps = append(r.mmaps, ring)
	sqeMem, err := unix.Mmap(r.fd, offSQEs, int(uintptr(p.sqEntries)*unsafe.Sizeof(sqe{})), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("uring: mmap SQEs: %w", err)
	}
	r.mmaps = append(r.mmaps, sqeMem)
	at := func(off uint32) unsafe.Pointer { return unsafe.Pointer(&ring[off]) }
	r.sqTail = (*uint32)(at(p.sqOff.tail))
	if p.flags&setupTaskrunFlag != 0 {
		r.sqFlags = (*uint32)(at(p.sqOff.flags))
	}
	r.sqMask = *(*uint32)(at(p.sqOff.ringMask))
	r.sqArray = unsafe.Slice((*uint32)(at(p.sqOff.array)), p.sqEntries)
	r.sqes = unsafe.Slice((*sqe)(unsafe.Pointer(&sqeMem[0])), p.sqEntries)
	r.cqHead = (*uint32)(at(p.cqOff.head))
	r.cqTail = (*uint32)(at(p.cqOff.tail))
	r.cqMask = *(*uint32)(at(p.cqOff.ringMask))
	r.cqes = unsafe.Slice((*cqe)(at(p.cqOff.cqes)), p.cqEntries)
	if p.cqOff.flags != 0 {
		r.cqFlags = (*uint32)(at(p.cqOff.flags))
		atomic.OrUint32(r.cqFlags, cqEventfdDisabled)
	}
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("uring: eventfd: %w", err)
	}
	e := int32(efd)
	if _, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), registerEventfd, uintptr(unsafe.Pointer(&e)), 1, 0, 0); errno != 0 {
		unix.Close(efd)
		return fmt.Errorf("uring: register eventfd: %w", errno)
	}
	r.ev = os.NewFile(uintptr(efd), "io_uring eventfd")
	return nil
}

func (r *Ring) unmap() {
	for _, m := range r.mmaps {
		unix.Munmap(m)
	}
	r.mmaps = nil
}

// ReadAt reads len(p) bytes at off from fd (short only at end of file,
// then with io.EOF's meaning left to the caller: n < len(p), nil error).
func (r *Ring) ReadAt(fd int, p []byte, off int64) (int, error) {
	done := 0
	for done < len(p) {
		res, err := r.do(opRead, fd, p[done:], off+int64(done), 0)
		if err != nil {
			return done, err
		}
		if res == 0 {
			break
		}
		done += int(res)
	}
	return done, nil
}

// WriteAt writes p at off to fd; flags are pwritev2's (unix.RWF_DSYNC:
// the data is durable when WriteAt returns).
func (r *Ring) WriteAt(fd int, p []byte, off int64, flags uint32) (int, error) {
	done := 0
	for done < len(p) {
		res, err := r.do(opWrite, fd, p[done:], off+int64(done), flags)
		if err != nil {
			return done, err
		}
		if res == 0 {
			return done, fmt.Errorf("uring: write at %d: %w", off+int64(done), syscall.EIO)
		}
		done += int(res)
	}
	return done, nil
}

// do runs one operation and returns its result (bytes moved).
func (r *Ring) do(op uint8, fd int, p []byte, off int64, rwFlags uint32) (int32, error) {
	var idx uint32
	select {
	case <-r.closed:
		return 0, ErrClosed
	case idx = <-r.free:
	}
	s := &r.slots[idx]
	alone := r.inflight.Add(1) == 1
	defer r.inflight.Add(-1)
	p = p[:min(len(p), 1<<30)] // a result must fit the CQE's int32; callers loop
	var addr uintptr
	if len(p) > 0 {
		s.buf = unsafe.Pointer(&p[0]) // keeps p alive and on the heap while the kernel holds it
		s.pin.Pin(s.buf)
		addr = uintptr(s.buf)
	}
	for {
		r.sqMu.Lock()
		tail := *r.sqTail
		i := tail & r.sqMask
		r.sqes[i] = sqe{opcode: op, fd: int32(fd), off: uint64(off), addr: uint64(addr), len: uint32(len(p)), rwFlags: rwFlags, userData: uint64(idx)}
		r.sqArray[i] = i
		atomic.StoreUint32(r.sqTail, tail+1)
		r.sqMu.Unlock()
		switch {
		case alone && r.polls:
			r.submit()
			r.pollWait(s)
		case alone:
			r.submitAndWait(s)
		default:
			r.submit()
		}
		r.reap()
		res := r.wait(s)
		if res == -int32(unix.EINTR) || res == -int32(unix.EAGAIN) {
			continue
		}
		s.pin.Unpin()
		s.buf = nil
		r.free <- idx
		if res < 0 {
			return 0, syscall.Errno(-res)
		}
		return res, nil
	}
}

// submit hands the kernel one SQE (this caller's, or another's placed
// meanwhile whose caller will then hand over this one), in a raw system
// call: without IORING_ENTER_GETEVENTS io_uring_enter does not sleep.
func (r *Ring) submit() {
	for {
		_, _, errno := unix.RawSyscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), 1, 0, 0, 0, 0)
		switch errno {
		case 0:
			return
		case unix.EINTR, unix.EAGAIN, unix.EBUSY:
			// Interrupted, or the kernel is short of memory or its CQ is
			// full of completions not yet reaped: reap and try again.
			r.reap()
			runtime.Gosched()
		default:
			// The ring itself is broken (EBADF, EFAULT): nothing but a
			// programming error gets here.
			panic(fmt.Sprintf("uring: io_uring_enter: %v", errno))
		}
	}
}

// submitAndWait hands the kernel one SQE and waits in the same system
// call for a completion: the path of a caller alone on the ring. The
// kernel completes a read or write as task work of the task that
// submitted it, so a caller that sleeps in io_uring_enter is woken once,
// by its own completion, and finds it posted; one that parks on its
// channel instead costs a wake-up of its thread for the task work and
// another of the netpoller's for the eventfd (measured on a loop device,
// 4 KiB O_DIRECT reads one at a time: 136 µs against 71 µs for pread).
// Whatever the outcome — a completion of another caller's operation, an
// interrupted wait — the caller then reaps and waits as any other.
func (r *Ring) submitAndWait(s *slot) {
	if !r.enterWait(s, 1) {
		// Nothing was submitted (the count would have been returned):
		// the SQE may still be in the ring.
		r.submit()
	}
}

// pollWait waits, for the caller alone on the ring after its submission,
// until the CQ holds a completion or s its result: it reads the CQ's
// tail, yielding between reads, for as long as the polling time says,
// then sleeps in io_uring_enter. A submission the kernel could not
// complete at once completes as task work of the submitting thread. A
// ring that polls is set up so that the kernel does not interrupt a
// running thread for it (IORING_SETUP_COOP_TASKRUN) but flags it in the
// SQ ring (IORING_SETUP_TASKRUN_FLAG): pollWait then runs it itself, in
// an io_uring_enter that cannot sleep, and finds the completion posted.
// That saves an inter-processor interrupt per I/O — on a virtual machine
// an exit to the hypervisor; a thread sleeping for it is woken either
// way. (On kernels before 5.19 the kernel interrupts the polling thread
// to run its task work, as it wakes one that slept: the wake-up of an idle
// core is what polling saves there.) The completion found may be another
// caller's, come meanwhile, and this one's may have been reaped by
// another: the caller then reaps and waits as any other.
func (r *Ring) pollWait(s *slot) {
	r.poll.Start()
	for atomic.LoadUint32(r.cqTail) == atomic.LoadUint32(r.cqHead) && len(s.done) == 0 {
		if r.sqFlags != nil && atomic.LoadUint32(r.sqFlags)&sqTaskrun != 0 {
			unix.RawSyscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), 0, 0, enterGetEvents, 0, 0)
			if atomic.LoadUint32(r.cqTail) != atomic.LoadUint32(r.cqHead) {
				break
			}
		}
		if !r.poll.Again() {
			r.enterWait(s, 0)
			r.poll.Woke() // the next waits poll as long as this one took, within poll
			return
		}
		runtime.Gosched()
	}
}

// enterWait submits n SQEs (0 or 1) and sleeps in io_uring_enter until
// the CQ holds a completion — unless, with nothing to submit, the CQ
// holds one already or s has its result. It reports whether the
// submission was made (false: the system call failed before it).
//
// While it sleeps nobody else reaps (kwait): the kernel counts the
// completions between the CQ's head and tail, so a completion of this
// caller's that another reaped first would leave it asleep with its
// operation done — for good, if no other operation were in flight.
// The completions of others, posted meanwhile, end the sleep; this
// caller reaps them when it returns.
func (r *Ring) enterWait(s *slot, n uintptr) bool {
	r.cqMu.Lock()
	if n == 0 && (len(s.done) > 0 || atomic.LoadUint32(r.cqTail) != *r.cqHead) {
		r.cqMu.Unlock()
		return true
	}
	r.kwait = true
	r.cqMu.Unlock()
	_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), n, 1, enterGetEvents, 0, 0)
	r.cqMu.Lock()
	r.kwait = false
	r.cqMu.Unlock()
	// An interrupted wait (EINTR) leaves the caller to wait on its
	// channel; a failed submission reports itself.
	return errno == 0 || n == 0
}

// wait returns s's result, waiting for an asynchronous completion with
// the eventfd switched on.
func (r *Ring) wait(s *slot) int32 {
	select {
	case res := <-s.done:
		return res
	default:
	}
	r.evMu.Lock()
	if r.waiting == 0 && r.cqFlags != nil {
		atomic.AndUint32(r.cqFlags, ^uint32(cqEventfdDisabled))
	}
	r.waiting++
	r.evMu.Unlock()
	// A completion posted before the eventfd was switched on signalled
	// nobody: reap once more now that later ones will.
	r.reap()
	res := <-s.done
	r.evMu.Lock()
	r.waiting--
	if r.waiting == 0 && r.cqFlags != nil {
		atomic.OrUint32(r.cqFlags, cqEventfdDisabled)
	}
	r.evMu.Unlock()
	return res
}

// reap delivers every completion in the CQ to its slot — none while a
// caller sleeps in io_uring_enter (enterWait), which reaps when it
// returns.
func (r *Ring) reap() {
	r.cqMu.Lock()
	if r.kwait {
		r.cqMu.Unlock()
		return
	}
	head := *r.cqHead
	tail := atomic.LoadUint32(r.cqTail)
	for ; head != tail; head++ {
		c := &r.cqes[head&r.cqMask]
		r.slots[c.userData].done <- c.res
	}
	atomic.StoreUint32(r.cqHead, head)
	r.cqMu.Unlock()
}

// reaper delivers completions the eventfd announces, until Close. It
// reads the eventfd with a raw system call and waits for it in the
// netpoller (see the package comment).
func (r *Ring) reaper() {
	defer close(r.reaperEnd)
	var b [8]byte
	rc, err := r.ev.SyscallConn()
	if err != nil {
		return
	}
	read := func(fd uintptr) bool {
		_, _, errno := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), 8)
		return errno != unix.EAGAIN
	}
	for {
		if err := rc.Read(read); err != nil {
			return
		}
		r.reap()
	}
}

// Close waits for the operations in flight, then releases the ring.
// Operations started afterwards fail with ErrClosed.
func (r *Ring) Close() error {
	r.once.Do(func() {
		close(r.closed)
		for range r.entries {
			<-r.free
		}
		r.ev.Close()
		<-r.reaperEnd
		r.unmap()
		unix.Close(r.fd)
	})
	return nil
}
