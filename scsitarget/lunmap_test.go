package scsitarget

import (
	"encoding/binary"
	"testing"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/scsi"
)

// TestNexusLUNMap: a nexus with a LUN map sees only its mapped LUNs,
// under its own numbers — in REPORT LUNS, in commands, in task
// management — while another nexus sees the device as it is.
func TestNexusLUNMap(t *testing.T) {
	d := NewDevice("iqn.2026-11.org.blockwire:test", nil)
	for _, l := range []uint64{0, 3, 5} {
		be, _ := mem.New(int64(l+1) << 20) // each LU's size tells it apart
		lu, err := NewLU(d.Name(), LUConfig{LUN: l, Backend: be})
		if err != nil {
			t.Fatal(err)
		}
		d.AddLU(lu)
	}
	masked := &Nexus{InitiatorPort: "iqn.a,i,0x1", TargetPort: "t,0x1", LUNs: map[uint64]uint64{0: 5, 1: 3}}
	open := &Nexus{InitiatorPort: "iqn.b,i,0x1", TargetPort: "t,0x1"}
	d.AddNexus(masked)
	d.AddNexus(open)
	reportLUNs := func(n *Nexus) []uint64 {
		buf := make([]byte, 64)
		c := &Command{Nexus: n, LUN: 0, CDB: []byte{scsi.OpReportLuns, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0}, Data: buf}
		d.Begin(c)
		d.Execute(c)
		d.End(c)
		var out []uint64
		for i := 0; i < int(binary.BigEndian.Uint32(buf)); i += 8 {
			var f [8]byte
			copy(f[:], buf[8+i:])
			l, _ := scsi.DecodeLUN(f)
			out = append(out, l)
		}
		return out
	}
	if got := reportLUNs(masked); len(got) != 2 || got[0] != 0 || got[1] != 1 {
		t.Fatalf("masked REPORT LUNS: %v, want [0 1]", got)
	}
	if got := reportLUNs(open); len(got) != 3 {
		t.Fatalf("open REPORT LUNS: %v", got)
	}
	capacity := func(n *Nexus, lun uint64) (*Command, uint64) {
		buf := make([]byte, 32)
		c := &Command{Nexus: n, LUN: lun, CDB: []byte{0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0}, Data: buf}
		d.Begin(c)
		d.Execute(c)
		d.End(c)
		return c, (binary.BigEndian.Uint64(buf) + 1) * 512
	}
	for _, n := range []*Nexus{masked, open} { // power-on unit attentions
		for l := range uint64(6) {
			capacity(n, l)
		}
	}
	if c, size := capacity(masked, 0); c.Status != scsi.StatusGood || size != 6<<20 {
		t.Fatalf("masked LUN 0 (device LUN 5): status %#x size %d", c.Status, size)
	}
	if c, size := capacity(masked, 1); c.Status != scsi.StatusGood || size != 4<<20 {
		t.Fatalf("masked LUN 1 (device LUN 3): status %#x size %d", c.Status, size)
	}
	if c, _ := capacity(masked, 3); c.Status != scsi.StatusCheckCondition {
		t.Fatalf("masked nexus reached unmapped LUN 3: status %#x", c.Status)
	}
	if s := sense(t, func() *Command { c, _ := capacity(masked, 5); return c }()); s.ASC != 0x25 {
		t.Fatalf("unmapped LUN 5: %v, want LOGICAL UNIT NOT SUPPORTED", s)
	}
	if c, size := capacity(open, 3); c.Status != scsi.StatusGood || size != 4<<20 {
		t.Fatalf("open nexus LUN 3: status %#x size %d", c.Status, size)
	}
	if r := d.ResetLU(masked, 3); r != TMFNoSuchLUN {
		t.Fatalf("LU reset of an unmapped LUN: %v", r)
	}
	if r := d.ResetLU(masked, 1); r != TMFComplete {
		t.Fatalf("LU reset of mapped LUN 1: %v", r)
	}
	// The reset reached device LUN 3: the open nexus sees it there.
	if s := sense(t, func() *Command { c, _ := capacity(open, 3); return c }()); s.ASC != 0x29 {
		t.Fatalf("after the reset, the open nexus's LUN 3: %v", s)
	}
}

// TestLUNChangesReachOnlyTheNexusesThatSeeThem: a LUN added or removed
// outside a nexus's view is not announced to it (it was told of a LUN
// added for someone else), one inside is (REPORTED LUNS DATA HAS
// CHANGED on the LUNs it sees); SetNexusLUNs changes one nexus's view at
// once and tells that nexus alone.
func TestLUNChangesReachOnlyTheNexusesThatSeeThem(t *testing.T) {
	d, _ := newDev(t, false)
	masked := &Nexus{InitiatorPort: "iqn.a,i,0x1", TargetPort: "t,0x1", LUNs: map[uint64]uint64{0: 0}}
	open := &Nexus{InitiatorPort: "iqn.b,i,0x1", TargetPort: "t,0x1"}
	d.AddNexus(masked)
	d.AddNexus(open)
	clearUA(t, d, masked)
	clearUA(t, d, open)
	tur := func(n *Nexus, lun uint64) *Command {
		c := &Command{Nexus: n, LUN: lun, CDB: []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}}
		d.Begin(c)
		d.Execute(c)
		d.End(c)
		return c
	}
	be, _ := mem.New(1 << 20)
	lu2, err := NewLU(d.Name(), LUConfig{LUN: 2, Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	d.AddLU(lu2)
	good(t, tur(masked, 0)) // LUN 2 is not its business
	if s := sense(t, tur(open, 0)); s.ASC != 0x3f || s.ASCQ != 0x0e {
		t.Fatalf("the open nexus after LUN 2 was added: %v, want REPORTED LUNS DATA HAS CHANGED", s)
	}
	// Remapped: the masked nexus now reaches device LUN 2 as its LUN 7
	// and LUN 0 no longer; the open nexus is not told.
	d.SetNexusLUNs(masked, map[uint64]uint64{7: 2})
	if s := sense(t, tur(masked, 7)); s.ASC != 0x3f || s.ASCQ != 0x0e {
		t.Fatalf("the remapped nexus's first command: %v, want REPORTED LUNS DATA HAS CHANGED", s)
	}
	good(t, tur(masked, 7))
	if s := sense(t, tur(masked, 0)); s.ASC != 0x25 {
		t.Fatalf("LUN 0 after the remap: %v, want LOGICAL UNIT NOT SUPPORTED", s)
	}
	if s := sense(t, tur(open, 2)); s.ASC != 0x29 {
		t.Fatalf("the open nexus's first command to the new LUN 2: %v, want its power-on unit attention", s)
	}
	good(t, tur(open, 2)) // and no word of the masked nexus's remap
	// Removing LUN 0 concerns the open nexus only now.
	if err := d.RemoveLU(0); err != nil {
		t.Fatal(err)
	}
	good(t, tur(masked, 7))
	if s := sense(t, tur(open, 2)); s.ASC != 0x3f || s.ASCQ != 0x0e {
		t.Fatalf("the open nexus after LUN 0 was removed: %v, want REPORTED LUNS DATA HAS CHANGED", s)
	}
}
