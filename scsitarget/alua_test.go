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

	if err := d.SetPortGroups([]PortGroup{{1, ActiveOptimized}, {2, Standby}}); err != nil {
		t.Fatal(err)
	}
	n2 := nexus(d, "iqn.i,i,0x1", "iqn.t,t,0x2")
	n2.RelativePort = 2
	good(t, run(d, n1, []byte{scsi.OpInquiry, 0, 0, 0, 96, 0}, inq))
	if inq[5]&0x30 != 0x10 {
		t.Fatalf("TPGS %#x, want implicit (01b)", inq[5]&0x30)
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
	// Standby: media access is NOT READY 04/0B through port 2, fine
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
		if _, err := ParsePortGroup(bad); err == nil {
			t.Errorf("ParsePortGroup(%q) accepted", bad)
		}
	}
	if g, err := ParsePortGroup("2=active-non-optimized"); err != nil || g != (PortGroup{2, ActiveNonOptimized}) {
		t.Errorf("ParsePortGroup: %+v %v", g, err)
	}
	if d.SetPortGroups([]PortGroup{{1, Standby}, {1, Standby}}) == nil {
		t.Error("duplicate group accepted")
	}
}
