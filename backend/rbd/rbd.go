//go:build rbd

// Package rbd keeps a logical unit's blocks in a Ceph RBD image. Reads,
// writes, flushes, write-zeroes (for UNMAP) and compare-and-write go
// through librbd's asynchronous API, so a LU has as many requests in
// flight as the SCSI layer gives it; completions come back through a pipe
// that one goroutine reads, so a waiting request holds no thread. The
// image's write-back cache is off: a write is acknowledged once the
// cluster has it, so a gateway that dies loses no acknowledged write.
//
// It needs cgo and Debian's librbd-dev and librados-dev, and builds only
// with the rbd build tag; the default build stays pure Go.
package rbd

/*
#cgo LDFLAGS: -lrbd -lrados
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include <rbd/librbd.h>

// A completion's argument is the pipe's descriptor (high 32 bits) and the
// request's slot (low 32 bits); librbd calls bw_done on one of its threads
// and bw_done writes the slot number to the pipe. Four-byte writes to a
// pipe are atomic, and a slot is in flight at most once, so the pipe never
// fills.
static void bw_done(rbd_completion_t c, void *arg) {
	uint64_t a = (uint64_t)(uintptr_t)arg;
	uint32_t slot = (uint32_t)a;
	ssize_t n;
	do {
		n = write((int)(a >> 32), &slot, sizeof slot);
	} while (n < 0 && errno == EINTR);
}

static int bw_completion(uint64_t arg, rbd_completion_t *c) {
	return rbd_aio_create_completion((void *)(uintptr_t)arg, bw_done, c);
}

// bw_finish returns a completed request's result and releases it.
static int64_t bw_finish(rbd_completion_t c) {
	int64_t r = rbd_aio_get_return_value(c);
	rbd_aio_release(c);
	return r;
}

// The update watch (size changes and other header updates made by any
// client) reports through the same pipe, as slot 0xffffffff.
static void bw_updated(void *arg) {
	bw_done(NULL, arg);
}

static int bw_update_watch(rbd_image_t image, uint64_t *handle, uint64_t arg) {
	return rbd_update_watch(image, handle, bw_updated, (void *)(uintptr_t)arg);
}

static int bw_open(void *ioctx, const char *name, rbd_image_t *image) {
	return rbd_open((rados_ioctx_t)ioctx, name, image, NULL);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/blockwire/blockwire/backend"
	"github.com/ceph/go-ceph/rados"
)

// Config names an image and how to reach its cluster.
type Config struct {
	// ConfFile is the cluster's ceph.conf; empty: librados's default
	// search (CEPH_CONF, /etc/ceph/ceph.conf, …).
	ConfFile string
	// Keyring is the client's keyring file; empty: what ceph.conf says.
	Keyring string
	// User is the client name without "client." (default "admin").
	User string
	// Pool, Namespace (may be empty) and Image locate the image.
	Pool, Namespace, Image string
	// Depth is the most requests in flight (default 128).
	Depth int
	// Logger receives the image's events (size changes, lock owner).
	Logger *slog.Logger
}

const updateSlot = 0xffffffff

// slot is one request in flight.
type slot struct {
	idx  uint32
	comp C.rbd_completion_t
	pin  runtime.Pinner
	done chan int64
}

// Image is an open RBD image. It is safe for concurrent use.
type Image struct {
	cfg   Config
	log   *slog.Logger
	conn  *rados.Conn
	ioctx *rados.IOContext
	image C.rbd_image_t
	id    string // the image's id: the same for every client
	fsid  string

	size atomic.Int64

	r, w   *os.File // completion pipe
	wfd    uint64
	slots  []slot
	free   chan *slot
	ints   *C.uint64_t // per slot: COMPARE AND WRITE's mismatch offset (C memory: librbd writes it later)
	watch  C.uint64_t
	watchd bool

	mu       sync.Mutex
	st       *stateStore // shared state (reservations), made on first use
	onResize func()
	closed   bool
	loopDone chan struct{}
}

// Open connects to the cluster and opens the image.
func Open(cfg Config) (*Image, error) {
	if cfg.User == "" {
		cfg.User = "admin"
	}
	if cfg.Depth <= 0 {
		cfg.Depth = 128
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	conn, err := rados.NewConnWithUser(cfg.User)
	if err != nil {
		return nil, fmt.Errorf("rbd: %w", err)
	}
	if cfg.ConfFile != "" {
		err = conn.ReadConfigFile(cfg.ConfFile)
	} else {
		err = conn.ReadDefaultConfigFile()
	}
	if err != nil {
		conn.Shutdown()
		return nil, fmt.Errorf("rbd: reading the Ceph configuration: %w", err)
	}
	// No write-back cache in this process: an acknowledged write must be
	// in the cluster, whatever happens to this gateway.
	opts := [][2]string{{"rbd_cache", "false"}}
	if cfg.Keyring != "" {
		opts = append(opts, [2]string{"keyring", cfg.Keyring})
	}
	for _, o := range opts {
		if err := conn.SetConfigOption(o[0], o[1]); err != nil {
			conn.Shutdown()
			return nil, fmt.Errorf("rbd: setting %s: %w", o[0], err)
		}
	}
	if err := conn.Connect(); err != nil {
		conn.Shutdown()
		return nil, fmt.Errorf("rbd: connecting to the cluster: %w", err)
	}
	im := &Image{cfg: cfg, log: cfg.Logger.With("rbd", cfg.Pool+"/"+nsPrefix(cfg.Namespace)+cfg.Image), conn: conn,
		loopDone: make(chan struct{})}
	if err := im.open(); err != nil {
		conn.Shutdown()
		return nil, err
	}
	return im, nil
}

func nsPrefix(ns string) string {
	if ns == "" {
		return ""
	}
	return ns + "/"
}

func (im *Image) open() error {
	cfg := im.cfg
	fsid, err := im.conn.GetFSID()
	if err != nil {
		return fmt.Errorf("rbd: cluster id: %w", err)
	}
	im.fsid = fsid
	ioctx, err := im.conn.OpenIOContext(cfg.Pool)
	if err != nil {
		return fmt.Errorf("rbd: pool %q: %w", cfg.Pool, err)
	}
	ioctx.SetNamespace(cfg.Namespace)
	name := C.CString(cfg.Image)
	defer C.free(unsafe.Pointer(name))
	if r := C.bw_open(ioctx.Pointer(), name, &im.image); r < 0 {
		ioctx.Destroy()
		return fmt.Errorf("rbd: opening image %s/%s%s: %w", cfg.Pool, nsPrefix(cfg.Namespace), cfg.Image, errno(int64(r)))
	}
	im.ioctx = ioctx
	var idbuf [64]C.char
	if r := C.rbd_get_id(im.image, &idbuf[0], C.size_t(len(idbuf))); r < 0 {
		im.closeImage()
		return fmt.Errorf("rbd: image id: %w", errno(int64(r)))
	}
	im.id = C.GoString(&idbuf[0])
	var size C.uint64_t
	if r := C.rbd_get_size(im.image, &size); r < 0 {
		im.closeImage()
		return fmt.Errorf("rbd: image size: %w", errno(int64(r)))
	}
	im.size.Store(int64(size))
	var features C.uint64_t
	if r := C.rbd_get_features(im.image, &features); r == 0 && features&C.RBD_FEATURE_EXCLUSIVE_LOCK != 0 {
		// librbd hands the lock to whichever client writes; a dead
		// holder's lock is broken once the cluster drops its watch
		// (osd_client_watch_timeout), which bounds a failover.
		im.log.Info("rbd: image has the exclusive-lock feature: gateways writing at once take the lock in turn")
	}

	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		im.closeImage()
		return fmt.Errorf("rbd: completion pipe: %w", err)
	}
	// The read end is non-blocking so the runtime's poller waits on it;
	// the write end stays blocking for librbd's threads.
	if err := syscall.SetNonblock(p[0], true); err != nil {
		syscall.Close(p[0])
		syscall.Close(p[1])
		im.closeImage()
		return fmt.Errorf("rbd: completion pipe: %w", err)
	}
	im.r = os.NewFile(uintptr(p[0]), "rbd-completions")
	im.w = os.NewFile(uintptr(p[1]), "rbd-completions-w")
	im.wfd = uint64(p[1]) << 32
	im.slots = make([]slot, cfg.Depth)
	im.free = make(chan *slot, cfg.Depth)
	im.ints = (*C.uint64_t)(C.calloc(C.size_t(cfg.Depth), 8))
	for i := range im.slots {
		s := &im.slots[i]
		s.idx = uint32(i)
		s.done = make(chan int64, 1)
		im.free <- s
	}
	if r := C.bw_update_watch(im.image, &im.watch, C.uint64_t(im.wfd|updateSlot)); r < 0 {
		im.log.Warn("rbd: no update watch: size changes made elsewhere will not be seen", "err", errno(int64(r)))
	} else {
		im.watchd = true
	}
	go im.completions()
	return nil
}

func (im *Image) closeImage() {
	C.rbd_close(im.image)
	im.ioctx.Destroy()
}

// completions reads finished slots from the pipe and wakes their waiters.
func (im *Image) completions() {
	defer close(im.loopDone)
	var buf [4 * 256]byte
	for {
		n, err := io.ReadAtLeast(im.r, buf[:], 4)
		for o := 0; o+4 <= n; o += 4 {
			i := *(*uint32)(unsafe.Pointer(&buf[o]))
			if i == updateSlot {
				im.updated()
				continue
			}
			s := &im.slots[i]
			s.done <- int64(C.bw_finish(s.comp))
		}
		if n%4 != 0 {
			// Records are written whole; a short read here means the pipe
			// is broken.
			im.log.Error("rbd: completion pipe out of step", "bytes", n)
			return
		}
		if err != nil {
			return
		}
	}
}

// updated runs when the image header changed: a new size becomes the
// LU's new capacity.
func (im *Image) updated() {
	var size C.uint64_t
	if r := C.rbd_get_size(im.image, &size); r < 0 {
		im.log.Warn("rbd: image size after an update", "err", errno(int64(r)))
		return
	}
	old := im.size.Swap(int64(size))
	if old == int64(size) {
		return
	}
	im.log.Info("rbd: image size changed", "from", old, "to", int64(size))
	im.mu.Lock()
	f := im.onResize
	im.mu.Unlock()
	if f != nil {
		f()
	}
}

// submit runs start with a fresh completion for one slot, then waits for
// it. bufs are the Go buffers librbd uses until the completion.
func (im *Image) submit(start func(s *slot) C.int, bufs ...[]byte) (int64, error) {
	s := <-im.free
	defer func() { im.free <- s }()
	if r := C.bw_completion(C.uint64_t(im.wfd|uint64(s.idx)), &s.comp); r < 0 {
		return 0, errno(int64(r))
	}
	for _, b := range bufs {
		if len(b) > 0 {
			s.pin.Pin(&b[0])
		}
	}
	if r := start(s); r < 0 {
		C.rbd_aio_release(s.comp)
		s.pin.Unpin()
		return 0, errno(int64(r))
	}
	ret := <-s.done
	s.pin.Unpin()
	if ret < 0 {
		return 0, errno(ret)
	}
	return ret, nil
}

func ptr(b []byte) *C.char {
	if len(b) == 0 {
		return nil
	}
	return (*C.char)(unsafe.Pointer(&b[0]))
}

// ReadAt implements io.ReaderAt.
func (im *Image) ReadAt(p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, err := im.submit(func(s *slot) C.int {
		return C.rbd_aio_read(im.image, C.uint64_t(off), C.size_t(len(p)), ptr(p), s.comp)
	}, p)
	if err != nil {
		return 0, fmt.Errorf("rbd: read %d bytes at %d: %w", len(p), off, err)
	}
	if int(n) < len(p) {
		return int(n), io.ErrUnexpectedEOF
	}
	return len(p), nil
}

// WriteAt implements io.WriterAt.
func (im *Image) WriteAt(p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	_, err := im.submit(func(s *slot) C.int {
		return C.rbd_aio_write(im.image, C.uint64_t(off), C.size_t(len(p)), ptr(p), s.comp)
	}, p)
	if err != nil {
		return 0, fmt.Errorf("rbd: write %d bytes at %d: %w", len(p), off, err)
	}
	return len(p), nil
}

// Size implements backend.Backend.
func (im *Image) Size() int64 { return im.size.Load() }

// Flush implements backend.Flusher (SYNCHRONIZE CACHE, FUA).
func (im *Image) Flush() error {
	if _, err := im.submit(func(s *slot) C.int { return C.rbd_aio_flush(im.image, s.comp) }); err != nil {
		return fmt.Errorf("rbd: flush: %w", err)
	}
	return nil
}

// Unmap implements backend.Unmapper with write-zeroes: whole objects are
// deallocated, partial ones zeroed, so the range reads back as zeroes
// (LBPRZ) — a plain discard may skip partial objects.
func (im *Image) Unmap(off, length int64) error {
	for length > 0 {
		// size_t is 64 bits here, but keep each request modest.
		n := min(length, 1<<30)
		_, err := im.submit(func(s *slot) C.int {
			return C.rbd_aio_write_zeroes(im.image, C.uint64_t(off), C.size_t(n), s.comp, 0, 0)
		})
		if err != nil {
			return fmt.Errorf("rbd: write-zeroes %d bytes at %d: %w", n, off, err)
		}
		off += n
		length -= n
	}
	return nil
}

// CompareAndWrite implements backend.CompareWriter with librbd's
// compare-and-write, which the cluster carries out atomically: it holds
// against writers through other gateways too.
func (im *Image) CompareAndWrite(cmp, data []byte, off int64) error {
	if len(cmp) != len(data) {
		return fmt.Errorf("rbd: compare-and-write of %d bytes with %d to compare", len(data), len(cmp))
	}
	var mis *C.uint64_t
	_, err := im.submit(func(s *slot) C.int {
		mis = (*C.uint64_t)(unsafe.Add(unsafe.Pointer(im.ints), 8*uintptr(s.idx)))
		*mis = 0
		return C.int(C.rbd_aio_compare_and_write(im.image, C.uint64_t(off), C.size_t(len(data)),
			ptr(cmp), ptr(data), s.comp, mis, 0))
	}, cmp, data)
	if errors.Is(err, syscall.EILSEQ) {
		// librbd reports where in the range the first difference is.
		return &backend.MiscompareError{Offset: int64(*mis)}
	}
	if err != nil {
		return fmt.Errorf("rbd: compare-and-write %d bytes at %d: %w", len(data), off, err)
	}
	return nil
}

// MaxCompareAndWrite implements backend.CompareWriter: librbd compares
// and writes one 512-byte sector.
func (im *Image) MaxCompareAndWrite() int { return 512 }

// Resize implements backend.Resizer.
func (im *Image) Resize(size int64) error {
	if r := C.rbd_resize(im.image, C.uint64_t(size)); r < 0 {
		return fmt.Errorf("rbd: resize to %d: %w", size, errno(int64(r)))
	}
	im.size.Store(size)
	return nil
}

// WatchCapacity implements backend.CapacityWatcher: f runs after the
// image was resized by any client.
func (im *Image) WatchCapacity(f func()) {
	im.mu.Lock()
	im.onResize = f
	im.mu.Unlock()
}

// Identity implements backend.Identifier: the cluster and the image's id,
// the same on every gateway that opens the image, so they all report one
// LU (NAA designator, serial number).
func (im *Image) Identity() string { return "rbd:" + im.fsid + "/" + im.id }

// LockOwner reports whether this client holds the image's exclusive lock
// (images with the exclusive-lock feature; librbd moves it between
// writers on demand).
func (im *Image) LockOwner() (bool, error) {
	var own C.int
	if r := C.rbd_is_exclusive_lock_owner(im.image, &own); r < 0 {
		return false, errno(int64(r))
	}
	return own != 0, nil
}

// IOContext is the pool (and namespace) the image lives in, for state
// shared between gateways (backend/rbd's reservation store).
func (im *Image) IOContext() *rados.IOContext { return im.ioctx }

// ID is the image's id in its pool.
func (im *Image) ID() string { return im.id }

// Close implements backend.Closer.
func (im *Image) Close() error {
	im.mu.Lock()
	if im.closed {
		im.mu.Unlock()
		return nil
	}
	im.closed = true
	im.onResize = nil
	st := im.st
	im.mu.Unlock()
	if st != nil {
		st.close()
	}
	if im.watchd {
		C.rbd_update_unwatch(im.image, im.watch)
	}
	// Every request has finished once all slots are back.
	for range im.slots {
		<-im.free
	}
	r := C.rbd_close(im.image)
	im.w.Close()
	<-im.loopDone
	im.r.Close()
	C.free(unsafe.Pointer(im.ints))
	im.ioctx.Destroy()
	im.conn.Shutdown()
	if r < 0 {
		return fmt.Errorf("rbd: close: %w", errno(int64(r)))
	}
	return nil
}

func errno(r int64) error {
	if r >= 0 {
		return nil
	}
	return syscall.Errno(-r)
}

var (
	_ backend.Backend         = (*Image)(nil)
	_ backend.Flusher         = (*Image)(nil)
	_ backend.Unmapper        = (*Image)(nil)
	_ backend.Resizer         = (*Image)(nil)
	_ backend.Closer          = (*Image)(nil)
	_ backend.CompareWriter   = (*Image)(nil)
	_ backend.CapacityWatcher = (*Image)(nil)
	_ backend.Identifier      = (*Image)(nil)
)
