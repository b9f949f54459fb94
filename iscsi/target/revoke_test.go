package target

import (
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/blockwire/blockwire/iscsi/auth"
)

// TestAccessChangesReachLiveSessions: UpdateTarget applies to sessions
// already logged in, not only to logins from now on. An initiator dropped
// from the ACL, one whose from no longer admits its address, one whose
// view of the LUNs changed and one whose CHAP secret changed each lose
// their session (the last two log in again under the new rules); an
// initiator the change does not touch keeps its session.
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
	for _, name := range []string{gone, moved, mapped} {
		if !closedBy(cs[name], 3*time.Second) {
			t.Errorf("%s kept its session after the change that concerns it", name)
		}
	}
	if r := cs[stays].command(tur(), false, 0, nil, 0); r.status != 0 {
		t.Errorf("the initiator the change does not touch: status %d", r.status)
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
