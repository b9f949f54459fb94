package uring

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func newRing(t *testing.T, entries uint32, poll time.Duration) *Ring {
	t.Helper()
	r, err := New(entries, poll)
	if err != nil {
		t.Fatalf("io_uring on this kernel: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// kinds are the ways a caller alone on the ring waits: in the kernel at
// once, or polling the CQ first (serve --poll) — long, or so briefly
// that most waits end in the kernel after polling (where a caller whose
// completion another reaped first once slept on).
var kinds = []struct {
	name string
	poll time.Duration
}{{"sleeping", 0}, {"polling", time.Millisecond}, {"polling briefly", 20 * time.Microsecond}}

func TestLayout(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"sqe", unsafe.Sizeof(sqe{}), 64},
		{"cqe", unsafe.Sizeof(cqe{}), 16},
		{"params", unsafe.Sizeof(params{}), 120},
		{"sqe.userData", unsafe.Offsetof(sqe{}.userData), 32},
		{"sqe.addr3", unsafe.Offsetof(sqe{}.addr3), 48},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d (include/uapi/linux/io_uring.h)", c.name, c.got, c.want)
		}
	}
}

func TestEntries(t *testing.T) {
	for _, n := range []uint32{0, 3, 8192} {
		if r, err := New(n, 0); err == nil {
			r.Close()
			t.Errorf("New(%d) succeeded", n)
		}
	}
}

// TestReadWrite checks data through the ring against the file read
// with plain system calls, and the reverse, from many goroutines at once
// — more than the ring has entries, so callers wait for slots.
func TestReadWrite(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) { testReadWrite(t, newRing(t, 8, k.poll)) })
	}
}

func testReadWrite(t *testing.T, r *Ring) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const blk, blocks = 4096, 256
	if err := f.Truncate(blk * blocks); err != nil {
		t.Fatal(err)
	}
	fd := int(f.Fd())
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 32 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			buf, got := make([]byte, blk), make([]byte, blk)
			for range 200 {
				b := g + 32*rng.IntN(blocks/32) // each goroutine its own blocks
				for i := range buf {
					buf[i] = byte(rng.Uint32())
				}
				if n, err := r.WriteAt(fd, buf, int64(b)*blk, 0); err != nil || n != blk {
					errs <- errors.Join(err, errors.New("short write"))
					return
				}
				if _, err := f.ReadAt(got, int64(b)*blk); err != nil || !bytes.Equal(got, buf) {
					errs <- errors.New("written through the ring, read back otherwise: differs")
					return
				}
				for i := range buf {
					buf[i] = byte(rng.Uint32())
				}
				if _, err := f.WriteAt(buf, int64(b)*blk); err != nil {
					errs <- err
					return
				}
				if n, err := r.ReadAt(fd, got, int64(b)*blk); err != nil || n != blk || !bytes.Equal(got, buf) {
					errs <- errors.Join(err, errors.New("written otherwise, read through the ring: differs"))
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestShortReadAtEnd reads across the end of the file: the bytes that
// exist, no error.
func TestShortReadAtEnd(t *testing.T) {
	r := newRing(t, 4, 0)
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 16)
	n, err := r.ReadAt(int(f.Fd()), buf, 2)
	if err != nil || string(buf[:n]) != "llo" {
		t.Fatalf("read %q, %v; want \"llo\"", buf[:n], err)
	}
}

// TestErrors: the kernel's error comes back as the errno.
func TestErrors(t *testing.T) {
	r := newRing(t, 4, 0)
	f, err := os.Open(filepath.Join("/proc/self/status"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := r.WriteAt(int(f.Fd()), []byte("x"), 0, 0); !errors.Is(err, unix.EBADF) {
		t.Errorf("write to a read-only fd: %v, want EBADF", err)
	}
	if _, err := r.ReadAt(-1, make([]byte, 8), 0); !errors.Is(err, unix.EBADF) {
		t.Errorf("read of fd -1: %v, want EBADF", err)
	}
}

// TestAsyncCompletion waits on a pipe, which the kernel completes from
// its worker once data arrives — not inline. The reader is alone on the
// ring, so it waits in io_uring_enter (submitAndWait), or polls first.
func TestAsyncCompletion(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) { testAsyncCompletion(t, newRing(t, 4, k.poll)) })
	}
}

func testAsyncCompletion(t *testing.T, r *Ring) {
	rfd, pw := blockingPipe(t)
	got := make(chan string, 1)
	go func() {
		buf := make([]byte, 5)
		n, err := r.ReadAt(rfd, buf, -1) // offset -1: the pipe's own position
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(buf[:n])
	}()
	select {
	case s := <-got:
		t.Fatalf("read returned %q before anything was written", s)
	case <-time.After(50 * time.Millisecond):
	}
	if _, err := pw.Write([]byte("async")); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != "async" {
			t.Fatalf("read %q", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an asynchronous completion was never delivered")
	}
}

// TestPolling: a caller alone on a ring that polls finds a completion
// that comes within its polling time while polling, not after a sleep in
// the kernel; one that comes later it finds after sleeping there, and the
// polling of the waits to come is halved (internal/spin's rule for a
// wait past the most). With one P, so the polling caller must yield to
// the goroutine that writes.
func TestPolling(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	read := func(r *Ring, after time.Duration) {
		t.Helper()
		rfd, pw := blockingPipe(t)
		done := make(chan error, 1)
		go func() {
			_, err := r.ReadAt(rfd, make([]byte, 1), -1)
			done <- err
		}()
		for r.inflight.Load() != 1 {
			runtime.Gosched()
		}
		time.Sleep(after)
		if _, err := pw.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		delivered(t, done)
	}

	r := newRing(t, 4, 2*time.Second)
	read(r, 20*time.Millisecond)
	if !r.poll.Polled() {
		t.Error("a completion 20 ms after the submission, polling up to 2 s: found after a sleep, not while polling")
	}
	if got := r.poll.Current(); got != 2*time.Second {
		t.Errorf("polling time after a wait it bridged: %v, want 2s", got)
	}

	r = newRing(t, 4, 5*time.Millisecond)
	read(r, 100*time.Millisecond)
	if r.poll.Polled() {
		t.Error("a completion 100 ms after the submission, polling up to 5 ms: found while polling")
	}
	if got := r.poll.Current(); got != 2500*time.Microsecond {
		t.Errorf("polling time after a wait of 100 ms: %v, want 2.5ms (halved)", got)
	}
}

// TestPollingDefersTaskWork: a ring that polls has the kernel flag its
// task work in the SQ ring rather than interrupt the polling thread
// (pollWait runs it); a ring that sleeps keeps the kernel's default,
// which interrupts or wakes the submitting thread at once. The kernels
// this project runs on (5.19 and later) grant both flags.
func TestPollingDefersTaskWork(t *testing.T) {
	if r := newRing(t, 4, time.Millisecond); r.sqFlags == nil {
		t.Error("a ring that polls: no IORING_SETUP_COOP_TASKRUN/TASKRUN_FLAG")
	}
	if r := newRing(t, 4, 0); r.sqFlags != nil {
		t.Error("a ring that sleeps defers its task work")
	}
}

// TestNoSleepWithResult: a caller whose completion another reaped
// while it polled (its result in its channel, the CQ empty) must not
// then sleep in the kernel: nothing might ever wake it. And while a
// caller sleeps there, nobody else reaps (a completion of its own, taken
// first, would leave it asleep): another's completion ends the sleep,
// and the sleeper delivers it.
func TestNoSleepWithResult(t *testing.T) {
	r := newRing(t, 4, time.Millisecond)
	s := &r.slots[0]
	s.done <- 7
	slept := make(chan struct{})
	go func() { r.enterWait(s, 0); close(slept) }()
	select {
	case <-slept:
	case <-time.After(10 * time.Second):
		t.Fatal("enterWait slept with the caller's result delivered")
	}
	<-s.done

	// The test plays the sleeper (kwait, and an operation in flight, so
	// that the reader is not alone and waits on its channel).
	rfd, pw := blockingPipe(t)
	r.cqMu.Lock()
	r.kwait = true
	r.cqMu.Unlock()
	r.inflight.Add(1)
	defer r.inflight.Add(-1)
	got := make(chan error, 1)
	go func() {
		_, err := r.ReadAt(rfd, make([]byte, 1), -1)
		got <- err
	}()
	for r.inflight.Load() != 2 {
		time.Sleep(time.Millisecond)
	}
	pw.Write([]byte{1})
	for deadline := time.Now().Add(10 * time.Second); atomic.LoadUint32(r.cqTail) == atomic.LoadUint32(r.cqHead); {
		if time.Now().After(deadline) || len(got) > 0 {
			t.Fatal("the completion was reaped, or never came, while a caller slept in io_uring_enter")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(10 * time.Millisecond) // the reaper goroutine's turn, after the eventfd
	r.reap()                          // kwait: another caller's reap leaves the CQ to the sleeper
	if atomic.LoadUint32(r.cqTail) == atomic.LoadUint32(r.cqHead) {
		t.Fatal("a completion was reaped while a caller slept in io_uring_enter")
	}
	r.cqMu.Lock()
	r.kwait = false
	r.cqMu.Unlock()
	r.reap()
	delivered(t, got)
}

// delivered waits for an operation's outcome and fails the test on an
// error or when none comes.
func delivered(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the completion was never delivered")
	}
}

// TestWaitersTogether: a caller alone on the ring waits in the kernel;
// a second one, arriving meanwhile, waits on its channel, and its
// completion, posted first, wakes the first one's wait too. Each must get
// its own result: the second through the reap of whoever sees its
// completion first, the first afterwards through the eventfd and the
// reaper, since it no longer waits in the kernel.
func TestWaitersTogether(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) { testWaitersTogether(t, k.poll) })
	}
}

func testWaitersTogether(t *testing.T, poll time.Duration) {
	for range 20 {
		r := newRing(t, 4, poll)
		type pipe struct {
			rfd int
			w   *os.File
		}
		var ps [2]pipe
		for i := range ps {
			ps[i].rfd, ps[i].w = blockingPipe(t)
		}
		got := [2]chan string{make(chan string, 1), make(chan string, 1)}
		read := func(i int) {
			buf := make([]byte, 3)
			n, err := r.ReadAt(ps[i].rfd, buf, -1)
			if err != nil {
				got[i] <- err.Error()
				return
			}
			got[i] <- string(buf[:n])
		}
		go read(0)
		for r.inflight.Load() != 1 {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(5 * time.Millisecond) // the first is in io_uring_enter by now, most likely
		go read(1)
		for r.inflight.Load() != 2 {
			time.Sleep(time.Millisecond)
		}
		// expect waits for caller i's result; on a failure it feeds both
		// pipes first, so that the ring's Close (a cleanup) can return.
		expect := func(i int, want, what string) {
			t.Helper()
			select {
			case s := <-got[i]:
				if s == want {
					return
				}
				ps[0].w.Write([]byte("end"))
				ps[1].w.Write([]byte("end"))
				t.Fatalf("%s: read %q, want %q", what, s, want)
			case <-time.After(10 * time.Second):
				ps[0].w.Write([]byte("end"))
				ps[1].w.Write([]byte("end"))
				t.Fatalf("%s: its completion was never delivered", what)
			}
		}
		ps[1].w.Write([]byte("two"))
		expect(1, "two", "the second caller")
		select {
		case s := <-got[0]:
			t.Fatalf("the first read returned %q before its pipe had data", s)
		case <-time.After(5 * time.Millisecond):
		}
		ps[0].w.Write([]byte("one"))
		expect(0, "one", "the first caller, after its wait in the kernel ended")
	}
}

// TestCloseWaitsForOperations: Close returns once the operation in
// flight has completed; later operations fail with ErrClosed.
func TestCloseWaitsForOperations(t *testing.T) {
	r, err := New(2, 0)
	if err != nil {
		t.Fatal(err)
	}
	rfd, pw := blockingPipe(t)
	readDone := make(chan error, 1)
	go func() {
		_, err := r.ReadAt(rfd, make([]byte, 1), -1)
		readDone <- err
	}()
	time.Sleep(50 * time.Millisecond)
	closed := make(chan struct{})
	go func() { r.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned with a read in flight")
	case <-time.After(50 * time.Millisecond):
	}
	pw.Write([]byte{1})
	if err := <-readDone; err != nil {
		t.Fatal(err)
	}
	<-closed
	if _, err := r.ReadAt(rfd, make([]byte, 1), -1); !errors.Is(err, ErrClosed) {
		t.Fatalf("read after Close: %v, want ErrClosed", err)
	}
}

// blockingPipe is a pipe whose read end is a blocking descriptor outside
// the netpoller: the kernel completes a read of it from its worker once
// data arrives, not inline. Both ends close when the test ends.
func blockingPipe(t *testing.T) (rfd int, w *os.File) {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pw.Close(); pr.Close() })
	rfd, err = unix.Dup(int(pr.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(rfd) })
	if err := unix.SetNonblock(rfd, false); err != nil {
		t.Fatal(err)
	}
	return rfd, pw
}

// TestNoAllocations: an inline read or write costs no allocation.
func TestNoAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race; .ci/run runs this test without it")
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) { testNoAllocations(t, newRing(t, 4, k.poll)) })
	}
}

func testNoAllocations(t *testing.T, r *Ring) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	fd := int(f.Fd())
	r.WriteAt(fd, buf, 0, 0)
	if a := testing.AllocsPerRun(200, func() {
		r.WriteAt(fd, buf, 0, 0)
		r.ReadAt(fd, buf, 0)
	}); a > 0 {
		t.Errorf("%.1f allocations per write and read", a)
	}
}
