package nvmetarget

import (
	"encoding/binary"
	"time"

	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/nvme"
)

// Direction is the data a command moves.
type Direction uint8

const (
	NoData Direction = iota
	HostToController
	ControllerToHost
)

// DataDirection is the direction of c's data: opcode bits 1:0 (for a
// fabrics command, FCType's), 01b host to controller, 10b controller to
// host (11b, bidirectional, no command here uses).
func DataDirection(c *nvme.Command) Direction {
	op := c.Opcode
	if op == nvme.AdminFabrics {
		op = c.FCType()
	}
	switch op & 3 {
	case 1:
		return HostToController
	case 2:
		return ControllerToHost
	}
	return NoData
}

// Result is what a command's execution returns: the completion (CID and
// SQHD are the transport's to fill), how many bytes of the data buffer
// go to the host, and, for an Asynchronous Event Request, that the
// completion comes later (through Conn.Post).
type Result struct {
	CQE      nvme.Completion
	N        int
	Deferred bool
}

func fail(st nvme.Status) Result { return Result{CQE: nvme.Completion{Status: st}} }

// Unit returns the unit an I/O command addresses, nil when it addresses
// none (or one the host does not see): the transport runs the command
// on that unit's queue unless the unit never blocks.
func (q *Queue) Unit(c *nvme.Command) *blockcore.Unit {
	if q.qid == 0 || q.c.s.discovery {
		return nil
	}
	return q.c.s.namespace(q.c.hostNQN, c.NSID)
}

// Exec executes one command of the queue. data is its host-to-controller
// data, received in full, or the buffer its controller-to-host data goes
// into (as long as the command's SGL says, at most MaxTransfer). u is
// what Unit returned for it (the transport routes by it; so the lookup
// is made once), or nil.
func (q *Queue) Exec(c *nvme.Command, data []byte, u *blockcore.Unit) Result {
	if c.Opcode == nvme.AdminFabrics {
		return q.fabrics(c, data)
	}
	if !q.authenticated() {
		return fail(statusAuthRequired)
	}
	if q.qid != 0 {
		if !q.c.ready.Load() {
			return fail(nvme.StatusCommandSequence)
		}
		start := q.c.since()
		res := q.io(c, data, u)
		if !res.Deferred {
			q.count(c.Opcode, u, len(data), res.CQE.Status, q.c.since()-start)
		}
		return res
	}
	q.c.mu.Lock()
	enabled := q.c.cc&nvme.CCEnable != 0
	q.c.mu.Unlock()
	if !enabled {
		// Before CC.EN only the fabrics commands (NVMe over Fabrics,
		// "Controller Initialization").
		return fail(nvme.StatusCommandSequence)
	}
	return q.admin(c, data)
}

// fabrics executes Property Get/Set and refuses what else may come.
func (q *Queue) fabrics(c *nvme.Command, data []byte) Result {
	switch c.FCType() {
	case nvme.FabricsConnect:
		return fail(nvme.StatusCommandSequence) // a queue connects once
	case nvme.FabricsAuthSend:
		return q.authSend(c, data)
	case nvme.FabricsAuthReceive:
		return q.authRecv(c, data)
	case nvme.FabricsPropertyGet, nvme.FabricsPropertySet:
		if !q.authenticated() {
			return fail(statusAuthRequired)
		}
		if q.qid != 0 {
			return fail(nvme.StatusInvalidOpcode)
		}
		p, err := nvme.DecodeProperty(c)
		if err != nil {
			return fail(nvme.StatusInvalidField)
		}
		return q.c.property(p)
	case nvme.FabricsDisconnect:
		return fail(nvme.StatusInvalidOpcode)
	}
	return fail(nvme.StatusInvalidOpcode)
}

// property reads or writes a controller property.
func (c *Controller) property(p nvme.Property) Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.Set {
		if p.Offset != nvme.PropCC || p.Size != 4 {
			return fail(nvme.StatusInvalidField)
		}
		c.setCC(uint32(p.Value))
		return Result{}
	}
	var v uint64
	switch p.Offset {
	case nvme.PropCAP:
		mqes := c.s.t.o.QueueSize - 1
		v = nvme.CAP(uint16(mqes), 1)
	case nvme.PropVS:
		v = uint64(nvme.Version(1, 3))
	case nvme.PropCC:
		v = uint64(c.cc)
	case nvme.PropCSTS:
		v = uint64(c.csts)
	default:
		return fail(nvme.StatusInvalidField)
	}
	if p.Size == 4 && p.Offset == nvme.PropCAP {
		return fail(nvme.StatusInvalidField)
	}
	return Result{CQE: nvme.Completion{DW0: uint32(v), DW1: uint32(v >> 32)}}
}

// setCC applies a Controller Configuration write (c.mu held): enabling
// makes the controller ready, clearing EN resets it, a shutdown
// notification flushes the namespaces' caches and reports the shutdown
// complete.
func (c *Controller) setCC(v uint32) {
	old := c.cc
	c.cc = v
	switch {
	case v&nvme.CCShutdownMask != 0 && old&nvme.CCShutdownMask == 0:
		c.mu.Unlock()
		c.flushAll()
		c.mu.Lock()
		c.csts = c.csts&^(3<<2) | nvme.CSTSShutdown
	case v&nvme.CCEnable != 0 && old&nvme.CCEnable == 0:
		c.csts |= nvme.CSTSReady
	case v&nvme.CCEnable == 0 && old&nvme.CCEnable != 0:
		c.csts &^= nvme.CSTSReady | 3<<2
		c.aerCIDs, c.events = nil, nil
	}
	c.ready.Store(c.csts&nvme.CSTSReady != 0 && !c.destroyed)
}

// flushAll flushes every namespace the host sees.
func (c *Controller) flushAll() {
	for _, id := range c.s.Namespaces() {
		if u := c.s.namespace(c.hostNQN, id); u != nil {
			if err := u.Store().Flush(); err != nil {
				c.log.Error("flush at shutdown failed", "nsid", id, "err", err)
			}
		}
	}
}

// Feature identifiers (Base 2.0, "Feature Identifiers").
const (
	featArbitration  = 0x01
	featPower        = 0x02
	featTempThresh   = 0x04
	featErrRecovery  = 0x05
	featWriteCache   = 0x06
	featNumQueues    = 0x07
	featIRQCoalesce  = 0x08
	featWriteAtomic  = 0x0a
	featAsyncEvent   = 0x0b
	featKeepAlive    = 0x0f
	featHostID       = 0x81
	featResvMask     = 0x82
	featResvPersist  = 0x83
	aenNamespace     = 1 << 8 // Namespace Attribute Notices
	logError         = 0x01
	logSMART         = 0x02
	logFirmware      = 0x03
	logChangedNS     = 0x04
	logEffects       = 0x05
	logResvNotice    = 0x80
	logDiscovery     = 0x70
	identifyNS       = 0x00
	identifyCtrl     = 0x01
	identifyActiveNS = 0x02
	identifyNSDesc   = 0x03
)

// admin executes an admin command.
func (q *Queue) admin(c *nvme.Command, data []byte) Result {
	ctrl := q.c
	switch c.Opcode {
	case nvme.AdminKeepAlive:
		ctrl.keepAlive()
		return Result{}
	case nvme.AdminIdentify:
		return ctrl.identify(c, data)
	case nvme.AdminGetLogPage:
		return ctrl.getLogPage(c, data)
	case nvme.AdminAsyncEventReq:
		ctrl.mu.Lock()
		if len(ctrl.aerCIDs) >= aerLimit {
			ctrl.mu.Unlock()
			return fail(nvme.StatusAsyncEventLimit)
		}
		ctrl.aerCIDs = append(ctrl.aerCIDs, c.CID)
		post := ctrl.deliverLocked()
		ctrl.mu.Unlock()
		if post != nil {
			post()
		}
		return Result{Deferred: true}
	case nvme.AdminAbort:
		// Commands run to completion here once fetched; DW0 bit 0 set:
		// the command was not aborted (Base 2.0, Abort).
		return Result{CQE: nvme.Completion{DW0: 1}}
	case nvme.AdminSetFeatures:
		return ctrl.setFeature(c, data)
	case nvme.AdminGetFeatures:
		return ctrl.getFeature(c, data)
	}
	return fail(nvme.StatusInvalidOpcode)
}

// setFeature executes Set Features.
func (c *Controller) setFeature(cmd *nvme.Command, data []byte) Result {
	fid, v := uint8(cmd.CDW[0]), cmd.CDW[1]
	if cmd.CDW[0]>>31 != 0 {
		return fail(nvme.MakeStatus(nvme.SCTCommandSpecific, 0x0d, true)) // Feature Identifier Not Saveable
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch fid {
	case featNumQueues:
		if c.s.discovery {
			return fail(nvme.StatusInvalidField)
		}
		if uint16(v) == 0xffff || uint16(v>>16) == 0xffff {
			return fail(nvme.StatusInvalidField)
		}
		want := int(min(uint16(v), uint16(v>>16))) + 1
		c.nqueues = min(want, c.s.t.o.IOQueues)
		n := uint32(c.s.t.o.IOQueues - 1)
		return Result{CQE: nvme.Completion{DW0: n | n<<16}}
	case featAsyncEvent:
		c.aen = v
		return Result{}
	case featKeepAlive:
		c.kato = time.Duration(v) * time.Millisecond
		if c.kaTimer != nil {
			c.kaTimer.Stop()
			c.kaTimer = nil
		}
		if c.kato > 0 {
			c.kaTimer = time.AfterFunc(c.kato, c.expire)
		}
		return Result{}
	case featWriteCache:
		if c.s.discovery {
			return fail(nvme.StatusInvalidField)
		}
		c.mu.Unlock()
		for _, id := range c.s.Namespaces() {
			if u := c.s.namespace(c.hostNQN, id); u != nil {
				u.Store().SetWriteCache(v&1 != 0)
			}
		}
		c.mu.Lock()
		return Result{}
	case featArbitration, featPower, featTempThresh, featErrRecovery, featIRQCoalesce, featWriteAtomic:
		return Result{} // accepted and without effect over a fabric
	case featHostID:
		return fail(nvme.MakeStatus(nvme.SCTGeneric, 0x0c, true)) // set at Connect only
	case featResvMask:
		// The notices masked (bits 1 to 3), for one namespace or (NSID
		// FFFFFFFFh) every one.
		if c.s.discovery {
			return fail(nvme.StatusInvalidField)
		}
		if c.resvMask == nil {
			c.resvMask = map[uint32]uint32{}
		}
		if cmd.NSID == 0xffffffff {
			for _, id := range c.s.Namespaces() {
				c.resvMask[id] = v & 0xe
			}
			c.resvMask[0xffffffff] = v & 0xe
			return Result{}
		}
		if c.s.namespace(c.hostNQN, cmd.NSID) == nil {
			return fail(nvme.StatusInvalidNamespace)
		}
		c.resvMask[cmd.NSID] = v & 0xe
		return Result{}
	}
	return fail(nvme.StatusInvalidField)
}

// getFeature executes Get Features (current values).
func (c *Controller) getFeature(cmd *nvme.Command, data []byte) Result {
	fid := uint8(cmd.CDW[0])
	c.mu.Lock()
	defer c.mu.Unlock()
	switch fid {
	case featNumQueues:
		n := uint32(c.s.t.o.IOQueues - 1)
		return Result{CQE: nvme.Completion{DW0: n | n<<16}}
	case featAsyncEvent:
		return Result{CQE: nvme.Completion{DW0: c.aen}}
	case featKeepAlive:
		return Result{CQE: nvme.Completion{DW0: uint32(c.kato / time.Millisecond)}}
	case featWriteCache:
		var on uint32
		for _, id := range c.s.Namespaces() {
			if u := c.s.namespace(c.hostNQN, id); u != nil && u.Store().WriteCache() {
				on = 1
			}
		}
		return Result{CQE: nvme.Completion{DW0: on}}
	case featArbitration, featPower, featErrRecovery, featIRQCoalesce, featWriteAtomic:
		return Result{}
	case featTempThresh:
		return Result{CQE: nvme.Completion{DW0: 343}} // 70 °C, in kelvin
	case featResvPersist:
		// PTPL of the namespace's reservation state (changed by a
		// Reservation Register's CPTPL), read without c.mu (lock order:
		// the reservation state before c.mu, resv.go).
		c.mu.Unlock()
		var on uint32
		u := c.s.namespace(c.hostNQN, cmd.NSID)
		ok := u != nil && u.Reservations() != nil
		if ok && u.Reservations().Status().Persist {
			on = 1
		}
		c.mu.Lock()
		if !ok {
			return fail(nvme.StatusInvalidField)
		}
		return Result{CQE: nvme.Completion{DW0: on}}
	case featResvMask:
		return Result{CQE: nvme.Completion{DW0: c.resvMaskOf(cmd.NSID)}}
	case featHostID:
		if cmd.CDW[1]&1 == 0 || len(data) < 16 {
			return fail(nvme.StatusInvalidField) // only the 128-bit identifier
		}
		copy(data, c.hostID[:])
		return Result{N: 16}
	}
	return fail(nvme.StatusInvalidField)
}

// put16/put32/put64 write little-endian fields; padded writes ASCII
// space-padded.
func put16(b []byte, v uint16) { binary.LittleEndian.PutUint16(b, v) }
func put32(b []byte, v uint32) { binary.LittleEndian.PutUint32(b, v) }
func put64(b []byte, v uint64) { binary.LittleEndian.PutUint64(b, v) }

func padded(b []byte, s string) {
	n := copy(b, s)
	for i := n; i < len(b); i++ {
		b[i] = ' '
	}
}

// count counts a finished I/O command in the controller's counters and
// its namespace's unit's (which its SCSI front end counts into too).
func (q *Queue) count(op uint8, u *blockcore.Unit, n int, st nvme.Status, d time.Duration) {
	cl := blockcore.ClassOther
	switch op {
	case nvme.OpRead:
		cl = blockcore.ClassRead
	case nvme.OpWrite:
		cl = blockcore.ClassWrite
	}
	if st != 0 {
		n = 0
	}
	q.c.stats.CountStatus(cl, n, d, st == statusReservationConflict, st != 0)
	if u != nil {
		u.Stats().CountStatus(cl, n, d, st == statusReservationConflict, st != 0)
	}
}
