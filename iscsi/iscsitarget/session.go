package iscsitarget

import (
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/internal/logsample"
	"github.com/blockwire/blockwire/internal/serial"
	"github.com/blockwire/blockwire/scsitarget"
)

// sessionParams are the session-wide (leading-only) negotiated values.
type sessionParams struct {
	InitialR2T          bool
	ImmediateData       bool
	FirstBurstLength    uint32
	MaxBurstLength      uint32
	MaxOutstandingR2T   int
	DataPDUInOrder      bool
	DataSequenceInOrder bool
	ErrorRecoveryLevel  int
	MaxConnections      int
	DefaultTime2Wait    uint16
	DefaultTime2Retain  uint16
}

// deliverer is something that waits for its CmdSN turn. enter runs under
// session.mu, in CmdSN order: the command takes its place (a SCSI task
// enters the task set) and nothing is sent. act runs after session.mu is
// released — R2Ts, answers, execution: datamover I/O, which may block on
// a peer that stops reading and must not hold up the session's other
// connections. drop discards a command the window refused (outside
// session.mu).
type deliverer interface {
	enter()
	act()
	drop()
}

// session is one iSCSI session (RFC 7143 §4.4): an I_T nexus with one or
// more connections and one command window.
type session struct {
	srv        *Server
	tsih       uint16
	isid       [6]byte
	initiator  string
	alias      string
	targetName string
	tgt        *Target
	discovery  bool
	// source is the address its leading connection came from
	// (Options.MaxSessionsPerSource).
	source string
	nexus  *scsitarget.Nexus
	params sessionParams
	// ended is closed once the session's last connection is gone and its
	// I_T nexus with it (removeConn): a reinstatement waits for it.
	ended chan struct{}

	expCmdSN atomic.Uint32
	maxCmdSN atomic.Uint32
	// io is the session's share of the I/O buffer budget.
	io *blockcore.IOShare

	// Lock order: session.mu, then conn.mu (enter takes its
	// connection's lock under mu), then the SCSI core's (Device.Begin);
	// never the reverse. Server.mu is never held with either. No
	// datamover call — no socket or RDMA I/O — is made under session.mu
	// or conn.mu: sequence runs the deliveries' I/O (act) after releasing
	// mu, and a send that moves under 64 KiB in the NOP timeout fails
	// (fabric: AcceptParams.SendTimeout), so a blocked send holds no lock
	// and ends.
	mu     sync.Mutex
	window uint32
	// busy counts SCSI tasks delivered (or accepted as immediate) whose
	// response has not been sent: MaxCmdSN leaves room for window − busy
	// more commands, so what the target holds never exceeds the window
	// (RFC 7143 §4.2.2.1 lets the target open the window as it likes;
	// it never closes it: MaxCmdSN does not decrease).
	busy    uint32
	pending map[uint32]deliverer
	outside int          // commands ignored for a CmdSN outside the window
	full    atomic.Int64 // commands answered TASK SET FULL (noteFull)
	conns   map[uint16]*conn
	closed  bool
}

// info describes the session in the fabric-neutral shape of the SCSI core:
// its ID is the TSIH, its port the ISID, its fabric "iser" when its
// connections carry iSER.
func (ss *session) info() scsitarget.SessionInfo {
	ss.mu.Lock()
	si := scsitarget.SessionInfo{Fabric: "iscsi", ID: strconv.Itoa(int(ss.tsih)), Initiator: ss.initiator,
		Port: fmt.Sprintf("%x", ss.isid), Target: ss.targetName, Discovery: ss.discovery}
	if ss.nexus != nil {
		si.Stats = ss.nexus.Stats()
	}
	p := ss.params
	conns := make([]*conn, 0, len(ss.conns))
	for _, c := range ss.conns {
		conns = append(conns, c)
	}
	ss.mu.Unlock() // connection locks are not taken under the session's
	yn := func(b bool) string {
		if b {
			return "Yes"
		}
		return "No"
	}
	si.Params = map[string]string{
		"InitialR2T": yn(p.InitialR2T), "ImmediateData": yn(p.ImmediateData),
		"FirstBurstLength": strconv.Itoa(int(p.FirstBurstLength)), "MaxBurstLength": strconv.Itoa(int(p.MaxBurstLength)),
		"MaxOutstandingR2T": strconv.Itoa(p.MaxOutstandingR2T), "ErrorRecoveryLevel": strconv.Itoa(p.ErrorRecoveryLevel),
		"MaxConnections": strconv.Itoa(p.MaxConnections), "DataPDUInOrder": yn(p.DataPDUInOrder),
		"DataSequenceInOrder": yn(p.DataSequenceInOrder),
	}
	for _, c := range conns {
		c.mu.Lock()
		n := len(c.tasks)
		c.mu.Unlock()
		tr := "tcp"
		if c.onRDMA() {
			tr = "iser"
		}
		if tr == "iser" {
			si.Fabric = "iser"
		}
		si.Conns = append(si.Conns, scsitarget.ConnInfo{ID: strconv.Itoa(int(c.cid)), Remote: c.dm.RemoteAddr(), Transport: tr, InFlight: n})
	}
	sort.Slice(si.Conns, func(i, j int) bool {
		a, _ := strconv.Atoi(si.Conns[i].ID)
		b, _ := strconv.Atoi(si.Conns[j].ID)
		return a < b
	})
	return si
}

// openWindowLocked raises MaxCmdSN to ExpCmdSN + window − busy − 1 when
// that is higher (it never lowers it: the initiator keeps the highest it
// was told). Called with mu held.
func (ss *session) openWindowLocked() {
	exp := ss.expCmdSN.Load()
	free := ss.window - min(ss.busy, ss.window)
	want := exp + free - 1 // exp-1 when nothing is free: a closed window
	if serial.LessThan(ss.maxCmdSN.Load(), want) {
		ss.maxCmdSN.Store(want)
	}
}

// noteFull logs a command answered TASK SET FULL for want of I/O buffer
// budget: the first few, then one in 1024.
func (ss *session) noteFull(edtl uint32) {
	n := ss.full.Add(1)
	if !logsample.KeepFirst(n, 8) {
		return
	}
	ss.srv.log.Warn("TASK SET FULL: the session holds its share of the I/O buffer budget (or the target all of it)",
		"tsih", ss.tsih, "initiator", ss.initiator, "held", ss.io.Held(), "session_io_budget", ss.srv.opts.Budget.ShareLimit(),
		"used", ss.srv.opts.Budget.Used(), "io_budget", ss.srv.opts.Budget.Total(), "edtl", edtl, "count", n)
}

// startWindow sets the window at login: ExpCmdSN is the login's CmdSN.
func (ss *session) startWindow(exp uint32) {
	ss.expCmdSN.Store(exp)
	ss.maxCmdSN.Store(exp + ss.window - 1)
}

// admitImmediate counts an immediate SCSI command against the window
// (busy); false when the window is full: the command gets a Reject,
// "immediate command reject" (RFC 7143 §11.17.1, reason 0x06).
func (ss *session) admitImmediate() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.busy+uint32(len(ss.pending)) >= ss.window {
		return false
	}
	ss.busy++
	return true
}

// taskDone frees the window slot of a finished task, before its response
// is sent, so that the response carries the opened window.
func (ss *session) taskDone() {
	ss.mu.Lock()
	ss.busy--
	ss.openWindowLocked()
	ss.mu.Unlock()
}

// sequence admits a command-carrying PDU in CmdSN order (RFC 7143
// §4.2.2.1). Immediate PDUs are delivered at once and do not advance
// ExpCmdSN. A non-immediate PDU outside [ExpCmdSN, MaxCmdSN], or a
// duplicate, is silently ignored as the RFC requires: sequence calls its
// drop and returns false. Deliveries happen under the session lock so that
// commands arriving on different connections enter the task set in CmdSN
// order.
func (ss *session) sequence(cmdSN uint32, immediate bool, d deliverer) bool {
	ss.mu.Lock()
	if immediate {
		d.enter()
		ss.mu.Unlock()
		d.act()
		return true
	}
	exp := ss.expCmdSN.Load()
	if mx := ss.maxCmdSN.Load(); !serial.InWindow(cmdSN, exp, mx) {
		if ss.outside++; logsample.Keep(ss.outside) {
			ss.srv.log.Warn("ignoring a command outside the CmdSN window (RFC 7143 §4.2.2.1)",
				"tsih", ss.tsih, "initiator", ss.initiator, "cmdsn", cmdSN, "exp_cmdsn", exp, "max_cmdsn", mx, "ignored", ss.outside)
		}
		ss.mu.Unlock()
		d.drop()
		return false
	}
	if cmdSN != exp {
		if _, dup := ss.pending[cmdSN]; dup {
			ss.mu.Unlock()
			d.drop()
			return false
		}
		if ss.pending == nil {
			ss.pending = map[uint32]deliverer{}
		}
		ss.pending[cmdSN] = d
		ss.mu.Unlock()
		return true
	}
	// Advance the window before delivering, so that every response the
	// delivered commands produce already carries the new ExpCmdSN and
	// MaxCmdSN (an initiator computing "too high" from a stale MaxCmdSN
	// would otherwise fill a gap the target has already closed).
	end := exp + 1
	for len(ss.pending) > 0 {
		if _, ok := ss.pending[end]; !ok {
			break
		}
		end++
	}
	// The SCSI tasks about to be delivered take their window slots
	// first, so the window opens exactly as far as it may before any
	// response goes out; task.enter marks the slot as the task's, or
	// gives it back when the task ended meanwhile.
	take := func(x deliverer) {
		if _, ok := x.(*task); ok {
			ss.busy++
		}
	}
	take(d)
	for sn := exp + 1; sn != end; sn++ {
		take(ss.pending[sn])
	}
	ss.expCmdSN.Store(end)
	ss.openWindowLocked()
	d.enter()
	var later []deliverer // commands that waited for this one (MC/S, rare)
	for sn := exp + 1; sn != end; sn++ {
		next := ss.pending[sn]
		delete(ss.pending, sn)
		next.enter()
		later = append(later, next)
	}
	ss.mu.Unlock()
	d.act()
	for _, x := range later {
		x.act()
	}
	return true
}

// connList returns the session's connections.
func (ss *session) connList() []*conn {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := make([]*conn, 0, len(ss.conns))
	for _, c := range ss.conns {
		out = append(out, c)
	}
	return out
}

// removeConn detaches c; when it was the last connection the session ends
// (ERL 0 keeps no state past its connections, RFC 7143 §7.1.4).
func (ss *session) removeConn(c *conn) {
	ss.mu.Lock()
	if ss.conns[c.cid] == c {
		delete(ss.conns, c.cid)
	}
	// The session ends once, with its last connection (a connection
	// removed again finds it closed).
	last := len(ss.conns) == 0 && !ss.closed
	var dropped []deliverer
	if last {
		ss.closed = true
		for sn, d := range ss.pending {
			delete(ss.pending, sn)
			dropped = append(dropped, d)
		}
	}
	ss.mu.Unlock()
	for _, d := range dropped {
		d.drop()
	}
	if last {
		// The nexus goes before the session leaves the server's list: a
		// login that no longer finds the session (to reinstate it, or to
		// wait for it, awaitLost) finds its nexus gone too.
		if ss.nexus != nil {
			ss.tgt.Device.RemoveNexus(ss.nexus)
		}
		ss.srv.mu.Lock()
		if ss.srv.sessions[ss.tsih] == ss {
			delete(ss.srv.sessions, ss.tsih)
		}
		ss.srv.mu.Unlock()
		ss.io.Close()
		close(ss.ended)
		ss.srv.log.Info("session closed", "tsih", ss.tsih, "initiator", ss.initiator, "target", ss.targetName)
	}
}

// close terminates every connection of the session (session
// reinstatement, ERL 0 session recovery, target cold reset).
func (ss *session) close(why string) {
	for _, c := range ss.connList() {
		ss.srv.log.Info("closing connection", "tsih", ss.tsih, "cid", c.cid, "reason", why)
		c.terminate()
	}
}
