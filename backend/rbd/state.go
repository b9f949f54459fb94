//go:build rbd

package rbd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/blockwire/blockwire/backend"
	"github.com/ceph/go-ceph/rados"
)

// The shared state of the gateways serving one image — its LU's
// persistent reservations — is one RADOS object beside the image,
// "blockwire.state.<image id>". A change is a write conditional on the
// object's version (so two gateways never both win), then a notify on the
// object that returns once every watching gateway has acknowledged, and
// each acknowledges only after marking its copy out of date. So when a
// gateway answers PERSISTENT RESERVE OUT, every other gateway already
// enforces the new state on its next command.

const notifyTimeout = 5 * time.Second

// stateStore is the image's shared-state object.
type stateStore struct {
	im  *Image
	oid string

	mu    sync.Mutex // the ioctx's last version is per IOContext
	ioctx *rados.IOContext

	wmu     sync.Mutex
	changed func(version uint64)
	watcher *rados.Watcher
	stop    chan struct{}
	done    chan struct{}
}

func (im *Image) state() (*stateStore, error) {
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.st != nil {
		return im.st, nil
	}
	ioctx, err := im.conn.OpenIOContext(im.cfg.Pool)
	if err != nil {
		return nil, err
	}
	ioctx.SetNamespace(im.cfg.Namespace)
	s := &stateStore{im: im, oid: "blockwire.state." + im.id, ioctx: ioctx}
	// A watch needs the object: create it empty if it is not there.
	if err := ioctx.Create(s.oid, rados.CreateIdempotent); err != nil {
		ioctx.Destroy()
		return nil, fmt.Errorf("rbd: shared state object %s: %w", s.oid, err)
	}
	im.st = s
	return s, nil
}

// LoadState implements backend.SharedState.
func (im *Image) LoadState() ([]byte, uint64, error) {
	s, err := im.state()
	if err != nil {
		return nil, 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	buf := make([]byte, 1<<20)
	op := rados.CreateReadOp()
	defer op.Release()
	op.AssertExists()
	step := op.Read(0, buf)
	if err := op.Operate(s.ioctx, s.oid, rados.OperationNoFlag); err != nil {
		return nil, 0, fmt.Errorf("rbd: reading %s: %w", s.oid, err)
	}
	if step.BytesRead == int64(len(buf)) {
		return nil, 0, fmt.Errorf("rbd: %s is larger than %d bytes", s.oid, len(buf))
	}
	ver, err := s.ioctx.GetLastVersion()
	if err != nil {
		return nil, 0, err
	}
	return buf[:step.BytesRead], ver, nil
}

// StoreState implements backend.SharedState.
func (im *Image) StoreState(b []byte, ver uint64) (uint64, error) {
	s, err := im.state()
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	op := rados.CreateWriteOp()
	op.AssertVersion(ver)
	op.WriteFull(b)
	err = op.Operate(s.ioctx, s.oid, rados.OperationNoFlag)
	op.Release()
	var nv uint64
	if err == nil {
		nv, err = s.ioctx.GetLastVersion()
	}
	s.mu.Unlock()
	var code interface{ ErrorCode() int }
	if errors.As(err, &code) && (code.ErrorCode() == -int(syscall.ERANGE) || code.ErrorCode() == -int(syscall.EOVERFLOW)) {
		// The version assertion failed: another gateway stored first.
		return 0, backend.ErrStale
	}
	if err != nil {
		return 0, fmt.Errorf("rbd: writing %s: %w", s.oid, err)
	}
	var payload [8]byte
	binary.BigEndian.PutUint64(payload[:], nv)
	_, timeouts, err := s.ioctx.NotifyWithTimeout(s.oid, payload[:], notifyTimeout)
	if err != nil || len(timeouts) > 0 {
		// A gateway that does not answer within the timeout has lost its
		// watch; it reloads the state before its next command (its watch
		// error marks it stale) — the write stands either way.
		im.log.Warn("rbd: not every gateway acknowledged a shared state change", "object", s.oid, "unanswered", len(timeouts), "err", err)
	}
	return nv, nil
}

// WatchState implements backend.SharedState: changed runs (on a
// goroutine of the watch) with the new version before the change is
// acknowledged, and with 0 when the watch broke and changes may have been
// missed.
func (im *Image) WatchState(changed func(version uint64)) error {
	s, err := im.state()
	if err != nil {
		return err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.watcher != nil {
		return errors.New("rbd: shared state already watched")
	}
	w, err := s.ioctx.Watch(s.oid)
	if err != nil {
		return fmt.Errorf("rbd: watching %s: %w", s.oid, err)
	}
	s.watcher, s.changed = w, changed
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go s.watch(w)
	return nil
}

func (s *stateStore) watch(w *rados.Watcher) {
	defer close(s.done)
	for {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				return
			}
			var v uint64
			if len(ev.Data) == 8 {
				v = binary.BigEndian.Uint64(ev.Data)
			}
			s.changed(v)
			if err := ev.Ack(nil); err != nil {
				s.im.log.Warn("rbd: acknowledging a shared state change", "err", err)
			}
		case err, ok := <-w.Errors():
			if !ok {
				return
			}
			// Notifications may have been missed: the copy is reloaded
			// before it is trusted again, and the watch made anew.
			s.im.log.Warn("rbd: shared state watch lost; watching again", "err", err)
			s.changed(0)
			w = s.rewatch(w)
			if w == nil {
				return
			}
		case <-s.stop:
			return
		}
	}
}

// rewatch replaces a broken watch, retrying until it is made or the
// store closes.
func (s *stateStore) rewatch(old *rados.Watcher) *rados.Watcher {
	old.Delete()
	for {
		w, err := s.ioctx.Watch(s.oid)
		if err == nil {
			s.wmu.Lock()
			s.watcher = w
			s.wmu.Unlock()
			s.changed(0) // anything stored while no watch was up
			return w
		}
		select {
		case <-s.stop:
			return nil
		case <-time.After(time.Second):
		}
	}
}

func (s *stateStore) close() {
	s.wmu.Lock()
	w := s.watcher
	s.watcher = nil
	s.wmu.Unlock()
	if w != nil {
		close(s.stop)
		w.Delete()
		<-s.done
	}
	s.ioctx.Destroy()
}

var _ backend.SharedState = (*Image)(nil)
