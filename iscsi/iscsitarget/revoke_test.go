package iscsitarget

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/blockwire/blockwire/iscsi/auth"
	"github.com/blockwire/blockwire/scsi"
)

// TestAccessChangesReachLiveSessions: UpdateTarget applies to sessions
// already logged in, not only to logins from now on. An initiator dropped
// from the ACL, one whose from no longer admits its address and one whose
// CHAP secret changed each lose their session (the last logs in again
// under the new rules); one whose view of the LUNs changed keeps its
// session and sees the new view at once, told by REPORTED LUNS DATA HAS
// CHANGED; an initiator the change does not touch keeps its session and
// is told nothing.
func TestAccessChangesReachLiveSessions(t *testing.T) {
	const (
		stays  = "iqn.2026-11.org.example:stays"
		gone   = "iqn.2026-11.org.example:gone"
		moved  = "iqn.2026-11.org.example:moved"
		mapped = "iqn.2026-11.org.example:mapped"
	)
	base := func() *Target {
		return &Target{Name: testIQN, Initiators: []string{stays, gone, moved, mapped}}
	}
	ts := startServer(t, Options{NopInterval: -1}, func(tg *Target) { tg.Initiators = base().Initiators })
	login := func(name string, isid byte) *tclient {
		c := dial(t, ts.addr)
		c.isid[5] = isid
		c.mustLogin(normalKeys(name)...)
		c.command(tur(), false, 0, nil, 0) // the power-on unit attention
		return c
	}
	cs := map[string]*tclient{stays: login(stays, 1), gone: login(gone, 2), moved: login(moved, 3), mapped: login(mapped, 4)}

	nt := base()
	nt.Initiators = []string{stays, moved, mapped} // gone is removed
	nt.Sources = map[string][]netip.Prefix{moved: {netip.MustParsePrefix("192.0.2.0/24")}}
	nt.LUNMaps = map[string]map[uint64]uint64{mapped: {5: 0}}
	if err := ts.srv.UpdateTarget(nt); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{gone, moved} {
		if !closedBy(cs[name], 3*time.Second) {
			t.Errorf("%s kept its session after the change that concerns it", name)
		}
	}
	if r := cs[stays].command(tur(), false, 0, nil, 0); r.status != 0 {
		t.Errorf("the initiator the change does not touch: status %d", r.status)
	}
	// The remapped initiator reaches the LU as LUN 5 now, and LUN 0 is
	// gone for it; its first command hears of the change.
	m := cs[mapped]
	m.lun = 5
	if r := m.command(tur(), false, 0, nil, 0); r.status != scsi.StatusCheckCondition || len(r.sense) < 14 || r.sense[12] != 0x3f || r.sense[13] != 0x0e {
		t.Fatalf("the remapped initiator's first command: status %#x sense % x, want REPORTED LUNS DATA HAS CHANGED", r.status, r.sense)
	}
	if r := m.command(tur(), false, 0, nil, 0); r.status != 0 {
		t.Errorf("TEST UNIT READY on its new LUN 5: status %#x sense % x", r.status, r.sense)
	}
	r := m.command([]byte{0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}, true, 256, nil, 0)
	five := scsi.EncodeLUN(5)
	if want := append([]byte{0, 0, 0, 8, 0, 0, 0, 0}, five[:]...); r.status != 0 || !bytes.Equal(r.data, want) {
		t.Errorf("REPORT LUNS after the remap: status %#x data % x, want % x", r.status, r.data, want)
	}
	m.lun = 0
	if r := m.command(tur(), false, 0, nil, 0); r.status != scsi.StatusCheckCondition || len(r.sense) < 14 || r.sense[12] != 0x25 {
		t.Errorf("LUN 0, no longer in its view: status %#x sense % x, want LOGICAL UNIT NOT SUPPORTED", r.status, r.sense)
	}

	// A CHAP secret changed: the session proved the old one.
	nt2 := base()
	nt2.Initiators = []string{stays}
	nt2.InitiatorCHAP = map[string]auth.Credentials{stays: {User: "u", Secret: "a-new-secret-0123"}}
	if err := ts.srv.UpdateTarget(nt2); err != nil {
		t.Fatal(err)
	}
	if !closedBy(cs[stays], 3*time.Second) {
		t.Error("a session kept working after its initiator's CHAP secret changed")
	}
}

// closedBy reports whether the target closes c's connection within d (a
// read ends in EOF or a reset, not in the deadline).
func closedBy(c *tclient, d time.Duration) bool {
	c.nc.SetReadDeadline(time.Now().Add(d))
	defer c.nc.SetReadDeadline(time.Time{})
	buf := make([]byte, 4096)
	for {
		if _, err := c.nc.Read(buf); err != nil {
			var ne net.Error
			return !(errors.As(err, &ne) && ne.Timeout())
		}
	}
}
