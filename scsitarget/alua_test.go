package scsitarget

import (
	"encoding/binary"
	"testing"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/scsi"
)

func TestALUA(t *testing.T) {
	d := NewDevice("iqn.2026-11.org.blockwire:alua", nil)
	be, _ := mem.New(1 << 20)
	lu, err := NewLU(d.Name(), LUConfig{Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	d.AddLU(lu)
	rtpg := []byte{scsi.OpMaintenanceIn, scsi.SAReportTargetPortGroups, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}
	n1 := nexus(d, "iqn.i,i,0x1", "iqn.t,t,0x1")
	n1.RelativePort = 1
	// Without port groups: TPGS 0, and REPORT TARGET PORT GROUPS is not
	// supported.
	inq := make([]byte, 96)
	good(t, run(d, n1, []byte{scsi.OpInquiry, 0, 0, 0, 96, 0}, inq))
	if inq[5]&0x30 != 0 {
		t.Fatalf("TPGS %#x without ALUA", inq[5]&0x30)
	}
	if c := run(d, n1, rtpg, make([]byte, 256)); c.Status != scsi.StatusCheckCondition {
		t.Fatal("REPORT TARGET PORT GROUPS without ALUA succeeded")
	}

	if err := d.SetPortGroups([]scsi.PortGroup{{ID: 1, State: scsi.ActiveOptimized}, {ID: 2, State: scsi.Standby}}); err != nil {
		t.Fatal(err)
	}
	n2 := nexus(d, "iqn.i,i,0x1", "iqn.t,t,0x2")
	n2.RelativePort = 2
	good(t, run(d, n1, []byte{scsi.OpInquiry, 0, 0, 0, 96, 0}, inq))
	if inq[5]&0x30 != 0x30 {
		t.Fatalf("TPGS %#x, want implicit and explicit (11b)", inq[5]&0x30)
	}
	buf := make([]byte, 256)
	good(t, run(d, n2, rtpg, buf))
	if l := binary.BigEndian.Uint32(buf); l != 24 {
		t.Fatalf("RTPG length %d, want two 12-byte descriptors", l)
	}
	g1, g2 := buf[4:16], buf[16:28]
	if g1[0]&0x0f != 0 || binary.BigEndian.Uint16(g1[2:]) != 1 || g1[7] != 1 || binary.BigEndian.Uint16(g1[10:]) != 1 {
		t.Fatalf("group 1: % x", g1)
	}
	if g2[0]&0x0f != 2 || binary.BigEndian.Uint16(g2[2:]) != 2 || binary.BigEndian.Uint16(g2[10:]) != 2 {
		t.Fatalf("group 2: % x", g2)
	}
	// Extended header.
	rtpg[1] |= 0x20
	good(t, run(d, n2, rtpg, buf))
	if buf[4] != 0x10 || binary.BigEndian.Uint32(buf) != 28 {
		t.Fatalf("extended header: % x", buf[:8])
	}
	// scsi.Standby: media access is NOT READY 04/0B through port 2, fine
	// through port 1; INQUIRY works on both.
	read := []byte{scsi.OpRead10, 0, 0, 0, 0, 0, 0, 0, 1, 0}
	if s := sense(t, run(d, n2, read, make([]byte, 512))); s.Key != scsi.SenseNotReady || s.ASC != 0x04 || s.ASCQ != 0x0b {
		t.Fatalf("standby read: sense %x/%02x/%02x", s.Key, s.ASC, s.ASCQ)
	}
	good(t, run(d, n1, read, make([]byte, 512)))
	good(t, run(d, n2, []byte{scsi.OpInquiry, 0, 0, 0, 96, 0}, inq))
	// VPD 83h names the port's group.
	vpd := make([]byte, 512)
	good(t, run(d, n2, []byte{scsi.OpInquiry, 1, 0x83, 2, 0, 0}, vpd))
	found := false
	for o := 4; o+4 <= len(vpd) && vpd[o+3] > 0; o += 4 + int(vpd[o+3]) {
		if vpd[o+1]&0x0f == 5 {
			found = binary.BigEndian.Uint16(vpd[o+6:]) == 2
		}
	}
	if !found {
		t.Fatal("VPD 83h has no target port group designator 2")
	}
	for _, bad := range []string{"x", "0=ao", "1=fast", "70000=ao"} {
		if _, err := scsi.ParsePortGroup(bad); err == nil {
			t.Errorf("scsi.ParsePortGroup(%q) accepted", bad)
		}
	}
	if g, err := scsi.ParsePortGroup("2=active-non-optimized"); err != nil || g != (scsi.PortGroup{ID: 2, State: scsi.ActiveNonOptimized}) {
		t.Errorf("scsi.ParsePortGroup: %+v %v", g, err)
	}
	if d.SetPortGroups([]scsi.PortGroup{{ID: 1, State: scsi.Standby}, {ID: 1, State: scsi.Standby}}) == nil {
		t.Error("duplicate group accepted")
	}
}

// stpg is SET TARGET PORT GROUPS setting each group to its state.
func stpg(groups ...scsi.PortGroup) ([]byte, []byte) {
	prm := make([]byte, 4, 4+4*len(groups))
	for _, g := range groups {
		prm = append(prm, byte(g.State), 0, byte(g.ID>>8), byte(g.ID))
	}
	cdb := []byte{scsi.OpMaintenanceOut, scsi.SASetTargetPortGroups, 0, 0, 0, 0, 0, 0, 0, byte(len(prm)), 0, 0}
	return cdb, prm
}

// rtpgStates reads REPORT TARGET PORT GROUPS: state and status code by
// group.
func rtpgStates(t *testing.T, d *Device, n *Nexus) map[uint16][2]byte {
	t.Helper()
	buf := make([]byte, 256)
	good(t, run(d, n, []byte{scsi.OpMaintenanceIn, scsi.SAReportTargetPortGroups, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}, buf))
	out := map[uint16][2]byte{}
	l := int(binary.BigEndian.Uint32(buf))
	for o := 4; o+12 <= 4+l; o += 12 {
		out[binary.BigEndian.Uint16(buf[o+2:])] = [2]byte{buf[o] & 0x0f, buf[o+5]}
	}
	return out
}

// TestExplicitALUA: SET TARGET PORT GROUPS changes states (all checked
// first), REPORT TARGET PORT GROUPS reports them as set explicitly, the
// other nexuses get ASYMMETRIC ACCESS STATE CHANGED, a port put in
// standby refuses media access.
func TestExplicitALUA(t *testing.T) {
	d := NewDevice("iqn.2026-11.org.blockwire:alua", nil)
	be, _ := mem.New(1 << 20)
	lu, _ := NewLU(d.Name(), LUConfig{Backend: be})
	d.AddLU(lu)
	if err := d.SetPortGroups([]scsi.PortGroup{{ID: 1, State: scsi.ActiveOptimized}, {ID: 2, State: scsi.Standby}}); err != nil {
		t.Fatal(err)
	}
	n1 := nexus(d, "iqn.i,i,0x1", "iqn.t,t,0x1")
	n1.RelativePort = 1
	n2 := nexus(d, "iqn.i,i,0x1", "iqn.t,t,0x2")
	n2.RelativePort = 2
	// Refused whole: an unknown group, a state one cannot set.
	for _, bad := range [][]scsi.PortGroup{{{ID: 2, State: scsi.ActiveOptimized}, {ID: 9, State: scsi.Standby}}, {{ID: 2, State: scsi.ALUAState(0x0f)}}} {
		cdb, prm := stpg(bad...)
		if s := sense(t, run(d, n1, cdb, prm)); s.Key != scsi.SenseIllegalRequest || s.ASC != 0x26 {
			t.Fatalf("SET TARGET PORT GROUPS %v: sense %x/%02x", bad, s.Key, s.ASC)
		}
	}
	if st := rtpgStates(t, d, n1); st[2] != [2]byte{byte(scsi.Standby), 0x02} {
		t.Fatalf("after refused SETs: group 2 %v", st[2])
	}
	cdb, prm := stpg(scsi.PortGroup{ID: 1, State: scsi.Standby}, scsi.PortGroup{ID: 2, State: scsi.ActiveOptimized})
	good(t, run(d, n1, cdb, prm))
	st := rtpgStates(t, d, n1)
	if st[1] != [2]byte{byte(scsi.Standby), 0x01} || st[2] != [2]byte{byte(scsi.ActiveOptimized), 0x01} {
		t.Fatalf("after SET TARGET PORT GROUPS: %v", st)
	}
	// The other nexus is told; the sender is not.
	tur := []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}
	if s := sense(t, run(d, n2, tur, nil)); s.Key != scsi.SenseUnitAttention || s.ASC != 0x2a || s.ASCQ != 0x06 {
		t.Fatalf("the other nexus: sense %x/%02x/%02x, want ASYMMETRIC ACCESS STATE CHANGED", s.Key, s.ASC, s.ASCQ)
	}
	good(t, run(d, n2, tur, nil))
	read := []byte{scsi.OpRead10, 0, 0, 0, 0, 0, 0, 0, 1, 0}
	good(t, run(d, n2, read, make([]byte, 512)))
	if s := sense(t, run(d, n1, read, make([]byte, 512))); s.Key != scsi.SenseNotReady || s.ASCQ != 0x0b {
		t.Fatalf("read through the port now in standby: sense %x/%02x/%02x", s.Key, s.ASC, s.ASCQ)
	}
}

// TestExplicitALUASharedAcrossGateways: on shared storage the states set
// through one gateway are what another reports, and a gateway that
// starts later takes them from the shared record.
func TestExplicitALUASharedAcrossGateways(t *testing.T) {
	ds, rec := gateways(t, 2)
	for _, d := range ds {
		if err := d.SetPortGroups([]scsi.PortGroup{{ID: 1, State: scsi.ActiveOptimized}, {ID: 2, State: scsi.ActiveNonOptimized}}); err != nil {
			t.Fatal(err)
		}
	}
	a := nexus(ds[0], "iqn.i,i,0x1", "iqn.t,t,0x1")
	a.RelativePort = 1
	b := nexus(ds[1], "iqn.i,i,0x1", "iqn.t,t,0x2")
	b.RelativePort = 2
	cdb, prm := stpg(scsi.PortGroup{ID: 1, State: scsi.Unavailable}, scsi.PortGroup{ID: 2, State: scsi.ActiveOptimized})
	good(t, run(ds[0], a, cdb, prm))
	tur := []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}
	if s := sense(t, run(ds[1], b, tur, nil)); s.Key != scsi.SenseUnitAttention || s.ASC != 0x2a || s.ASCQ != 0x06 {
		t.Fatalf("gateway B: sense %x/%02x/%02x, want ASYMMETRIC ACCESS STATE CHANGED", s.Key, s.ASC, s.ASCQ)
	}
	if st := rtpgStates(t, ds[1], b); st[1] != [2]byte{byte(scsi.Unavailable), 0x01} || st[2] != [2]byte{byte(scsi.ActiveOptimized), 0x01} {
		t.Fatalf("gateway B reports %v", st)
	}
	// A third gateway, started now, reads them from the record.
	disk, _ := mem.New(16 << 20)
	d3 := NewDevice("iqn.2026-11.org.blockwire:shared", nil)
	lu3, err := NewLU(d3.Name(), LUConfig{Backend: sharedMem{disk, rec}})
	if err != nil {
		t.Fatal(err)
	}
	d3.SetPortGroups([]scsi.PortGroup{{ID: 1, State: scsi.ActiveOptimized}, {ID: 2, State: scsi.ActiveNonOptimized}})
	d3.AddLU(lu3)
	c := nexus(d3, "iqn.i,i,0x1", "iqn.t,t,0x3")
	if st := rtpgStates(t, d3, c); st[1][0] != byte(scsi.Unavailable) || st[2][0] != byte(scsi.ActiveOptimized) {
		t.Fatalf("a gateway started later reports %v", st)
	}
}
