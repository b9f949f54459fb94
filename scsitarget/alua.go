package scsitarget

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"github.com/blockwire/blockwire/scsi"
)

// Asymmetric logical unit access (SPC-4 §5.15): the target ports that
// serve the same LUs — several gateways in front of one shared image —
// are put in target port groups, each in an access state. blockwire
// offers implicit ALUA only (TPGS 01b): the states are configured, and
// REPORT TARGET PORT GROUPS tells a multipath initiator which path to
// prefer. Each gateway is one target port group of one port, its
// relative target port identifier (the iSCSI TPGT).

// ALUAState is a target port group's asymmetric access state (SPC-4
// table 154).
type ALUAState uint8

// Access states.
const (
	ActiveOptimized    ALUAState = 0x0
	ActiveNonOptimized ALUAState = 0x1
	Standby            ALUAState = 0x2
	Unavailable        ALUAState = 0x3
)

var aluaNames = map[ALUAState][]string{
	ActiveOptimized:    {"active-optimized", "ao"},
	ActiveNonOptimized: {"active-non-optimized", "ano"},
	Standby:            {"standby"},
	Unavailable:        {"unavailable"},
}

func (s ALUAState) String() string {
	if n, ok := aluaNames[s]; ok {
		return n[0]
	}
	return fmt.Sprintf("state %#x", uint8(s))
}

// PortGroup is a target port group: its identifier (also the relative
// target port identifier of its one port) and access state.
type PortGroup struct {
	ID    uint16
	State ALUAState
}

// ParsePortGroup reads "ID=state", state one of active-optimized (ao),
// active-non-optimized (ano), standby, unavailable.
func ParsePortGroup(s string) (PortGroup, error) {
	id, st, ok := strings.Cut(s, "=")
	if !ok {
		return PortGroup{}, fmt.Errorf("port group %q: want ID=state", s)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(id), 10, 16)
	if err != nil || n == 0 {
		return PortGroup{}, fmt.Errorf("port group %q: the ID is a number from 1 to 65535", s)
	}
	st = strings.ToLower(strings.TrimSpace(st))
	for state, names := range aluaNames {
		for _, name := range names {
			if st == name {
				return PortGroup{ID: uint16(n), State: state}, nil
			}
		}
	}
	return PortGroup{}, fmt.Errorf("port group %q: state is active-optimized, active-non-optimized, standby or unavailable", s)
}

// SetPortGroups turns on ALUA with these target port groups (nil turns it
// off). A nexus belongs to the group whose ID is its relative target port.
func (d *Device) SetPortGroups(groups []PortGroup) error {
	seen := map[uint16]bool{}
	for _, g := range groups {
		if seen[g.ID] {
			return fmt.Errorf("target %s: port group %d twice", d.name, g.ID)
		}
		seen[g.ID] = true
	}
	d.mu.Lock()
	d.groups = append([]PortGroup(nil), groups...)
	d.mu.Unlock()
	return nil
}

// portGroup returns the ALUA groups and the one a nexus's port is in.
func (d *Device) portGroup(n *Nexus) (all []PortGroup, mine PortGroup, ok bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for _, g := range d.groups {
		if n != nil && g.ID == n.RelativePort {
			mine, ok = g, true
		}
	}
	return d.groups, mine, ok
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
	case Standby:
		return &scsi.Sense{Key: scsi.SenseNotReady, ASC: 0x04, ASCQ: 0x0b, Bit: -1} // TARGET PORT IN STANDBY STATE
	case Unavailable:
		return &scsi.Sense{Key: scsi.SenseNotReady, ASC: 0x04, ASCQ: 0x0c, Bit: -1} // TARGET PORT IN UNAVAILABLE STATE
	}
	return nil
}

// cmdReportTargetPortGroups is REPORT TARGET PORT GROUPS (SPC-4 §6.36):
// every group with its state, the states it supports and its port.
func cmdReportTargetPortGroups(lu *LU, c *Command) error {
	alloc := int(binary.BigEndian.Uint32(c.CDB[6:10]))
	ext := c.CDB[1]>>5 == 1 // PARAMETER DATA FORMAT 001b: extended header
	var groups []PortGroup
	if d := lu.device(); d != nil {
		groups, _, _ = d.portGroup(c.Nexus)
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
		d[7] = 1    // one target port
		binary.BigEndian.PutUint16(d[10:], g.ID)
		b = append(b, d...)
	}
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	c.putData(b, alloc)
	return nil
}
