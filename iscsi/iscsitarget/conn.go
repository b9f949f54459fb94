package iscsitarget

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/internal/logsample"
	"github.com/blockwire/blockwire/iscsi/pdu"
)

// conn is one iSCSI connection. It implements datamover.Upcalls: the
// datamover's receive goroutine calls it for every PDU.
type conn struct {
	srv *Server
	dm  datamover.Conn
	// kind is what the fabric established: a datamover that is or may
	// become iSER answers RDMAExtensions=Yes, and one that is iSER from
	// the start (connection first) InitialR2T=Yes, so solicited data moves
	// by RDMA Read.
	kind    datamover.Kind
	rejects atomic.Int64 // Rejects sent (noteRejected)
	// inline is the command the receiver is sequencing, which its
	// delivery may claim for the receiver to run (handleCommand); a
	// claim replaces it with &inlineClaimed.
	inline        atomic.Pointer[task]
	inlineClaimed task
	log           *slog.Logger

	// working counts the connection's commands handed to an LU's workers
	// and not yet answered. A worker waits for its answer to be written
	// (on iSER, for its Send to complete), so a peer that stops taking
	// answers holds the workers its commands reach. At maxWorking the
	// receiver runs commands for LUs that never block itself (task.run;
	// not on iSER); the others wait in parked, holding no worker, until
	// one of the connection's is done (toWorker, unpark).
	working atomic.Int32
	// src is what the connection shares with the others from its address:
	// their commands on workers, bounded together (toWorker).
	src *source
	// taskGone is signaled when a task leaves tasks (release), for the
	// receiver waiting to reuse an ITT (handleCommand).
	taskGone chan struct{}

	login    loginState
	loginITT uint32
	ffp      atomic.Bool
	slot     *loginSlot // among its source's logins in progress until ffp

	sess *session
	cid  uint16
	conf sessionParams

	// statSN is touched only by stamp, which the datamover calls under its
	// transmit lock.
	statSN uint32

	// Lock order: session.mu, then mu, then the SCSI core's locks;
	// Server.mu is never held with it. No datamover call is made under
	// mu (see session.mu).
	mu        sync.Mutex
	tasks     map[uint32]*task // by ITT
	byTTT     map[uint32]*task
	nextTTT   uint32
	closed    bool
	draining  bool // a target cold reset: commands are no longer taken
	loggedOut bool
	// parked are tasks ready to execute that wait for a worker: the
	// connection has maxWorking on workers, or its address its share
	// (Options.MaxWorkingPerSource). The receiver goes on reading
	// meanwhile — NOP-Out pings, task management, Logout — so a stalled
	// backend does not look like a dead connection to the initiator; the
	// command window bounds them (twice the window per connection, see
	// handleCommand). They leave in order (unpark). srcWaiter: a
	// goroutine waits for the address's share to free (waitSource).
	parked    []*task
	srcWaiter bool
	// logoutAsked is the logout wait (seconds) requested by Shutdown
	// during login, or -1.
	logoutAsked int
	inflight    inflight

	// Receive-goroutine state between DataBuffer and ControlNotify.
	pendingTask *task
	// mem is the I/O budget share what the datamover holds once logged
	// in is charged to (datamover.AcceptParams.Memory); closed when the
	// connection ends.
	mem *blockcore.IOShare
	// soliciting counts the connection's WRITEs holding a place for
	// solicited data (task.solicits, Options.SolicitedWrites);
	// waitingR2T are those in line for one, in arrival order. Guarded by
	// mu.
	soliciting int
	waitingR2T []*task
	pendingDO  doPlacement

	// Text negotiation continuation (RFC 7143 §11.10-11).
	textIn  []byte
	textOut []byte
	textTTT uint32
	// heard is set by every PDU received and cleared by the pinger at
	// each of its ticks: a flag, not a time, so that receiving costs no
	// read of the clock, and the pinger measures idleness on the
	// monotonic clock (a step of the wall clock, as NTP makes after a
	// virtual machine resumes, neither drops a connection nor stops its
	// pings).
	heard atomic.Bool
	// dataTimeouts counts the WRITEs ended for data that stopped coming
	// (pinger goroutine only).
	dataTimeouts int
	// asked is set by a discovery session's Text and Logout requests
	// (not by answers to pings) and cleared by the pinger, which ends a
	// discovery session that asks nothing for Options.DiscoveryIdle.
	asked    atomic.Bool
	pingTTT  atomic.Uint32
	pingOut  atomic.Bool // a NOP-In ping awaits its NOP-Out
	stop     chan struct{}
	stopOnce sync.Once
	// background counts the task management functions and Logouts
	// running on goroutines of their own (goBounded), refusedBG those
	// refused at the bound.
	background atomic.Int32
	refusedBG  atomic.Uint64
	tmfs       atomic.Uint64 // task management functions run, for their log
	// ending is set once the connection's receiver has ended; bgIdle
	// then hears when the last background function does
	// (awaitBackground).
	ending atomic.Bool
	bgIdle chan struct{}
}

type doPlacement struct {
	t     *task
	burst *burst
	off   uint32
	n     uint32
	valid bool
}

// newConn builds a connection whose datamover may be RDMA-assisted
// (iSER): it then offers RDMAExtensions=Yes.
func newConn(s *Server, remote string, est *datamover.Established) *conn {
	c := &conn{
		srv:   s,
		log:   s.log.With("remote", remote),
		tasks: map[uint32]*task{},
		byTTT: map[uint32]*task{},
		stop:  make(chan struct{}),

		taskGone: make(chan struct{}, 1),
		bgIdle:   make(chan struct{}, 1),
	}
	c.statSN = 1
	c.logoutAsked = -1
	c.kind = est.Kind
	c.dm = est.Open(c.stamp)
	return c
}

func (c *conn) run() {
	// RFC 7143 §6: a login that does not complete in time is dropped.
	timer := time.AfterFunc(c.srv.opts.LoginTimeout, func() {
		if !c.ffp.Load() {
			c.mu.Lock() // the login may be naming the logger (firstLogin)
			log := c.log
			c.mu.Unlock()
			// Anyone who reaches the portal can cause this: the first
			// few are logged, then one in 1024 (with the count).
			if n := c.srv.loginTimeouts.Add(1); logsample.Keep(n) {
				log.Warn("dropping connection: login not complete", "timeout", c.srv.opts.LoginTimeout, "dropped", n)
			}
			c.terminate()
		}
	})
	defer timer.Stop()
	c.dm.Serve(c)
}

// stamp fills StatSN, ExpCmdSN and MaxCmdSN (datamover.Stamper).
func (c *conn) stamp(h *pdu.BHS, advance bool) {
	put := func(off int, v uint32) {
		h[off], h[off+1], h[off+2], h[off+3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
	}
	put(24, c.statSN)
	if advance {
		c.statSN++
	}
	if ss := c.sess; ss != nil {
		put(28, ss.expCmdSN.Load())
		put(32, ss.maxCmdSN.Load())
	} else {
		put(28, c.login.cmdSN)
		put(32, c.login.cmdSN)
	}
}

// terminate drops the connection (its Serve loop then cleans up).
func (c *conn) terminate() { c.dm.ConnectionTerminate() }

// answerFailed ends the connection whose datamover could not deliver a
// command's answer (Put_Data or Send_Control failed), as a failed Get_Data
// does: the initiator would otherwise wait for the answer until its own
// timeout while the target went on as if it had been sent. A peer's
// violation (a datamover.ProtocolError: an iSER READ that advertised no
// Read STag) is a warning; a transport that failed is logged where the
// connection ends, with its cause, so here it is only debug detail.
func (c *conn) answerFailed(itt uint32, err error) {
	var pe *datamover.ProtocolError
	if errors.As(err, &pe) {
		c.log.Warn("answer not delivered: the connection ends", "itt", fmt.Sprintf("%#x", itt), "err", err)
	} else {
		c.log.Debug("answer not delivered: the connection ends", "itt", fmt.Sprintf("%#x", itt), "err", err)
	}
	c.terminate()
}

// ConnectionTerminateNotify implements datamover.Upcalls (draft-ietf-ips-iwarp-da §10.2):
// tasks of the connection are aborted and, at ERL 0, a connection lost
// without Logout takes its session down (RFC 7143 §7.1.4, §6.3.5).
func (c *conn) ConnectionTerminateNotify(err error) {
	c.stopOnce.Do(func() { close(c.stop) })
	c.slot.release()
	c.mu.Lock()
	c.closed = true
	loggedOut := c.loggedOut
	var waiting []*task
	for _, t := range c.tasks {
		t.aborted = true
		if !t.executing || t.parked {
			waiting = append(waiting, t)
		}
	}
	for _, t := range c.parked {
		t.parked = false
	}
	c.parked = nil
	c.mu.Unlock()
	for _, t := range waiting {
		c.release(t, false)
	}
	c.inflight.Wait()
	var le *loginError
	switch {
	case err != nil && c.sess != nil && c.sess.discovery && errors.Is(err, syscall.ECONNRESET):
		// open-iscsi ends discovery sessions with a reset, no Logout
		// (shared/captures/iscsi-tcp.pcap frame 15): nothing to warn of.
		c.log.Debug("discovery connection reset by the initiator")
	case err != nil && !errors.Is(err, net.ErrClosed) && !errors.As(err, &le):
		c.log.Warn("connection ended", "err", err)
	default:
		c.log.Debug("connection ended")
	}
	if ss := c.sess; ss != nil {
		ss.removeConn(c)
		if !loggedOut && ss.params.ErrorRecoveryLevel == 0 {
			ss.close("connection lost at ErrorRecoveryLevel 0")
		}
	}
}

// DataCompletionNotify implements datamover.Upcalls (draft-ietf-ips-iwarp-da §10.3): an
// RDMA datamover has placed all the data one Get_Data solicited, so that
// burst is complete. The TCP datamover never calls it (its Data-Out PDUs
// are accounted in ControlNotify).
func (c *conn) DataCompletionNotify(itt, ttt uint32) {
	c.mu.Lock()
	t := c.byTTT[ttt]
	if t == nil || t.itt != itt || t.aborted || t.released {
		c.mu.Unlock()
		return
	}
	for i := range t.bursts {
		b := &t.bursts[i]
		if b.live && b.ttt == ttt {
			t.received += b.length - b.got
			b.got, b.next, b.live = b.length, b.offset+b.length, false
			delete(c.byTTT, ttt)
			break
		}
	}
	act := t.advanceLocked()
	c.mu.Unlock()
	t.run(act)
}

// onRDMA reports whether the connection runs iSER now (connection first,
// or switched after an RFC 5046 login).
func (c *conn) onRDMA() bool {
	return c.kind == datamover.KindISER || datamover.PlacesByRDMA(c.dm)
}

// pending reports whether the datamover has received bytes of a PDU not
// yet delivered (the TCP datamover's read-ahead; fabric.Upgrade forwards
// it).
func (c *conn) pending() bool { return datamover.HasPending(c.dm) }

// DataACKNotify implements datamover.Upcalls; unused at ERL 0.
func (c *conn) DataACKNotify(itt, dataSN uint32) {}

func reject(reason pdu.RejectReason, format string, args ...any) error {
	return &datamover.ProtocolError{Reject: true, Reason: reason, Err: fmt.Errorf(format, args...)}
}

func asReject(err error) error {
	var pe *pdu.Error
	if errors.As(err, &pe) {
		return &datamover.ProtocolError{Reject: true, Reason: pe.Reason, Err: err}
	}
	return err
}

// DataBuffer implements datamover.Upcalls: immediate data and Data-Out
// land directly in their task's I/O buffer.
func (c *conn) DataBuffer(h *pdu.BHS) ([]byte, error) {
	b, err := c.dataBuffer(h)
	if err != nil {
		c.noteRejected(h, err)
	}
	return b, err
}

func (c *conn) dataBuffer(h *pdu.BHS) ([]byte, error) {
	if !c.ffp.Load() {
		return nil, nil
	}
	switch h.Opcode() {
	case pdu.OpSCSICommand:
		t, err := c.newTask(h)
		if err != nil {
			return nil, err
		}
		c.pendingTask = t
		if t.buf == nil {
			return nil, nil // TASK SET FULL: the immediate data is discarded
		}
		n := h.DataSegmentLength()
		return t.buf[:n], nil
	case pdu.OpDataOut:
		pl, err := c.placeDataOut(h)
		if err != nil {
			return nil, err
		}
		c.pendingDO = pl
		if pl.t == nil {
			return nil, nil // discard into scratch
		}
		return pl.t.buf[pl.off : pl.off+pl.n], nil
	}
	return nil, nil
}

// ControlNotify implements datamover.Upcalls (draft-ietf-ips-iwarp-da §10.1).
func (c *conn) ControlNotify(p *datamover.PDU) error {
	err := c.controlNotify(p)
	if err != nil {
		c.noteRejected(&p.BHS, err)
	}
	return err
}

// toWorker hands a task whose data is complete to its LU's workers, or
// parks it while the connection's commands occupy maxWorking of them (on
// TCP, LUs whose commands may block: for the others task.run stops at
// maxWorking; on iSER, every LU, since nothing runs on its receiver) or
// its address's ones their share. A peer that stops taking its answers —
// stops reading its socket, or on iSER posts no receive buffers, so that
// every Send of ours waits on RNR NAKs, retried for ever — so holds
// maxWorking workers per connection and MaxWorkingPerSource per address,
// never the LU's other initiators' share; its further commands wait in
// parked, bounded by the command window. A worker waits only for the
// datamover's sending side (send slots, send completions: iSER's dispatch
// goroutine), never for a PDU the receiver delivers: commands go to
// workers with their data in.
func (c *conn) toWorker(t *task) {
	c.mu.Lock()
	// An ended connection parks nothing: its tasks are aborted, and
	// its end released the parked ones already.
	if c.closed || len(c.parked) == 0 && c.working.Load() < maxWorking && !c.src.over() {
		c.working.Add(1)
		c.mu.Unlock()
		c.startWorker(t)
		return
	}
	t.parked = true
	c.parked = append(c.parked, t)
	c.mu.Unlock()
	if c.src.over() && c.startSourceWaiter() {
		c.srv.sourceWaits.Add(1)
		if n := c.src.waits.Add(1); logsample.Keep(n) {
			c.log.Warn("the address's commands hold its share of the LU workers and answers: its connections' commands wait",
				"source", c.src.addr, "working", c.src.working.Load(), "limit", c.src.limit, "count", n)
		}
	}
}

// startSourceWaiter starts waitSource unless it runs; it reports whether
// it started it.
func (c *conn) startSourceWaiter() bool {
	c.mu.Lock()
	start := !c.srcWaiter && !c.closed
	c.srcWaiter = c.srcWaiter || start
	c.mu.Unlock()
	if start {
		go c.waitSource()
	}
	return start
}

// startWorker dispatches t, already counted in working.
func (c *conn) startWorker(t *task) {
	t.worker = true
	c.src.add()
	c.srv.dispatch(t)
}

// unpark hands parked tasks to workers, in order, while the connection
// and its address are within their bounds. It reports whether tasks stay
// parked for the address's share alone (waitSource waits for it).
func (c *conn) unpark() (forSource bool) {
	for {
		c.mu.Lock()
		if len(c.parked) == 0 || c.working.Load() >= maxWorking {
			c.mu.Unlock()
			return false
		}
		if c.src.over() {
			c.mu.Unlock()
			return true
		}
		t := c.parked[0]
		c.parked[0] = nil
		c.parked = c.parked[1:]
		t.parked = false
		c.working.Add(1)
		c.mu.Unlock()
		c.startWorker(t)
	}
}

// waitSource waits for the address's commands on workers to fall within
// its share and unparks the connection's tasks; one per connection at a
// time (srcWaiter).
func (c *conn) waitSource() {
	for {
		c.src.wait(c.stop)
		select {
		case <-c.stop:
			// The connection's end releases what is parked.
			c.mu.Lock()
			c.srcWaiter = false
			c.mu.Unlock()
			return
		default:
		}
		if c.unpark() {
			continue
		}
		c.mu.Lock()
		// Parked for the source after the last look (toWorker saw a
		// waiter and started none): wait on.
		again := len(c.parked) > 0 && c.src.over()
		c.srcWaiter = again
		c.mu.Unlock()
		if !again {
			return
		}
	}
}

// unparkDropped takes t out of parked (an abort, or the connection's
// end); it reports whether t was there.
func (c *conn) unparkDropped(t *task) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !t.parked {
		return false
	}
	t.parked = false
	if i := slices.Index(c.parked, t); i >= 0 {
		c.parked = slices.Delete(c.parked, i, i+1)
	}
	return true
}

// workerDone counts a worker's command answered, and lets a parked task
// take its place.
func (c *conn) workerDone() {
	c.src.done()
	c.working.Add(-1)
	if c.unpark() {
		c.startSourceWaiter()
	}
}

// noteRejected logs why a PDU is answered with a Reject (RFC 7143
// §11.17): the first few of a connection at Warn, then one in 1024, so a
// hostile initiator cannot flood the log. Errors that drop the connection
// are logged when it ends.
func (c *conn) noteRejected(h *pdu.BHS, err error) {
	var pe *datamover.ProtocolError
	if !errors.As(err, &pe) || !pe.Reject {
		return
	}
	n := c.rejects.Add(1)
	if !logsample.Keep(n) {
		return
	}
	c.log.Warn("rejecting PDU", "op", h.Opcode(), "itt", fmt.Sprintf("%#x", h.ITT()),
		"reason", fmt.Sprintf("%#02x", byte(pe.Reason)), "err", pe.Err, "rejects", n)
}

func (c *conn) controlNotify(p *datamover.PDU) error {
	if !c.heard.Load() {
		c.heard.Store(true)
	}
	if !c.ffp.Load() {
		if err := c.handleLogin(p); err != nil {
			return err
		}
		return nil
	}
	op := p.BHS.Opcode()
	if c.sess.discovery {
		switch op {
		case pdu.OpTextReq, pdu.OpLogoutReq:
			c.asked.Store(true)
		case pdu.OpNopOut:
		default:
			return reject(pdu.RejectProtocolError, "iscsi: %s in a discovery session (RFC 7143 §4.3)", op)
		}
	}
	switch op {
	case pdu.OpSCSICommand:
		return c.handleCommand(p)
	case pdu.OpDataOut:
		return c.handleDataOut(p)
	case pdu.OpNopOut:
		return c.handleNopOut(p)
	case pdu.OpTaskMgmtReq:
		return c.handleTMF(p)
	case pdu.OpTextReq:
		return c.handleText(p)
	case pdu.OpLogoutReq:
		return c.handleLogout(p)
	case pdu.OpSNACKReq:
		// RFC 7143 §11.16: at ErrorRecoveryLevel 0 SNACK is not supported.
		return reject(pdu.RejectProtocolError, "iscsi: SNACK at ErrorRecoveryLevel 0 (RFC 7143 §11.16)")
	case pdu.OpLoginReq:
		return reject(pdu.RejectProtocolError, "iscsi: Login Request in full feature phase (RFC 7143 §6.3)")
	}
	if !op.Known() {
		return reject(pdu.RejectCommandNotSupported, "iscsi: unknown opcode %#02x (RFC 7143 §11.17.1)", byte(op))
	}
	return reject(pdu.RejectProtocolError, "iscsi: %s is a target opcode (RFC 7143 §11.2.1.2)", op)
}

// sendPDU encodes and sends a control PDU.
func (c *conn) send(h *pdu.BHS, data []byte, advance bool) error {
	p := datamover.PDU{BHS: *h, Data: data}
	return c.dm.SendControl(&p, advance)
}
