package iscsitarget

import (
	"testing"
	"time"

	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/scsi"
)

// tmf sends one task management function on lun and returns the response
// code.
func tmf(t *testing.T, c *tclient, fn byte, lun uint64) byte {
	t.Helper()
	req := pdu.TaskMgmtReq{Immediate: true, Function: fn, LUN: scsi.EncodeLUN(lun), ITT: c.itt, RTT: pdu.ReservedITT, CmdSN: c.cmdSN}
	c.itt++
	var h pdu.BHS
	req.Encode(&h)
	c.sendRaw(&h, nil, nil)
	rh, _ := c.must(2 * time.Second)
	if rh.Opcode() != pdu.OpTaskMgmtResp {
		t.Fatalf("TMF %d: answered %s", fn, rh.Opcode())
	}
	return rh[2]
}

// TestTaskManagementThroughTheLUNMap: LU RESET and ABORT TASK SET name a
// LUN as the initiator sees it: with the device's LUN 0 mapped as its LUN
// 3, LUN 3 is reset and LUN 0 does not exist (it used to be the other way
// round, and Linux then escalated to a target reset).
func TestTaskManagementThroughTheLUNMap(t *testing.T) {
	ts := startServer(t, Options{}, func(tg *Target) { tg.LUNMaps = map[string]map[uint64]uint64{ini: {3: 0}} })
	c := dial(t, ts.addr)
	c.mustLogin(normalKeys(ini)...)
	for _, fn := range []byte{pdu.TMFLUReset, pdu.TMFAbortTaskSet} {
		if r := tmf(t, c, fn, 3); r != pdu.TMFRespComplete {
			t.Errorf("TMF %d on the initiator's LUN 3: response %d, want complete", fn, r)
		}
		if r := tmf(t, c, fn, 0); r != pdu.TMFRespNoLUN {
			t.Errorf("TMF %d on LUN 0, which it does not see: response %d, want LUN does not exist", fn, r)
		}
	}
}

// TestTargetResetNeedsAuthorization: TARGET WARM RESET and TARGET COLD
// RESET reach every LU and every initiator of the target, so only an
// initiator allowed them may (Target.TargetResets): others get "function
// authorization failed" and nothing happens — the other session keeps
// working, no reset unit attention; an allowed initiator's reset runs.
func TestTargetResetNeedsAuthorization(t *testing.T) {
	const boss = "iqn.2026-11.org.example:boss"
	ts := startServer(t, Options{}, func(tg *Target) { tg.TargetResets = []string{boss} })
	a := dial(t, ts.addr)
	a.mustLogin(normalKeys(ini)...)
	b := dial(t, ts.addr)
	b.isid[5] = 3
	b.mustLogin(normalKeys(ini)...)
	b.command(tur(), false, 0, nil, 0) // the power-on unit attention
	for _, fn := range []byte{pdu.TMFTargetWarmReset, pdu.TMFTargetColdReset} {
		if r := tmf(t, a, fn, 0); r != pdu.TMFRespAuthFailed {
			t.Errorf("TMF %d from an initiator not allowed it: response %d, want function authorization failed", fn, r)
		}
	}
	if r := b.command(tur(), false, 0, nil, 0); r.status != 0 {
		t.Fatalf("the other session after refused target resets: status %d, sense % x", r.status, r.sense)
	}
	x := dial(t, ts.addr)
	x.mustLogin(normalKeys(boss)...)
	if r := tmf(t, x, pdu.TMFTargetWarmReset, 0); r != pdu.TMFRespComplete {
		t.Fatalf("TARGET WARM RESET from an initiator allowed it: response %d", r)
	}
	if r := b.command(tur(), false, 0, nil, 0); r.status != 2 || r.sense[12] != 0x29 {
		t.Fatalf("after an allowed target reset: %+v, want the reset unit attention", r)
	}
	// Allowed later, on a session already logged in: at once.
	if err := ts.srv.UpdateTarget(&Target{Name: testIQN, TargetResets: []string{boss, ini}}); err != nil {
		t.Fatal(err)
	}
	if r := tmf(t, a, pdu.TMFTargetWarmReset, 0); r != pdu.TMFRespComplete {
		t.Fatalf("TARGET WARM RESET once the ACL allows it: response %d", r)
	}
	if r := b.command(tur(), false, 0, nil, 0); r.status != 2 || r.sense[12] != 0x29 {
		t.Fatalf("after an allowed target reset: %+v, want the reset unit attention", r)
	}
}
