package nvmetarget

import (
	"encoding/binary"

	"github.com/blockwire/blockwire/nvme"
)

// ANAState is an asymmetric namespace access state (NVMe Base 2.0,
// "Asymmetric Namespace Access Reporting"): what a controller's path to
// a group of namespaces is worth — the same notion as SCSI ALUA's
// target port group states, which is where blockwire takes it from.
type ANAState uint8

const (
	ANAOptimized      ANAState = 0x01
	ANANonOptimized   ANAState = 0x02
	ANAInaccessible   ANAState = 0x03
	ANAPersistentLoss ANAState = 0x04
	ANAChange         ANAState = 0x0f
)

// anaGroup is the ANA group of every namespace: one, the subsystem's
// (its state is the gateway's, for all its namespaces).
const anaGroup = 1

// maxNamespaces is NN and MNAN when ANA is reported: the namespace IDs a
// subsystem may use (LUN N is namespace N+1, LUNs below 16384).
const maxNamespaces = 16384

// Path-related statuses (SCT 3) of ANA.
var (
	statusANAPersistentLoss = nvme.MakeStatus(nvme.SCTPath, 0x01, false)
	statusANAInaccessible   = nvme.MakeStatus(nvme.SCTPath, 0x02, false)
	statusANATransition     = nvme.MakeStatus(nvme.SCTPath, 0x03, false)
)

// aenANA is OAES's (and the Asynchronous Event Configuration's) ANA
// change notices bit.
const aenANA = 1 << 11

// logANA is the ANA log page.
const logANA = 0x0c

// ana reports whether the subsystem reports ANA, and its state now.
func (s *Subsystem) ana() (ANAState, bool) {
	if s.cfg.ANA == nil || s.discovery {
		return 0, false
	}
	return s.cfg.ANA(), true
}

// anaRefuses is the status of an I/O command on a path whose state does
// not allow it (nil status: allowed).
func (s *Subsystem) anaRefuses() nvme.Status {
	st, on := s.ana()
	if !on {
		return 0
	}
	switch st {
	case ANAInaccessible:
		return statusANAInaccessible
	case ANAPersistentLoss:
		return statusANAPersistentLoss
	case ANAChange:
		return statusANATransition
	}
	return 0
}

// ANAChanged tells every controller that the ANA state changed: an ANA
// change notice where the host enabled it.
func (s *Subsystem) ANAChanged() {
	s.anaChanges.Add(1)
	s.mu.Lock()
	ctrls := s.controllers()
	s.mu.Unlock()
	for _, c := range ctrls {
		c.mu.Lock()
		var post func()
		if c.aen&aenANA != 0 {
			// Notice (type 2), ANA Change (03h), log page 0Ch.
			post = c.eventLocked(2 | 0x03<<8 | logANA<<16)
		}
		c.mu.Unlock()
		if post != nil {
			post()
		}
	}
}

// anaLog is the ANA log page: the header, then the one group with its
// state and, unless rgo (return groups only), the namespaces the host
// sees in it.
func (c *Controller) anaLog(rgo bool) []byte {
	st, _ := c.s.ana()
	var ids []uint32
	if !rgo {
		for _, id := range c.s.Namespaces() {
			if c.s.visible(c.hostNQN, id) {
				ids = append(ids, id)
			}
		}
	}
	page := make([]byte, 16+32+4*len(ids))
	chg := c.s.anaChanges.Load()
	binary.LittleEndian.PutUint64(page[0:], chg)
	binary.LittleEndian.PutUint16(page[8:], 1) // NGRPS
	g := page[16:]
	binary.LittleEndian.PutUint32(g[0:], anaGroup)
	binary.LittleEndian.PutUint32(g[4:], uint32(len(ids)))
	binary.LittleEndian.PutUint64(g[8:], chg)
	g[16] = byte(st)
	for i, id := range ids {
		binary.LittleEndian.PutUint32(g[32+4*i:], id)
	}
	return page
}
