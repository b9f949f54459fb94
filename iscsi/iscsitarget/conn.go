package iscsitarget

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/internal/logsample"
	"github.com/blockwire/blockwire/internal/serial"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/iscsi/text"
	"github.com/blockwire/blockwire/scsi"
	"github.com/blockwire/blockwire/scsitarget"
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
	kind datamover.Kind
	rejects        atomic.Int64 // Rejects sent (noteRejected)
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
	mem *scsitarget.IOShare
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

// NOP ------------------------------------------------------------------

type nopDelivery struct {
	c    *conn
	nop  pdu.NopOut
	data []byte
}

func (d *nopDelivery) enter() {}
func (d *nopDelivery) act() {
	if d.nop.ITT == pdu.ReservedITT {
		return
	}
	in := pdu.NopIn{LUN: d.nop.LUN, ITT: d.nop.ITT, TTT: pdu.ReservedTTT}
	var h pdu.BHS
	in.Encode(&h)
	if err := d.c.send(&h, d.data, true); err != nil {
		d.c.answerFailed(d.nop.ITT, err)
	}
}
func (d *nopDelivery) drop() {}

func (c *conn) handleNopOut(p *datamover.PDU) error {
	var n pdu.NopOut
	if err := n.Decode(&p.BHS); err != nil {
		return asReject(err)
	}
	if n.ITT == pdu.ReservedITT {
		// The answer to our ping (RFC 7143 §11.18.3).
		if n.TTT == c.pingTTT.Load() {
			c.pingOut.Store(false)
		}
		return nil
	}
	data := p.Data
	if mx := c.dm.MaxSendDataSegmentLength(); len(data) > mx {
		data = data[:mx]
	}
	d := &nopDelivery{c: c, nop: n, data: append([]byte(nil), data...)}
	c.sess.sequence(n.CmdSN, n.Immediate, d)
	return nil
}

// pinger sends NOP-In pings on idle connections and drops connections that
// stop answering (RFC 7143 §11.19: target-initiated NOP-In with a TTT).
func (c *conn) pinger() {
	iv := c.srv.opts.NopInterval
	// A discovery session holds one of a few places: one that asks
	// nothing for DiscoveryIdle ends, pinged or not.
	disc := c.sess != nil && c.sess.discovery
	// WRITEs whose data stops coming end (Options.DataTimeout).
	dt := c.srv.opts.DataTimeout
	checkData := dt > 0 && !disc
	if iv < 0 && !disc && !checkData {
		return
	}
	every := dt / 4
	switch {
	case iv >= 0:
		every = min(iv, c.srv.opts.NopTimeout) / 2
	case disc:
		every = c.srv.opts.DiscoveryIdle / 4
	}
	if checkData {
		every = min(every, dt/4)
	}
	// A WRITE that owes data and got none for stallTicks ticks has been
	// without it for DataTimeout at least.
	stallTicks := int((dt+every-1)/every) + 1
	tick := time.NewTicker(every)
	defer tick.Stop()
	// Linux's ib_iser gives a discovery session one receive buffer, posted
	// only when it sends a request (its login buffer, reused): a NOP-In
	// there meets Receiver Not Ready until the RC retries run out, and
	// the connection dies with a transport error. So an iSER discovery
	// session is never pinged; one silent for the ping's interval and
	// timeout together is over, and ends quietly.
	quiet := c.sess != nil && c.sess.discovery && c.onRDMA()
	ttt := uint32(0)
	// last is when a PDU was last heard, to within a tick (the tick that
	// found heard set); sent is when the ping awaiting its answer went.
	last, sent := time.Now(), time.Time{}
	lastAsked := last
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
		}
		now := time.Now()
		if c.heard.Swap(false) {
			last = now
		}
		if checkData && !c.checkData(stallTicks) {
			return
		}
		if iv < 0 && !disc {
			continue
		}
		if disc {
			if c.asked.Swap(false) {
				lastAsked = now
			}
			if now.Sub(lastAsked) > c.srv.opts.DiscoveryIdle {
				c.srv.discoveryIdle.Add(1)
				c.log.Info("ending a discovery session that asked for nothing", "idle", c.srv.opts.DiscoveryIdle)
				c.terminate()
				return
			}
			if iv < 0 {
				continue
			}
		}
		if quiet {
			if now.Sub(last) > iv+c.srv.opts.NopTimeout {
				c.log.Info("ending an idle iSER discovery session (it is not pinged: the initiator may have no receive posted)", "idle", iv+c.srv.opts.NopTimeout)
				c.terminate()
				return
			}
			continue
		}
		if c.pingOut.Load() {
			if now.Sub(sent) > c.srv.opts.NopTimeout {
				c.log.Warn("dropping connection: NOP-In ping unanswered", "timeout", c.srv.opts.NopTimeout)
				c.terminate()
				return
			}
			continue
		}
		if now.Sub(last) < iv {
			continue
		}
		ttt++
		if ttt == pdu.ReservedTTT {
			ttt = 1
		}
		c.pingTTT.Store(ttt)
		sent = now
		c.pingOut.Store(true)
		in := pdu.NopIn{ITT: pdu.ReservedITT, TTT: ttt}
		var h pdu.BHS
		in.Encode(&h)
		if err := c.send(&h, nil, false); err != nil {
			return
		}
	}
}

// checkData ends the tasks that owe Data-Out — an R2T outstanding, or
// unsolicited data announced (F=0) — and got none for stallTicks of the
// pinger's ticks: each is answered CHECK CONDITION, ABORTED COMMAND /
// INITIATOR RESPONSE TIMEOUT (SPC-4), and its buffer and I/O budget are
// freed, so a peer that answers pings but never sends the data it owes
// does not hold them for as long as it stays logged in. Data-Out that
// comes later for it is discarded, as after an abort. The second such
// end on one connection ends the connection (RFC 7143 §7.1.4: at ERL 0
// the session then recovers). False when the connection ends.
func (c *conn) checkData(stallTicks int) bool {
	type ended struct {
		t         *task
		itt       uint32
		expDataSN uint32
		edtl      uint32
		received  uint32
	}
	var late []ended
	c.mu.Lock()
	for _, t := range c.tasks {
		owed := t.unsolOpen
		for i := range t.bursts {
			owed = owed || t.bursts[i].live
		}
		if !owed || t.executing || t.aborted || t.released || t.full || t.received != t.seen {
			t.seen, t.stalled = t.received, 0
			continue
		}
		if t.stalled++; t.stalled >= stallTicks {
			t.aborted = true
			late = append(late, ended{t: t, itt: t.itt, expDataSN: t.dataSN + t.r2tSN, edtl: t.edtl, received: t.received})
		}
	}
	c.mu.Unlock()
	for _, e := range late {
		c.srv.dataTimeouts.Add(1)
		c.dataTimeouts++
		c.log.Warn("ending a WRITE whose data stopped coming", "itt", fmt.Sprintf("%#x", e.itt), "received", e.received,
			"edtl", e.edtl, "timeout", c.srv.opts.DataTimeout)
		c.release(e.t, false)
		sense := (&scsi.Sense{Key: scsi.SenseAbortedCommand, ASC: 0x4b, ASCQ: 0x06}).AppendFixed(make([]byte, 2, 2+scsi.FixedLen))
		binary.BigEndian.PutUint16(sense, uint16(len(sense)-2))
		r := pdu.SCSIResponse{ITT: e.itt, Response: pdu.RespCompleted, Status: scsi.StatusCheckCondition, ExpDataSN: e.expDataSN}
		var h pdu.BHS
		r.Encode(&h)
		if err := c.send(&h, sense, true); err != nil {
			return false
		}
	}
	if len(late) > 0 && c.dataTimeouts > 1 {
		c.log.Warn("dropping connection: the data of its WRITEs stopped coming again", "timeout", c.srv.opts.DataTimeout)
		c.terminate()
		return false
	}
	return true
}

// requestLogout sends an Async Message asking the initiator to log out
// within wait seconds (RFC 7143 §11.9.1, event 1).
func (c *conn) requestLogout(wait int) {
	c.mu.Lock()
	if !c.ffp.Load() {
		// Still logging in: finishLogin asks once the final response is
		// out; a login that never finishes times out.
		c.logoutAsked = wait
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	if c.sess.discovery {
		c.terminate()
		return
	}
	m := pdu.AsyncMsg{Event: pdu.AsyncLogoutRequest, Parameter3: uint16(wait)}
	var h pdu.BHS
	m.Encode(&h)
	if err := c.send(&h, nil, true); err != nil {
		c.terminate()
	}
}

// drainAndClose gives the connection's commands up to drainWait to
// complete and answer, then drops the connection; commands still waiting
// for data-out then end unanswered, executing ones still run to the end
// (ConnectionTerminateNotify waits for them).
func (c *conn) drainAndClose() {
	go func() {
		done := make(chan struct{})
		go func() { c.inflight.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(drainWait):
		}
		c.terminate()
	}()
}

const drainWait = 5 * time.Second

// Text -----------------------------------------------------------------

type textDelivery struct {
	c   *conn
	req pdu.TextReq
	kvs []text.KV
}

func (d *textDelivery) drop() {}

// funcDelivery runs fn when its command's CmdSN comes up.
type funcDelivery struct{ fn func() }

func (d *funcDelivery) enter() {}
func (d *funcDelivery) act()   { d.fn() }
func (d *funcDelivery) drop()  {}

func (d *textDelivery) enter() {}
func (d *textDelivery) act() {
	c := d.c
	var out []byte
	for _, kv := range d.kvs {
		if kv.Key == "SendTargets" {
			out = c.sendTargets(out, kv.Value)
		}
	}
	var rest []text.KV
	for _, kv := range d.kvs {
		if kv.Key != "SendTargets" {
			rest = append(rest, kv)
		}
	}
	if len(rest) > 0 {
		// Full feature phase renegotiation (RFC 7143 §6.2): only keys
		// without the InitializeOnly restriction may change.
		neg := text.NewNegotiator(c.srv.localKeys(), false)
		ans, err := neg.Respond(rest, text.Context{Login: false})
		if err == nil {
			out = text.Append(out, ans...)
			if v, ok := neg.Peer("MaxRecvDataSegmentLength"); ok {
				if n, err := text.ParseNumber(v); err == nil {
					c.setMaxXmit(int(n))
				}
			}
		}
	}
	c.textOut = out
	c.sendTextChunk(d.req.ITT, d.req.LUN)
}

func (c *conn) setMaxXmit(n int) {
	c.dm.NoticeKeyValues(datamover.Params{MaxXmitDataSegmentLength: n})
}

// sendTextChunk sends the next part of a text response, continuing with C=1
// when it does not fit the initiator's MaxRecvDataSegmentLength (RFC 7143
// §11.11.2).
func (c *conn) sendTextChunk(itt uint32, lun [8]byte) {
	out := c.textOut
	mx := c.dm.MaxSendDataSegmentLength()
	r := pdu.TextResp{ITT: itt, LUN: lun, TTT: pdu.ReservedTTT, Final: true}
	if len(out) > mx {
		c.textTTT++
		if c.textTTT == pdu.ReservedTTT {
			c.textTTT = 1
		}
		r.Final, r.Continue, r.TTT = false, true, c.textTTT
		c.textOut = out[mx:]
		out = out[:mx]
	} else {
		c.textOut = nil
	}
	var h pdu.BHS
	r.Encode(&h)
	c.send(&h, out, true)
}

func (c *conn) handleText(p *datamover.PDU) error {
	var req pdu.TextReq
	if err := req.Decode(&p.BHS); err != nil {
		return asReject(err)
	}
	if req.TTT != pdu.ReservedTTT {
		// Continuation of a long response, or of the initiator's text.
		if req.TTT != c.textTTT || (c.textOut == nil && c.textIn == nil) {
			return reject(pdu.RejectInvalidPDUField, "iscsi: Text Request with unknown TTT %#x (RFC 7143 §11.10.4)", req.TTT)
		}
		if c.textOut != nil && len(p.Data) == 0 {
			// A request like any other: it takes its CmdSN (RFC 7143
			// §4.2.2.1), so it waits for its turn and moves ExpCmdSN.
			c.sess.sequence(req.CmdSN, req.Immediate, &funcDelivery{func() { c.sendTextChunk(req.ITT, req.LUN) }})
			return nil
		}
	} else {
		c.textOut = nil
	}
	if len(c.textIn)+len(p.Data) > text.MaxTextLen {
		c.textIn = nil
		return reject(pdu.RejectProtocolError, "iscsi: text request exceeds %d bytes", text.MaxTextLen)
	}
	c.textIn = append(c.textIn, p.Data...)
	if req.Continue || !req.Final {
		// More text follows: acknowledge with an empty response and a TTT
		// (RFC 7143 §11.10.2).
		c.textTTT++
		if c.textTTT == pdu.ReservedTTT {
			c.textTTT = 1
		}
		r := pdu.TextResp{ITT: req.ITT, LUN: req.LUN, TTT: c.textTTT}
		c.sess.sequence(req.CmdSN, req.Immediate, &funcDelivery{func() {
			var h pdu.BHS
			r.Encode(&h)
			c.send(&h, nil, true)
		}})
		return nil
	}
	kvs, err := text.Parse(c.textIn)
	c.textIn = nil
	if err != nil {
		return reject(pdu.RejectProtocolError, "%v", err)
	}
	c.sess.sequence(req.CmdSN, req.Immediate, &textDelivery{c: c, req: req, kvs: kvs})
	return nil
}

// sendTargets appends the SendTargets answer (RFC 7143 Appendix C).
func (c *conn) sendTargets(out []byte, which string) []byte {
	var list []*Target
	switch {
	case which == "All" && c.sess.discovery:
		list = c.srv.targetList()
	case which == "All" || which == "":
		if !c.sess.discovery {
			list = []*Target{c.sess.tgt}
		}
	default:
		if t := c.srv.target(which); t != nil {
			list = []*Target{t}
		}
	}
	local := c.dm.LocalAddr()
	for _, t := range list {
		if !t.allows(c.sess.initiator) || !t.admitsFrom(c.sess.initiator, c.dm.RemoteAddr()) || !t.onPortal(local) {
			continue
		}
		out = text.Append(out, text.KV{Key: "TargetName", Value: t.Name})
		for _, a := range c.srv.portalAddrs(local) {
			if t.onPortal(a) {
				out = text.Append(out, text.KV{Key: "TargetAddress", Value: a + "," + strconv.Itoa(int(t.TPGT))})
			}
		}
	}
	return out
}

// portalAddrs lists the portals, replacing wildcard listen addresses with
// the address the initiator reached.
func (s *Server) portalAddrs(local string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, p := range s.portals {
		host, port, err := net.SplitHostPort(p)
		if err != nil {
			continue
		}
		ip := net.ParseIP(host)
		if ip == nil || ip.IsUnspecified() {
			if lh, _, err := net.SplitHostPort(local); err == nil {
				host = lh
			}
		}
		// One address, once: an iSCSI/TCP portal and an iSER portal on an
		// RDMA device may share it.
		if a := net.JoinHostPort(host, port); !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// Logout ---------------------------------------------------------------

type logoutDelivery struct {
	c   *conn
	req pdu.LogoutReq
}

func (d *logoutDelivery) drop()  {}
func (d *logoutDelivery) enter() {}

// act runs the Logout on a goroutine of its own (it waits for the
// connections' tasks), or, at the connection's bound, answers "cleanup
// failed" (RFC 7143 §11.15.1).
func (d *logoutDelivery) act() {
	var no pdu.BHS
	(&pdu.LogoutResp{ITT: d.req.ITT, Response: pdu.LogoutRespCleanupFailed}).Encode(&no)
	d.c.goBounded("Logout", func() { d.c.logout(d.req) }, &no)
}

func (c *conn) handleLogout(p *datamover.PDU) error {
	var req pdu.LogoutReq
	if err := req.Decode(&p.BHS); err != nil {
		return asReject(err)
	}
	c.sess.sequence(req.CmdSN, req.Immediate, &logoutDelivery{c: c, req: req})
	return nil
}

// logout carries out a Logout Request (RFC 7143 §11.14): the response is
// sent after the affected connections' commands have completed.
func (c *conn) logout(req pdu.LogoutReq) {
	resp := pdu.LogoutResp{ITT: req.ITT, Time2Wait: c.conf.DefaultTime2Wait, Time2Retain: c.conf.DefaultTime2Retain}
	closeSelf := false
	switch req.Reason {
	case pdu.LogoutCloseSession:
		for _, o := range c.sess.connList() {
			o.inflight.Wait()
		}
		closeSelf = true
	case pdu.LogoutCloseConnection:
		if req.CID == c.cid {
			c.inflight.Wait()
			closeSelf = true
		} else {
			var other *conn
			for _, o := range c.sess.connList() {
				if o.cid == req.CID {
					other = o
				}
			}
			if other == nil {
				resp.Response = pdu.LogoutRespCIDNotFound
			} else {
				other.mu.Lock()
				other.loggedOut = true
				other.mu.Unlock()
				other.inflight.Wait()
				other.terminate()
			}
		}
	case pdu.LogoutRecovery:
		resp.Response = pdu.LogoutRespNoRecovery
	}
	if closeSelf {
		c.mu.Lock()
		c.loggedOut = req.Reason == pdu.LogoutCloseConnection
		c.mu.Unlock()
		if ss := c.sess; ss.nexus != nil && (req.Reason == pdu.LogoutCloseSession || len(ss.connList()) == 1) {
			// The I_T nexus ends with this response: what it held
			// (SPC-2 reservations, medium removal prevention) is
			// released first, so the initiator's next command through
			// another nexus already sees it free.
			ss.tgt.Device.ReleaseNexus(ss.nexus)
		}
	}
	var h pdu.BHS
	resp.Encode(&h)
	c.send(&h, nil, true)
	if closeSelf {
		c.log.Info("logout", "reason", req.Reason)
		if req.Reason == pdu.LogoutCloseSession {
			for _, o := range c.sess.connList() {
				if o != c {
					o.mu.Lock()
					o.loggedOut = true
					o.mu.Unlock()
					o.terminate()
				}
			}
		}
		c.terminate()
	}
}

// Task management --------------------------------------------------------

type tmfDelivery struct {
	c   *conn
	req pdu.TaskMgmtReq
}

func (d *tmfDelivery) drop()  {}
func (d *tmfDelivery) enter() {}

// act runs the function on a goroutine of its own (it waits for the
// affected tasks to end, and the receiver reads on meanwhile), or, at the
// connection's bound, answers "Function rejected" (RFC 7143 §11.6.1).
func (d *tmfDelivery) act() {
	var no pdu.BHS
	(&pdu.TaskMgmtResp{ITT: d.req.ITT, Response: pdu.TMFRespRejected}).Encode(&no)
	d.c.goBounded("task management function", func() { d.c.taskManagement(d.req) }, &no)
}

// goBounded runs fn, a task management function or a Logout, on a
// goroutine of its own, at most maxBackground of them at once on the
// connection; beyond that it sends refusal, the request's answer saying
// so, at once, from the goroutine that delivers the request (the
// receiver, mostly). So a peer that sends them faster than they end, or
// never reads their answers, makes the connection hold no more than the
// bound (TestBackgroundRequestFloodIsBounded); what it holds then is the
// receiver, in that send, as for a NOP-Out.
func (c *conn) goBounded(what string, fn func(), refusal *pdu.BHS) {
	if c.background.Add(1) > maxBackground {
		c.background.Add(-1)
		if n := c.refusedBG.Add(1); logsample.Keep(n) {
			c.log.Warn(what+" refused: too many running on the connection", "itt", fmt.Sprintf("%#x", refusal.ITT()),
				"running", maxBackground, "refused", n)
		}
		c.send(refusal, nil, true)
		return
	}
	go func() {
		defer func() {
			if c.background.Add(-1) == 0 && c.ending.Load() {
				select {
				case c.bgIdle <- struct{}{}:
				default:
				}
			}
		}()
		fn()
	}()
}

// awaitBackground returns once the task management functions and Logouts
// the connection started (goBounded) have ended. A connection is over —
// for Shutdown, and for the sessions that come after it — only when
// nothing it asked for still acts: a LOGICAL UNIT RESET it sent may wait
// for other sessions' I/O, and would otherwise go on after its connection
// ended, aborting commands of sessions logged in since
// (TestConnectionEndsAfterItsTaskManagement). Call it once the receiver
// has returned.
func (c *conn) awaitBackground() {
	c.ending.Store(true)
	if c.background.Load() > 0 {
		<-c.bgIdle
	}
}

// maxBackground bounds the task management functions and Logouts running
// at once on one connection. Linux's initiator sends one task management
// function at a time (its error handler holds the session's), and each
// ends when the tasks it affects have.
const maxBackground = 32

func (c *conn) handleTMF(p *datamover.PDU) error {
	var req pdu.TaskMgmtReq
	if err := req.Decode(&p.BHS); err != nil {
		return asReject(err)
	}
	c.sess.sequence(req.CmdSN, req.Immediate, &tmfDelivery{c: c, req: req})
	return nil
}

// taskManagement runs one task management function (RFC 7143 §11.5) and
// answers only after the affected tasks have really ended.
func (c *conn) taskManagement(req pdu.TaskMgmtReq) {
	ss := c.sess
	dev := ss.tgt.Device
	resp := pdu.TaskMgmtResp{ITT: req.ITT, Response: pdu.TMFRespComplete}
	lun, lunErr := scsi.DecodeLUN(req.LUN)
	mapRes := func(r scsitarget.TMFResult) byte {
		switch r {
		case scsitarget.TMFNoSuchTask:
			return pdu.TMFRespNoTask
		case scsitarget.TMFNoSuchLUN:
			return pdu.TMFRespNoLUN
		case scsitarget.TMFRejected:
			return pdu.TMFRespRejected
		}
		return pdu.TMFRespComplete
	}
	needLUN := func() bool {
		// The LUN as the initiator sees it, through its nexus's map.
		if lunErr != nil || dev.LUFor(ss.nexus, lun) == nil {
			resp.Response = pdu.TMFRespNoLUN
			return false
		}
		return true
	}
	cold := false
	switch req.Function {
	case pdu.TMFAbortTask:
		if !needLUN() {
			break
		}
		t := c.findTask(req.RTT)
		switch {
		case t != nil:
			resp.Response = mapRes(dev.AbortTask(ss.nexus, lun, uint64(req.RTT)))
			if resp.Response == pdu.TMFRespNoTask && c.abortLocal(t) {
				// It was still waiting for its CmdSN, outside the task set.
				resp.Response = pdu.TMFRespComplete
			}
		case serial.InWindow(req.RefCmdSN, ss.expCmdSN.Load(), ss.maxCmdSN.Load()):
			// RFC 7143 §11.5.1 (b): the referenced command has not arrived;
			// the target considers it received and reports completion.
			resp.Response = pdu.TMFRespComplete
		default:
			resp.Response = pdu.TMFRespNoTask
		}
	case pdu.TMFAbortTaskSet:
		if needLUN() {
			resp.Response = mapRes(dev.AbortTaskSet(ss.nexus, lun))
		}
	case pdu.TMFClearTaskSet:
		if needLUN() {
			resp.Response = mapRes(dev.ClearTaskSet(ss.nexus, lun))
		}
	case pdu.TMFLUReset:
		if needLUN() {
			resp.Response = mapRes(dev.ResetLU(ss.nexus, lun))
		}
	case pdu.TMFTargetWarmReset, pdu.TMFTargetColdReset:
		// Every LU and every initiator of the target: only an initiator
		// allowed it may (LIO refuses likewise unless its ACL says so),
		// by the target's rules as they are now, not at login.
		if t := c.srv.target(ss.targetName); t == nil || !t.AnyTargetReset && !slices.Contains(t.TargetResets, ss.initiator) {
			resp.Response = pdu.TMFRespAuthFailed
			break
		}
		dev.ResetTarget()
		cold = req.Function == pdu.TMFTargetColdReset
	case pdu.TMFClearACA:
		resp.Response = pdu.TMFRespNotSupported
	case pdu.TMFTaskReassign:
		// RFC 7143 §11.5.1: reassignment needs ErrorRecoveryLevel 2.
		resp.Response = pdu.TMFRespNoReassign
	default:
		resp.Response = pdu.TMFRespRejected
	}
	// The first few of a connection, then one in 1024: a peer sending
	// them in a loop does not flood the log.
	if n := c.tmfs.Add(1); logsample.Keep(n) {
		c.log.Info("task management", "function", req.Function, "lun", lun, "rtt", fmt.Sprintf("%#x", req.RTT),
			"response", resp.Response, "count", n)
	}
	var all []*session
	if cold {
		// RFC 7143 §11.5.1: after a target cold reset the target drops all
		// its connections. From the response on, no command is taken on
		// them: one the initiator sends before the drop reaches it would
		// run on the old nexus and be lost with it.
		c.srv.mu.Lock()
		for _, s2 := range c.srv.sessions {
			if s2.tgt == ss.tgt {
				all = append(all, s2)
			}
		}
		c.srv.mu.Unlock()
		for _, s2 := range all {
			for _, o := range s2.connList() {
				o.mu.Lock()
				o.draining = true
				o.mu.Unlock()
			}
		}
	}
	var h pdu.BHS
	resp.Encode(&h)
	c.send(&h, nil, true)
	for _, s2 := range all {
		s2.close("target cold reset")
	}
}
