package scsitarget

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"

	"github.com/blockwire/blockwire/scsi"
)

// Asymmetric logical unit access (SPC-4 §5.15): the target ports that
// serve the same LUs — several gateways in front of one shared image —
// are put in target port groups, each in an access state. blockwire
// offers implicit ALUA only (TPGS 01b): the states are configured, and
// REPORT TARGET PORT GROUPS tells a multipath initiator which path to
// prefer. Each gateway is one target port group of one port, its
// relative target port identifier (the iSCSI TPGT). blockwire offers
// explicit ALUA too (TPGS 11b): SET TARGET PORT GROUPS changes states,
// which then take the place of the configured ones; on shared storage
// they are kept in the shared record (pr.go), so every gateway in front
// of the image reports them.

// SetPortGroups turns on ALUA with these target port groups (nil turns it
// off). A nexus belongs to the group whose ID is its relative target port.
func (d *Device) SetPortGroups(groups []scsi.PortGroup) error {
	seen := map[uint16]bool{}
	for _, g := range groups {
		if seen[g.ID] {
			return fmt.Errorf("target %s: port group %d twice", d.name, g.ID)
		}
		seen[g.ID] = true
	}
	d.mu.Lock()
	d.groups = append([]scsi.PortGroup(nil), groups...)
	d.mu.Unlock()
	return nil
}

// portGroup returns the ALUA groups (their configured states) and the one
// a nexus's port is in (its state now).
func (d *Device) portGroup(n *Nexus) (all []scsi.PortGroup, mine scsi.PortGroup, ok bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if n != nil {
		mine, ok = d.groupLocked(n.RelativePort)
	}
	return d.groups, mine, ok
}

// groupLocked is group id with its state now (d.mu held).
func (d *Device) groupLocked(id uint16) (scsi.PortGroup, bool) {
	for _, g := range d.groups {
		if g.ID == id {
			if s, set := d.explicit[g.ID]; set {
				g.State = s
			}
			return g, true
		}
	}
	return scsi.PortGroup{}, false
}

// groupStates returns the groups with their states now, and which of them
// SET TARGET PORT GROUPS set.
func (d *Device) groupStates() ([]scsi.PortGroup, map[uint16]bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := append([]scsi.PortGroup(nil), d.groups...)
	set := map[uint16]bool{}
	for i, g := range out {
		if s, ok := d.explicit[g.ID]; ok {
			out[i].State, set[g.ID] = s, true
		}
	}
	return out, set
}

// GroupState is port group id's access state now (as configured, or as
// SET TARGET PORT GROUPS set it, here or through another gateway); false
// when ALUA is off or there is no such group. Other front ends (NVMe's
// ANA) report the same state.
func (d *Device) GroupState(id uint16) (scsi.ALUAState, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	g, ok := d.groupLocked(id)
	return g.State, ok
}

// WatchALUA calls changed (on the changing goroutine, without the
// device's locks) after every change of the groups' states.
func (d *Device) WatchALUA(changed func()) {
	d.mu.Lock()
	d.aluaWatch = append(d.aluaWatch, changed)
	d.mu.Unlock()
}

// explicitLocked takes states as the explicitly set ones. Called with
// d.mu held.
func (d *Device) explicitLocked(states map[uint16]scsi.ALUAState) {
	d.explicit = maps.Clone(states)
}

// setExplicit takes states as the explicitly set ones and tells every
// nexus but sender's (SPC-4 §5.15.2.6: ASYMMETRIC ACCESS STATE CHANGED).
func (d *Device) setExplicit(states map[uint16]scsi.ALUAState, sender *Nexus) {
	d.mu.Lock()
	changed := !maps.Equal(d.explicit, states)
	d.explicitLocked(states)
	watch := slices.Clone(d.aluaWatch)
	d.mu.Unlock()
	if !changed {
		return
	}
	for _, f := range watch {
		f()
	}
	luns := d.LUNs()
	d.forEachNexus(func(n *Nexus) {
		if n == sender {
			return
		}
		for _, l := range luns {
			n.addUA(l, scsi.Sense{Key: scsi.SenseUnitAttention, ASC: 0x2a, ASCQ: 0x06, Bit: -1})
		}
	})
}

// cmdSetTargetPortGroups is SET TARGET PORT GROUPS (SPC-4 §6.38):
// descriptors of a state and a target port group each; all are checked
// before any is set. The new states are kept with every LU on shared
// storage, for the other gateways.
func cmdSetTargetPortGroups(lu *LU, c *Command) error {
	d := lu.device()
	if d == nil {
		return scsi.InvalidOpcode()
	}
	groups, set := d.groupStates()
	if len(groups) == 0 {
		return scsi.InvalidOpcode() // TPGS 00b
	}
	plen := int(binary.BigEndian.Uint32(c.CDB[6:10]))
	if plen == 0 {
		return nil
	}
	c.Transfer = plen
	if plen < 4 || plen%4 != 0 || len(c.Data) < plen {
		return scsi.ParameterListLengthError()
	}
	states := map[uint16]scsi.ALUAState{}
	for id := range set {
		for _, g := range groups {
			if g.ID == id {
				states[id] = g.State
			}
		}
	}
	for off := 4; off < plen; off += 4 {
		st, id := scsi.ALUAState(c.Data[off]&0x0f), binary.BigEndian.Uint16(c.Data[off+2:])
		switch st {
		case scsi.ActiveOptimized, scsi.ActiveNonOptimized, scsi.Standby, scsi.Unavailable:
		default:
			return scsi.InvalidFieldInParameterList(off, 3)
		}
		if !slices.ContainsFunc(groups, func(g scsi.PortGroup) bool { return g.ID == id }) {
			return scsi.InvalidFieldInParameterList(off+2, -1)
		}
		states[id] = st
	}
	// Shared storage first: if the record cannot be written, nothing
	// changed anywhere.
	for _, l := range d.LUNs() {
		o := d.LU(l)
		if o == nil || o.pr.shared == nil {
			continue
		}
		if err := o.prChange(func(p *prState) error {
			p.alua = maps.Clone(states)
			return nil
		}); err != nil {
			return err
		}
	}
	d.setExplicit(states, c.Nexus)
	who := ""
	if c.Nexus != nil {
		who = c.Nexus.InitiatorPort
	}
	d.log.Info("ALUA: port group states set by SET TARGET PORT GROUPS", "target", d.name, "initiator", who, "states", fmt.Sprint(states))
	return nil
}

// aluaRefuses is the sense for a command its port's access state does
// not allow (SPC-4 §5.15.2.4): in standby and unavailable, only commands
// that do not touch the medium (INQUIRY, REPORT LUNS, REPORT TARGET PORT
// GROUPS, REQUEST SENSE, mode and reservation commands…).
func (d *Device) aluaRefuses(n *Nexus, o *opInfo) *scsi.Sense {
	if !o.media || d == nil {
		return nil
	}
	_, g, ok := d.portGroup(n)
	if !ok {
		return nil
	}
	switch g.State {
	case scsi.Standby:
		return &scsi.Sense{Key: scsi.SenseNotReady, ASC: 0x04, ASCQ: 0x0b, Bit: -1} // TARGET PORT IN STANDBY STATE
	case scsi.Unavailable:
		return &scsi.Sense{Key: scsi.SenseNotReady, ASC: 0x04, ASCQ: 0x0c, Bit: -1} // TARGET PORT IN UNAVAILABLE STATE
	}
	return nil
}

// cmdReportTargetPortGroups is REPORT TARGET PORT GROUPS (SPC-4 §6.36):
// every group with its state, the states it supports and its port.
func cmdReportTargetPortGroups(lu *LU, c *Command) error {
	alloc := int(binary.BigEndian.Uint32(c.CDB[6:10]))
	ext := c.CDB[1]>>5 == 1 // PARAMETER DATA FORMAT 001b: extended header
	var groups []scsi.PortGroup
	var set map[uint16]bool
	if d := lu.device(); d != nil {
		groups, set = d.groupStates()
	}
	if len(groups) == 0 {
		return scsi.InvalidOpcode() // TPGS 00b: not supported
	}
	hl := 4
	if ext {
		hl = 8
	}
	b := make([]byte, hl, hl+12*len(groups))
	if ext {
		b[4] = 0x10 // format type 001b
		b[5] = 10   // IMPLICIT TRANSITION TIME, seconds
	}
	for _, g := range groups {
		d := make([]byte, 12)
		d[0] = byte(g.State) & 0x0f
		d[1] = 0x08 | 0x04 | 0x02 | 0x01 // U_SUP, S_SUP, AN_SUP, AO_SUP
		binary.BigEndian.PutUint16(d[2:], g.ID)
		d[5] = 0x02 // STATUS CODE: altered by implicit ALUA behaviour
		if set[g.ID] {
			d[5] = 0x01 // altered by SET TARGET PORT GROUPS
		}
		d[7] = 1 // one target port
		binary.BigEndian.PutUint16(d[10:], g.ID)
		b = append(b, d...)
	}
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	c.putData(b, alloc)
	return nil
}
