// Package target is the transport-neutral SCSI target core: the logical
// units of one SCSI target device, I_T nexuses with their unit attentions,
// the task set of every LU with abort and reset, and the SPC/SBC command
// handlers. iSCSI and SRP both drive it through Command; it never imports a
// fabric.
package scsitarget

import (
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/blockwire/blockwire/scsi"
)

// Device is one SCSI target device: a name and a set of logical units.
type Device struct {
	name string
	log  *slog.Logger
	ops  *dispatch

	mu      sync.RWMutex
	lus     map[uint64]*LU
	nexuses map[*Nexus]struct{}

	groups []scsi.PortGroup // ALUA target port groups (alua.go); nil: no ALUA
	// explicit are the states SET TARGET PORT GROUPS gave (here or, kept
	// with shared storage, through another gateway): they take the place
	// of the configured ones.
	explicit map[uint16]scsi.ALUAState
	// aluaWatch are called after the states changed (WatchALUA).
	aluaWatch []func()

	copyMu sync.Mutex
	copies []copyStatus // finished EXTENDED COPY operations, for COPY STATUS
}

// NewDevice returns an empty target device. name is the SCSI target device
// name (for iSCSI, the target's iSCSI name), reported in VPD page 83h.
func NewDevice(name string, log *slog.Logger) *Device {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Device{name: name, log: log, ops: newDispatch(), lus: map[uint64]*LU{}, nexuses: map[*Nexus]struct{}{}}
}

// Name returns the SCSI target device name.
func (d *Device) Name() string { return d.name }

// AddLU adds a logical unit. Every nexus gets REPORTED LUNS DATA HAS CHANGED.
func (d *Device) AddLU(lu *LU) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, dup := d.lus[lu.lun]; dup {
		return fmt.Errorf("target %s: LUN %d already exists", d.name, lu.lun)
	}
	lu.stateMu.Lock()
	lu.dev = d // read by capacityChanged on a backend's goroutine
	lu.stateMu.Unlock()
	// Port group states another gateway set, kept with shared storage.
	if rec := lu.pr.aluaRec.Load(); rec != nil {
		d.explicitLocked(*rec)
	}
	d.lus[lu.lun] = lu
	for n := range d.nexuses {
		// A LUN outside a nexus's view (Nexus.LUNs) changes nothing it
		// sees: it is not told.
		if _, ok := n.visibleLUN(lu.lun); !ok {
			continue
		}
		n.addUA(lu.lun, scsi.UAPowerOnReset())
		for other := range d.lus {
			if _, sees := n.visibleLUN(other); sees && other != lu.lun {
				n.addUA(other, scsi.UAReportedLUNsChanged())
			}
		}
	}
	return nil
}

// RemoveLU removes a logical unit after aborting its tasks.
func (d *Device) RemoveLU(lun uint64) error {
	d.mu.Lock()
	lu, ok := d.lus[lun]
	if ok {
		delete(d.lus, lun)
	}
	d.mu.Unlock()
	if !ok {
		return fmt.Errorf("target %s: no LUN %d", d.name, lun)
	}
	lu.abortMatching(func(*Command) bool { return true }, nil)
	luns := d.LUNs()
	d.forEachNexus(func(n *Nexus) {
		n.dropLUN(lun)
		if _, saw := n.visibleLUN(lun); !saw {
			return
		}
		for _, other := range luns {
			if _, sees := n.visibleLUN(other); sees {
				n.addUA(other, scsi.UAReportedLUNsChanged())
			}
		}
	})
	return nil
}

// LU returns the logical unit with number lun, or nil.
func (d *Device) LU(lun uint64) *LU {
	d.mu.RLock()
	lu := d.lus[lun]
	d.mu.RUnlock()
	return lu
}

// LUNs returns the LUN numbers in ascending order.
func (d *Device) LUNs() []uint64 {
	d.mu.RLock()
	out := make([]uint64, 0, len(d.lus))
	for l := range d.lus {
		out = append(out, l)
	}
	d.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Close closes every LU's backend (flushing file backends).
func (d *Device) Close() error {
	var first error
	for _, l := range d.LUNs() {
		if lu := d.LU(l); lu != nil {
			if err := lu.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

func (d *Device) forEachNexus(f func(*Nexus)) {
	d.mu.RLock()
	ns := make([]*Nexus, 0, len(d.nexuses))
	for n := range d.nexuses {
		ns = append(ns, n)
	}
	d.mu.RUnlock()
	for _, n := range ns {
		f(n)
	}
}

// Nexus is an I_T nexus: one initiator port talking to one target port of
// this device (for iSCSI, one session). It holds that nexus's pending unit
// attentions per LU.
type Nexus struct {
	// InitiatorPort and TargetPort are the SCSI port names, for iSCSI
	// "iqn...,i,0x<ISID>" and "iqn...,t,0x<TPGT>" (RFC 7143 §4.4.3).
	InitiatorPort string
	TargetPort    string
	// RelativePort is the relative target port identifier (VPD 83h).
	RelativePort uint16
	// OnUnitAttention, if set, is told of every unit attention queued
	// for this nexus, so a fabric with asynchronous event reporting (SRP's
	// SRP_AER_REQ) can announce it. The unit attention is still reported
	// by CHECK CONDITION. It is called without the core's locks held and
	// must not block.
	OnUnitAttention func(lun uint64, s scsi.Sense)
	// LUNs, when set, is the nexus's view of the device: the LUN numbers
	// its initiator uses, each mapped to the device's LUN it reaches (LUN
	// masking and per-initiator numbering, as LIO's mapped LUNs). LUNs
	// not in it do not exist for the nexus: REPORT LUNS omits them and
	// commands to them fail as to a missing LUN. Nil: every LUN under its
	// own number. Set before AddNexus; Device.SetNexusLUNs changes it
	// later.
	LUNs map[uint64]uint64
	// view, once SetNexusLUNs has run, takes the place of LUNs.
	view atomic.Pointer[lunView]

	stats   Stats
	mu      sync.Mutex
	pending atomic.Int32
	ua      map[uint64][]scsi.Sense
}

func (n *Nexus) addUA(lun uint64, s scsi.Sense) {
	n.mu.Lock()
	if n.ua == nil {
		n.ua = map[uint64][]scsi.Sense{}
	}
	q := n.ua[lun]
	for _, have := range q {
		if have.ASC == s.ASC && have.ASCQ == s.ASCQ {
			n.mu.Unlock()
			return
		}
	}
	// SAM-5 §5.14: a reset condition supersedes the others queued before it.
	if s.ASC == 0x29 {
		q = q[:0]
	}
	n.ua[lun] = append(q, s)
	n.pending.Store(n.countLocked())
	n.mu.Unlock()
	if n.OnUnitAttention != nil {
		if v, ok := n.visibleLUN(lun); ok {
			n.OnUnitAttention(v, s)
		}
	}
}

// lunView is a nexus's map of the LUNs (Nexus.LUNs) as SetNexusLUNs set
// it; a nil m is every LUN under its own number.
type lunView struct{ m map[uint64]uint64 }

// lunMap is the nexus's view now: nil for every LUN.
func (n *Nexus) lunMap() map[uint64]uint64 {
	if n == nil {
		return nil
	}
	if v := n.view.Load(); v != nil {
		return v.m
	}
	return n.LUNs
}

// deviceLUN is the device LUN the nexus reaches as l; false when l does
// not exist for it.
func (n *Nexus) deviceLUN(l uint64) (uint64, bool) {
	m := n.lunMap()
	if m == nil {
		return l, true
	}
	d, ok := m[l]
	return d, ok
}

// visibleLUN is the number under which the nexus sees device LUN l.
func (n *Nexus) visibleLUN(l uint64) (uint64, bool) {
	m := n.lunMap()
	if m == nil {
		return l, true
	}
	for v, d := range m {
		if d == l {
			return v, true
		}
	}
	return 0, false
}

// SetNexusLUNs gives nexus n a new view of the LUNs (Nexus.LUNs; nil:
// every LUN) at once, as an ACL's LUN map changes while its initiator is
// logged in: LIO looks mapped LUNs up per command too. The LUNs it no
// longer reaches lose their pending unit attentions; every LUN it
// reaches now reports REPORTED LUNS DATA HAS CHANGED (SPC-4 §6.37: a
// change to the logical unit inventory), so the initiator scans again;
// other nexuses are not told. A command already under way finishes on
// the LU it reached.
func (d *Device) SetNexusLUNs(n *Nexus, m map[uint64]uint64) {
	before := map[uint64]bool{}
	for _, l := range d.LUNs() {
		if _, ok := n.visibleLUN(l); ok {
			before[l] = true
		}
	}
	n.view.Store(&lunView{m: m})
	for _, l := range d.LUNs() {
		if _, ok := n.visibleLUN(l); ok {
			n.addUA(l, scsi.UAReportedLUNsChanged())
		} else if before[l] {
			n.dropLUN(l)
		}
	}
}

// LUFor returns the LU that nexus n reaches as LUN l (through its map,
// Nexus.LUNs), or nil.
func (d *Device) LUFor(n *Nexus, l uint64) *LU {
	dl, ok := n.deviceLUN(l)
	if !ok {
		return nil
	}
	return d.LU(dl)
}

// visibleLUNs returns the LUNs nexus n sees, in its numbering, sorted.
func (d *Device) visibleLUNs(n *Nexus) []uint64 {
	m := n.lunMap()
	if m == nil {
		return d.LUNs()
	}
	out := make([]uint64, 0, len(m))
	for v, dl := range m {
		if d.LU(dl) != nil {
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func (n *Nexus) countLocked() int32 {
	var c int32
	for _, q := range n.ua {
		c += int32(len(q))
	}
	return c
}

// takeUA pops the oldest unit attention for lun.
func (n *Nexus) takeUA(lun uint64) (scsi.Sense, bool) {
	if n.pending.Load() == 0 {
		return scsi.Sense{}, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	q := n.ua[lun]
	if len(q) == 0 {
		return scsi.Sense{}, false
	}
	s := q[0]
	n.ua[lun] = q[1:]
	n.pending.Store(n.countLocked())
	return s, true
}

func (n *Nexus) dropLUN(lun uint64) {
	n.mu.Lock()
	delete(n.ua, lun)
	n.pending.Store(n.countLocked())
	n.mu.Unlock()
}

// AddNexus registers a new I_T nexus. Every LU reports POWER ON, RESET, OR
// BUS DEVICE RESET OCCURRED to it first (SAM-5 §6.3.1 lists the I_T nexus
// creation among the events that establish it).
func (d *Device) AddNexus(n *Nexus) {
	d.mu.Lock()
	d.nexuses[n] = struct{}{}
	for l := range d.lus {
		n.addUA(l, scsi.UAPowerOnReset())
	}
	d.mu.Unlock()
}

// RemoveNexus forgets an I_T nexus (session end). Its tasks must already
// have ended.
func (d *Device) RemoveNexus(n *Nexus) {
	d.mu.Lock()
	delete(d.nexuses, n)
	d.mu.Unlock()
	d.ReleaseNexus(n)
}

// ReleaseNexus drops what the loss of nexus n releases: its SPC-2
// reservations and its medium removal preventions (persistent
// reservations survive). RemoveNexus does it; a fabric calls it earlier
// when it knows the nexus is ending (iSCSI: before the Logout Response).
// It is idempotent.
func (d *Device) ReleaseNexus(n *Nexus) {
	d.mu.RLock()
	lus := make([]*LU, 0, len(d.lus))
	for _, lu := range d.lus {
		lus = append(lus, lu)
	}
	d.mu.RUnlock()
	for _, lu := range lus {
		lu.stateMu.Lock()
		if lu.reserver == n {
			lu.reserver = nil
		}
		delete(lu.prevent, n) // its medium removal prevention ends with it
		lu.stateMu.Unlock()
	}
}

// Stats returns the nexus's counters (its session's commands).
func (n *Nexus) Stats() *Stats { return &n.stats }
