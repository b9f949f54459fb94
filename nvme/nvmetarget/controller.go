package nvmetarget

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/nvme"
)

// Conn is what a controller needs of a queue's transport connection.
type Conn interface {
	// Post sends a completion the controller makes on its own (an
	// Asynchronous Event Request's, later than its command).
	Post(c nvme.Completion)
	// Close ends the connection (the controller is gone: keep alive
	// expired, its host revoked, its subsystem removed, dropped).
	Close()
}

// Controller is one dynamic controller: a host's association with a
// subsystem, made by the admin queue's Connect.
type Controller struct {
	s       *Subsystem
	id      uint16
	hostNQN string
	hostID  [16]byte
	// resvName is the host's name in the reservation state.
	resvName string
	remote   net.Addr
	src      string // its source, to the per-source bound
	log      *slog.Logger
	created  time.Time
	stats    blockcore.Stats // its I/O commands, as a SCSI nexus's

	// mu guards what follows (lock order: after Subsystem.mu).
	mu     sync.Mutex
	cc     uint32
	csts   uint32
	queues map[uint16]*Queue // 0: the admin queue
	// nqueues is the I/O queues granted (Set Features, Number of Queues).
	nqueues int
	aerCIDs []uint16 // outstanding Asynchronous Event Requests
	events  []uint32 // events waiting for a request (DW0s)
	changed []uint32 // the changed namespace list (log page 04h)
	// The reservation notification log (log page 80h): notices not read
	// yet, oldest first, and how many were ever logged; resvMask, by
	// namespace, the notices masked (Set Features 82h).
	resvLog   []resvEntry
	resvCount uint64
	resvMask  map[uint32]uint32
	aen       uint32 // Asynchronous Event Configuration
	kato      time.Duration
	kaTimer   *time.Timer
	destroyed bool
	// ready mirrors CSTS.RDY and not destroyed, for the I/O path to read
	// without the lock.
	ready atomic.Bool
}

// Queue is a submission and completion queue pair of a controller, on
// one transport connection.
type Queue struct {
	c    *Controller
	qid  uint16
	size int // entries
	conn Conn
	sqhd uint16 // the head: entries fetched, modulo size
	// auth is the queue's DH-HMAC-CHAP state (nil: its host has no
	// secret); set at Connect, before the queue runs a command.
	auth *queueAuth
}

// since is the time since the controller was made, on the monotonic
// clock: a command's latency is the difference of two (one clock read
// each, where time.Now reads the wall clock too).
func (c *Controller) since() time.Duration { return time.Since(c.created) }

// ControllerInfo describes a controller (admin ls, metrics).
type ControllerInfo struct {
	ID        uint16
	Subsystem string
	Host      string
	Remote    string
	Queues    int
	Since     time.Time
	// Stats counts the controller's I/O commands (its namespaces' units
	// count them too).
	Stats *blockcore.Stats
}

// Info describes the controller now.
func (c *Controller) Info() ControllerInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := ""
	if c.remote != nil {
		r = c.remote.String()
	}
	return ControllerInfo{ID: c.id, Subsystem: c.s.nqn, Host: c.hostNQN, Remote: r, Queues: len(c.queues), Since: c.created, Stats: &c.stats}
}

// Connect admits a queue (NVMe over Fabrics 1.1, Connect): on QID 0 a new
// controller of the subsystem k names, on an I/O queue the controller k
// names, of the same host. conn is the queue's transport connection. The
// completion is what the transport answers; q is nil when it refused.
func (t *Target) Connect(k nvme.Connect, remote net.Addr, conn Conn) (q *Queue, cqe nvme.Completion) {
	refuse := func(reason string, st nvme.Status, dw0 uint32) (*Queue, nvme.Completion) {
		t.refuse(reason)
		t.log.Info("NVMe Connect refused", "reason", reason, "subsystem", k.Data.SubNQN, "host", k.Data.HostNQN, "qid", k.QID, "remote", remote)
		return nil, nvme.Completion{Status: st, DW0: dw0}
	}
	// DW0 of an invalid-parameter refusal says which: IATTR bit 0 set for
	// the data, IPO the byte offset (NVMe over Fabrics, Connect Response).
	const inData = 1 << 16
	if k.RecFmt != 0 {
		return refuse("record format", nvme.StatusConnectIncompatible, 0)
	}
	var s *Subsystem
	if k.Data.SubNQN == DiscoveryNQN {
		s = t.disc
	} else {
		s = t.Subsystem(k.Data.SubNQN)
	}
	if s == nil {
		return refuse("no such subsystem", nvme.StatusConnectInvalidParam, inData|256<<16)
	}
	if !s.allows(k.Data.HostNQN, remote) {
		return refuse("host not allowed", nvme.StatusConnectInvalidHost, 0)
	}
	size := int(k.SQSize) + 1
	if k.QID == 0 {
		if size < 2 || size > AdminQueueSize {
			return refuse("admin queue size", nvme.StatusConnectInvalidParam, 42<<16)
		}
		if k.Data.CNTLID != 0xffff && k.Data.CNTLID != 0xfffe {
			// The dynamic controller model: the host asks for any.
			return refuse("static controller ID", nvme.StatusConnectInvalidParam, inData|16<<16)
		}
		c, why := t.newController(s, k, remote)
		if c == nil {
			return refuse(why, nvme.StatusConnectBusy, 0)
		}
		q := &Queue{c: c, qid: 0, size: size, conn: conn}
		authreq := q.startAuth()
		c.mu.Lock()
		c.queues[0] = q
		c.mu.Unlock()
		c.log.Info("NVMe controller created", "kato", c.kato, "authentication", authreq != 0)
		return q, nvme.Completion{DW0: uint32(c.id) | authreq}
	}
	if size < 2 || size > t.o.QueueSize {
		return refuse("I/O queue size", nvme.StatusConnectInvalidParam, 42<<16)
	}
	s.mu.Lock()
	c := s.ctrls[k.Data.CNTLID]
	s.mu.Unlock()
	if c == nil || c.hostNQN != k.Data.HostNQN || c.hostID != k.Data.HostID {
		return refuse("no such controller for the host", nvme.StatusConnectInvalidParam, inData|16<<16)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.destroyed || c.cc&nvme.CCEnable == 0 || c.csts&nvme.CSTSReady == 0:
		t.refuse("controller not ready")
		return nil, nvme.Completion{Status: nvme.StatusCommandSequence}
	case int(k.QID) > c.nqueues:
		t.refuse("queue ID beyond the queues granted")
		return nil, nvme.Completion{Status: nvme.StatusConnectInvalidParam, DW0: 40 << 16}
	case c.queues[k.QID] != nil:
		t.refuse("queue ID in use")
		return nil, nvme.Completion{Status: nvme.StatusCommandSequence}
	}
	q = &Queue{c: c, qid: k.QID, size: size, conn: conn}
	authreq := q.startAuth()
	c.queues[k.QID] = q
	return q, nvme.Completion{DW0: uint32(c.id) | authreq}
}

// newController makes a controller for an admin queue's Connect, if the
// target's bounds allow one more; else it says which refused it.
func (t *Target) newController(s *Subsystem, k nvme.Connect, remote net.Addr) (*Controller, string) {
	src := ""
	if remote != nil {
		src = t.o.Sources.Of(remote)
	}
	t.mu.Lock()
	if t.ctrls >= t.o.Controllers {
		t.mu.Unlock()
		return nil, "controller limit"
	}
	if t.ctrlsOf.Of(src) >= t.o.ControllersPerSource {
		t.mu.Unlock()
		return nil, "controller limit of the source"
	}
	t.ctrls++
	t.ctrlsOf.Add(src)
	t.mu.Unlock()
	c := &Controller{s: s, hostNQN: k.Data.HostNQN, hostID: k.Data.HostID, resvName: registrantName(k.Data.HostID), remote: remote, src: src, created: time.Now(),
		queues: map[uint16]*Queue{}, kato: time.Duration(k.KATO) * time.Millisecond}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		t.mu.Lock()
		t.ctrls--
		t.ctrlsOf.Give(src)
		t.mu.Unlock()
		return nil, "subsystem removed"
	}
	// Controller IDs 1 to 0xffef, the next free one.
	for {
		s.nextID = s.nextID%0xffef + 1
		if s.ctrls[s.nextID] == nil {
			break
		}
	}
	c.id = s.nextID
	s.ctrls[c.id] = c
	s.mu.Unlock()
	c.log = t.log.With("subsystem", s.nqn, "controller", c.id, "host", c.hostNQN, "remote", remote)
	if c.kato > 0 {
		c.kaTimer = time.AfterFunc(c.kato, c.expire)
	}
	return c, ""
}

// expire ends a controller whose host sent no Keep Alive in time.
func (c *Controller) expire() {
	c.log.Warn("NVMe keep alive timeout: controller ended", "kato", c.kato)
	c.destroy()
}

// keepAlive restarts the keep alive timer.
func (c *Controller) keepAlive() {
	c.mu.Lock()
	if c.kaTimer != nil && !c.destroyed {
		c.kaTimer.Reset(c.kato)
	}
	c.mu.Unlock()
}

// destroy ends the controller: every queue's connection is closed and
// the controller leaves its subsystem.
func (c *Controller) destroy() {
	c.mu.Lock()
	if c.destroyed {
		c.mu.Unlock()
		return
	}
	c.destroyed = true
	c.ready.Store(false)
	if c.kaTimer != nil {
		c.kaTimer.Stop()
	}
	conns := make([]Conn, 0, len(c.queues))
	for _, q := range c.queues {
		conns = append(conns, q.conn)
	}
	c.mu.Unlock()
	s := c.s
	s.mu.Lock()
	if s.ctrls[c.id] == c {
		delete(s.ctrls, c.id)
	}
	s.mu.Unlock()
	t := s.t
	t.mu.Lock()
	t.ctrls--
	t.ctrlsOf.Give(c.src)
	t.mu.Unlock()
	for _, conn := range conns {
		conn.Close()
	}
}

// Controller is the queue's controller.
func (q *Queue) Controller() *Controller { return q.c }

// ID is the queue's QID; Size its entries.
func (q *Queue) ID() uint16 { return q.qid }
func (q *Queue) Size() int  { return q.size }

// ID is the controller's CNTLID.
func (c *Controller) ID() uint16 { return c.id }

// Host is the controller's host NQN.
func (c *Controller) Host() string { return c.hostNQN }

// Disconnected is the transport's word that the queue's connection has
// ended: the admin queue's ends the controller, an I/O queue's frees
// its QID.
func (q *Queue) Disconnected() {
	if q.qid == 0 {
		q.c.destroy()
		return
	}
	q.c.mu.Lock()
	if q.c.queues[q.qid] == q {
		delete(q.c.queues, q.qid)
	}
	q.c.mu.Unlock()
}

// Fetched advances the submission queue head by one command and returns
// it, for the command's completion (SQHD).
func (q *Queue) Fetched() uint16 {
	q.sqhd++
	if int(q.sqhd) == q.size {
		q.sqhd = 0
	}
	return q.sqhd
}

// nsChanged records a namespace attribute change and raises its
// asynchronous event when the host enabled it.
func (c *Controller) nsChanged(nsid uint32) {
	if c.s.discovery || !c.s.visible(c.hostNQN, nsid) {
		return
	}
	c.mu.Lock()
	if len(c.changed) < 1024 && !containsU32(c.changed, nsid) {
		c.changed = append(c.changed, nsid)
	} else if len(c.changed) >= 1024 {
		c.changed = []uint32{0xffffffff} // more than the list holds
	}
	var post func()
	if c.aen&aenNamespace != 0 {
		// Notice (type 2), Namespace Attribute Changed (00h), log 04h.
		post = c.eventLocked(2 | 0x00<<8 | logChangedNS<<16)
	}
	c.mu.Unlock()
	if post != nil {
		post()
	}
}

func containsU32(s []uint32, v uint32) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// eventLocked queues an asynchronous event (its completion's DW0) and
// returns the function that completes a waiting request with it, if one
// waits (c.mu held; call the function without it).
func (c *Controller) eventLocked(dw0 uint32) func() {
	for _, e := range c.events {
		if e == dw0 {
			return nil // masked until the host reads its log page
		}
	}
	c.events = append(c.events, dw0)
	return c.deliverLocked()
}

// deliverLocked pairs a queued event with a waiting request.
func (c *Controller) deliverLocked() func() {
	if len(c.events) == 0 || len(c.aerCIDs) == 0 || c.queues[0] == nil {
		return nil
	}
	dw0, cid := c.events[0], c.aerCIDs[0]
	c.events, c.aerCIDs = c.events[1:], c.aerCIDs[1:]
	conn := c.queues[0].conn
	return func() { conn.Post(nvme.Completion{DW0: dw0, CID: cid}) }
}
