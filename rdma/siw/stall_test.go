package siw

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blockwire/blockwire/rdma"
)

// stallConn stops reading when told to, as a peer that stops reading its
// socket does.
type stallConn struct {
	net.Conn
	stall  atomic.Bool
	closed chan struct{}
	once   sync.Once
}

func (c *stallConn) Read(p []byte) (int, error) {
	if c.stall.Load() {
		<-c.closed
		return 0, net.ErrClosed
	}
	return c.Conn.Read(p)
}

func (c *stallConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

type stallListener struct {
	net.Listener
	conns chan *stallConn
}

func (l *stallListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	sc := &stallConn{Conn: c, closed: make(chan struct{})}
	l.conns <- sc
	return sc, nil
}

// TestSendTimeout: a queue pair whose peer stops reading fails once its
// stream has taken no bytes for Options.SendTimeout, and its posted work
// completes in error — what holds buffers for the sends is released
// instead of waiting for ever (every connection bounds how long
// a send may block).
func TestSendTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sl := &stallListener{Listener: tl, conns: make(chan *stallConn, 1)}
	ln := New(Options{}).Serve(sl)
	defer ln.Close()
	a, b := newEndSize(0, 4<<20), newEndSize(0x10000, 4<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		if r, err := ln.Accept(ctx); err == nil {
			if qp, err := r.Accept(b.params(nil)); err == nil {
				defer qp.Close()
				<-ctx.Done()
			}
		}
	}()
	qa, _, err := New(Options{SendTimeout: timeout}).Dial(ctx, tl.Addr().String(), a.params(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer qa.Close()
	(<-sl.conns).stall.Store(true) // the peer stops reading
	data := a.mem[guard : guard+4<<20]
	posted := 0
	for i := range 32 {
		if err := qa.PostSend(&rdma.SendWR{ID: uint64(i), Op: rdma.OpWrite, SG: [][]byte{data}, RemoteSTag: b.mr.STag(), RemoteTO: b.va}); err != nil {
			break
		}
		posted++
	}
	start := time.Now()
	select {
	case <-qa.Done():
	case <-time.After(10 * timeout):
		t.Fatalf("the queue pair still stands %v after its peer stopped reading (send timeout %v)", 10*timeout, timeout)
	}
	if d := time.Since(start); d < timeout/2 {
		t.Fatalf("failed after %v, before the send timeout %v", d, timeout)
	}
	if qa.Err() == nil {
		t.Fatal("no error on the failed queue pair")
	}
	errs := 0
	for range posted {
		if c := wait(t, a.scq); c.Status != rdma.Success {
			errs++
		}
	}
	if errs == 0 {
		t.Fatalf("all %d writes completed successfully to a peer that read nothing", posted)
	}
}
