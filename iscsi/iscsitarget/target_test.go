package iscsitarget

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/internal/waitfor"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/iscsi/text"
	"github.com/blockwire/blockwire/scsitarget"
)

const ini = "iqn.2026-11.org.blockwire:test-initiator"

func kv(k, v string) text.KV { return text.KV{Key: k, Value: v} }

func TestLoginWriteRead(t *testing.T) {
	ts := startServer(t, Options{}, nil)
	c := dial(t, ts.addr)
	_, keys := c.login(normalKeys(ini, kv("InitialR2T", "No"), kv("ImmediateData", "Yes"),
		kv("FirstBurstLength", "65536"), kv("MaxBurstLength", "65536"), kv("MaxOutstandingR2T", "2"))...)
	if keys["TargetPortalGroupTag"] != "1" || keys["MaxRecvDataSegmentLength"] != "262144" {
		t.Fatalf("declarations %v", keys)
	}
	if keys["InitialR2T"] != "No" || keys["MaxOutstandingR2T"] != "2" || keys["FirstBurstLength"] != "65536" {
		t.Fatalf("negotiation %v", keys)
	}
	// The new nexus first reports POWER ON, RESET (29/00).
	r := c.command(tur(), false, 0, nil, 0)
	if r.status != 2 || len(r.sense) < 14 || r.sense[12] != 0x29 {
		t.Fatalf("first TUR: status %d sense % x", r.status, r.sense)
	}
	if r = c.command(tur(), false, 0, nil, 0); r.status != 0 {
		t.Fatalf("second TUR status %d", r.status)
	}
	data := make([]byte, 256<<10)
	rand.Read(data)
	// 64 KiB immediate, then R2Ts (two outstanding) for the other 192 KiB.
	if r = c.command(write10(100, 512), false, uint32(len(data)), data, 65536); r.status != 0 {
		t.Fatalf("write status %d sense % x", r.status, r.sense)
	}
	r = c.command(read10(100, 512), true, uint32(len(data)), nil, 0)
	if r.status != 0 || !bytes.Equal(r.data, data) {
		t.Fatalf("read back: status %d, %d bytes, equal %v", r.status, len(r.data), bytes.Equal(r.data, data))
	}
	// 256 KiB with MaxBurstLength 64 KiB: four Data-In sequences (RFC 7143
	// §13.13).
	if r.seqs != 4 {
		t.Fatalf("read of 256 KiB came in %d Data-In sequences, want 4", r.seqs)
	}
	// Residual underflow: EDTL larger than the CDB's transfer.
	r = c.command(read10(0, 1), true, 4096, nil, 0)
	if r.status != 0 || !r.under || r.residual != 4096-512 || len(r.data) != 512 {
		t.Fatalf("underflow: %+v", r)
	}
	// Residual overflow: EDTL smaller.
	r = c.command(read10(0, 8), true, 1024, nil, 0)
	if r.status != 0 || !r.over || r.residual != 4096-1024 || len(r.data) != 1024 {
		t.Fatalf("overflow: %+v", r)
	}
}

func TestLoginFailures(t *testing.T) {
	ts := startServer(t, Options{}, func(tg *Target) { tg.Initiators = []string{ini} })
	cases := []struct {
		name string
		kvs  []text.KV
		want uint16
	}{
		{"unknown target", []text.KV{kv("InitiatorName", ini), kv("TargetName", "iqn.2026-11.org.blockwire:nope")}, pdu.LoginStatusNotFound},
		{"no initiator name", []text.KV{kv("TargetName", testIQN)}, pdu.LoginStatusMissingParameter},
		{"no target name", []text.KV{kv("InitiatorName", ini)}, pdu.LoginStatusMissingParameter},
		{"not in ACL", normalKeys("iqn.2026-11.org.example:stranger"), pdu.LoginStatusAuthorizationFail},
		{"bad session type", []text.KV{kv("InitiatorName", ini), kv("SessionType", "Weird")}, pdu.LoginStatusSessionTypeUnsupp},
		{"repeated key", normalKeys(ini, kv("MaxBurstLength", "512"), kv("MaxBurstLength", "1024")), pdu.LoginStatusInitiatorError},
		{"first burst above max burst", normalKeys(ini, kv("MaxBurstLength", "4096"), kv("FirstBurstLength", "8192")), pdu.LoginStatusInitiatorError},
	}
	for _, tc := range cases {
		c := dial(t, ts.addr)
		st, _ := c.login(tc.kvs...)
		if st != tc.want {
			t.Errorf("%s: status %04x, want %04x", tc.name, st, tc.want)
		}
		if _, _, ok := c.recv(2 * time.Second); ok {
			t.Errorf("%s: connection still open after a failed login", tc.name)
		}
	}
	if n := len(ts.srv.Sessions()); n != 0 {
		t.Fatalf("%d sessions after failed logins", n)
	}
	// A login whose TSIH names no session.
	c := dial(t, ts.addr)
	c.tsih = 77
	if st, _ := c.login(normalKeys(ini)...); st != pdu.LoginStatusSessionNotFound {
		t.Fatalf("unknown TSIH: %04x", st)
	}
	// Version 1 only.
	c = dial(t, ts.addr)
	req := pdu.LoginReq{Transit: true, CSG: 1, NSG: 3, VersionMax: 2, VersionMin: 1, ISID: c.isid}
	var h pdu.BHS
	req.Encode(&h)
	c.sendRaw(&h, nil, text.Append(nil, normalKeys(ini)...))
	rh, _ := c.must(2 * time.Second)
	if rh[36] != 2 || rh[37] != 5 {
		t.Fatalf("unsupported version status %02x%02x", rh[36], rh[37])
	}
}

func TestCHAPRequired(t *testing.T) {
	ts := startServer(t, Options{}, func(tg *Target) {
		tg.CHAP = nil
		tg.InitiatorCHAP = map[string]authCreds{ini: {User: "u", Secret: "secret-secret"}}
	})
	// Skipping the security stage when CHAP is required fails with 0201.
	c := dial(t, ts.addr)
	if st, _ := c.login(normalKeys(ini)...); st != pdu.LoginStatusAuthFailure {
		t.Fatalf("status %04x, want 0201", st)
	}
	// Other initiators need no authentication.
	c = dial(t, ts.addr)
	c.mustLogin(normalKeys("iqn.2026-11.org.example:other")...)
}

func TestRejectUnknownOpcodeSessionSurvives(t *testing.T) {
	ts := startServer(t, Options{}, nil)
	c := dial(t, ts.addr)
	c.mustLogin(normalKeys(ini)...)
	var h pdu.BHS
	h[0] = 0x1c // not an RFC 7143 opcode
	binary.BigEndian.PutUint32(h[16:], 99)
	c.sendRaw(&h, nil, nil)
	rh, data := c.must(2 * time.Second)
	if rh.Opcode() != pdu.OpReject || pdu.RejectReason(rh[2]) != pdu.RejectCommandNotSupported {
		t.Fatalf("got %s reason %#x", rh.Opcode(), rh[2])
	}
	if len(data) != 48 || data[0] != 0x1c {
		t.Fatalf("Reject does not carry the rejected header: % x", data)
	}
	// SNACK at ErrorRecoveryLevel 0: Reject, protocol error.
	sn := pdu.SNACKReq{Type: pdu.SNACKStatus, ITT: 5}
	sn.Encode(&h)
	c.sendRaw(&h, nil, nil)
	if rh, _ = c.must(2 * time.Second); rh.Opcode() != pdu.OpReject || pdu.RejectReason(rh[2]) != pdu.RejectProtocolError {
		t.Fatalf("SNACK answered with %s %#x", rh.Opcode(), rh[2])
	}
	c.command(tur(), false, 0, nil, 0) // unit attention
	if r := c.command(tur(), false, 0, nil, 0); r.status != 0 {
		t.Fatalf("TUR after Reject: %d", r.status)
	}
}

func TestOversizedSegmentDropsOnlyThatConnection(t *testing.T) {
	ts := startServer(t, Options{}, nil)
	good := dial(t, ts.addr)
	good.mustLogin(normalKeys(ini)...)
	bad := dial(t, ts.addr)
	bad.isid[5] = 2
	bad.mustLogin(normalKeys(ini)...)
	nop := pdu.NopOut{Immediate: true, ITT: 1, TTT: pdu.ReservedTTT}
	var h pdu.BHS
	nop.Encode(&h)
	bad.sendRaw(&h, nil, make([]byte, 262144+4))
	if _, _, ok := bad.recv(2 * time.Second); ok {
		t.Fatal("connection survived a data segment above MaxRecvDataSegmentLength")
	}
	good.command(tur(), false, 0, nil, 0)
	if r := good.command(tur(), false, 0, nil, 0); r.status != 0 {
		t.Fatalf("other session: TUR %d", r.status)
	}
}

func TestCmdSNWindow(t *testing.T) {
	ts := startServer(t, Options{CmdWindow: 4}, nil)
	c := dial(t, ts.addr)
	c.mustLogin(normalKeys(ini)...)
	c.command(tur(), false, 0, nil, 0)
	// A command far outside [ExpCmdSN, MaxCmdSN] is silently ignored
	// (RFC 7143 §4.2.2.1).
	saved := c.cmdSN
	c.cmdSN += 1000
	cmd := pdu.SCSICommand{Final: true, ITT: 500, CmdSN: c.cmdSN}
	var h pdu.BHS
	cmd.Encode(&h)
	c.sendRaw(&h, nil, nil)
	if _, _, ok := c.recv(300 * time.Millisecond); ok {
		t.Fatal("out-of-window command was answered")
	}
	c.cmdSN = saved
	c.nc.SetReadDeadline(time.Time{})
	if r := c.command(tur(), false, 0, nil, 0); r.status != 0 {
		t.Fatalf("in-window TUR: %d", r.status)
	}
	// A duplicate CmdSN is ignored too.
	c.cmdSN--
	cmd = pdu.SCSICommand{Final: true, ITT: 501, CmdSN: c.cmdSN}
	cmd.Encode(&h)
	c.sendRaw(&h, nil, nil)
	if _, _, ok := c.recv(300 * time.Millisecond); ok {
		t.Fatal("duplicate CmdSN was answered")
	}
}

// TestMCSOrdering logs in two connections to one session and checks that a
// command sent early on one connection waits for the lower CmdSN sent later
// on the other (RFC 7143 §4.2.2.1 ordering across connections).
func TestMCSOrdering(t *testing.T) {
	ts := startServer(t, Options{}, nil)
	a := dial(t, ts.addr)
	a.mustLogin(normalKeys(ini, kv("MaxConnections", "2"))...)
	a.command(tur(), false, 0, nil, 0)
	b := dial(t, ts.addr)
	b.tsih, b.cid, b.itt = a.tsih, 1, 1000
	b.cmdSN = a.cmdSN
	b.mustLogin(normalKeys(ini)...)
	if n := len(ts.srv.Sessions()[0].Conns); n != 2 {
		t.Fatalf("session has %d connections", n)
	}
	// b sends CmdSN n+1 first.
	cmd := pdu.SCSICommand{Final: true, ITT: 2000, CmdSN: a.cmdSN + 1}
	var h pdu.BHS
	cmd.Encode(&h)
	b.sendRaw(&h, nil, nil)
	if _, _, ok := b.recv(300 * time.Millisecond); ok {
		t.Fatal("CmdSN n+1 executed before CmdSN n arrived")
	}
	b.nc.SetReadDeadline(time.Time{})
	if r := a.command(tur(), false, 0, nil, 0); r.status != 0 {
		t.Fatalf("CmdSN n on connection a: %d", r.status)
	}
	rh, _ := b.must(2 * time.Second)
	if rh.Opcode() != pdu.OpSCSIResponse || rh.ITT() != 2000 {
		t.Fatalf("connection b got %s ITT %#x", rh.Opcode(), rh.ITT())
	}
	// A third connection exceeds MaxConnections=2.
	c3 := dial(t, ts.addr)
	c3.tsih, c3.cid = a.tsih, 2
	if st, _ := c3.login(normalKeys(ini)...); st != pdu.LoginStatusTooManyConnections {
		t.Fatalf("third connection: %04x", st)
	}
}

func TestAbortTaskWaitingForData(t *testing.T) {
	ts := startServer(t, Options{}, nil)
	c := dial(t, ts.addr)
	c.mustLogin(normalKeys(ini, kv("InitialR2T", "Yes"))...)
	c.command(tur(), false, 0, nil, 0)
	itt := c.itt
	c.itt++
	cmd := pdu.SCSICommand{Final: true, Write: true, ITT: itt, EDTL: 65536, CmdSN: c.cmdSN}
	c.cmdSN++
	copy(cmd.CDB[:], write10(0, 128))
	var h pdu.BHS
	cmd.Encode(&h)
	c.sendRaw(&h, nil, nil)
	rh, _ := c.must(2 * time.Second)
	if rh.Opcode() != pdu.OpR2T {
		t.Fatalf("got %s, want R2T", rh.Opcode())
	}
	tmf := pdu.TaskMgmtReq{Immediate: true, Function: pdu.TMFAbortTask, ITT: c.itt, RTT: itt, CmdSN: c.cmdSN, RefCmdSN: c.cmdSN - 1}
	c.itt++
	tmf.Encode(&h)
	c.sendRaw(&h, nil, nil)
	rh, _ = c.must(2 * time.Second)
	if rh.Opcode() != pdu.OpTaskMgmtResp || rh[2] != pdu.TMFRespComplete {
		t.Fatalf("got %s response %d", rh.Opcode(), rh[2])
	}
	// No SCSI Response may follow for the aborted task.
	if rh, _, ok := c.recv(300 * time.Millisecond); ok {
		t.Fatalf("aborted task answered with %s", rh.Opcode())
	}
	c.nc.SetReadDeadline(time.Time{})
	// Aborting a task that no longer exists.
	tmf = pdu.TaskMgmtReq{Immediate: true, Function: pdu.TMFAbortTask, ITT: c.itt, RTT: 0x777, CmdSN: c.cmdSN, RefCmdSN: c.cmdSN - 5}
	c.itt++
	tmf.Encode(&h)
	c.sendRaw(&h, nil, nil)
	if rh, _ = c.must(2 * time.Second); rh[2] != pdu.TMFRespNoTask {
		t.Fatalf("abort of unknown task: response %d", rh[2])
	}
	if r := c.command(tur(), false, 0, nil, 0); r.status != 0 {
		t.Fatalf("TUR after abort: %d", r.status)
	}
	// LOGICAL UNIT RESET, then the unit attention.
	tmf = pdu.TaskMgmtReq{Immediate: true, Function: pdu.TMFLUReset, ITT: c.itt, RTT: pdu.ReservedITT, CmdSN: c.cmdSN}
	c.itt++
	tmf.Encode(&h)
	c.sendRaw(&h, nil, nil)
	if rh, _ = c.must(2 * time.Second); rh.Opcode() != pdu.OpTaskMgmtResp || rh[2] != pdu.TMFRespComplete {
		t.Fatalf("LU reset response %d", rh[2])
	}
	if r := c.command(tur(), false, 0, nil, 0); r.status != 2 || r.sense[12] != 0x29 {
		t.Fatalf("after LU reset: %+v", r)
	}
}

// TestNopPingDropsSilentConnection: an idle connection is pinged every
// NopInterval; one that answers stays, one that does not is dropped
// NopTimeout after the ping (RFC 7143 §11.19). On the bubble's clock.
func TestNopPingDropsSilentConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval, timeout = 100 * time.Millisecond, 300 * time.Millisecond
		ts := startBubbleServer(t, Options{NopInterval: interval, NopTimeout: timeout})
		silent := ts.dial(t)
		silent.mustLogin(normalKeys(ini)...)
		silentSince := time.Now()
		answering := ts.dial(t)
		answering.isid[5] = 9
		answering.mustLogin(normalKeys(ini)...)
		// The silent connection reads nothing: the target's pings wait in
		// its buffer, and the target drops it.
		gone := make(chan time.Duration, 1)
		go func() {
			for len(ts.srv.Sessions()) == 2 && time.Since(silentSince) < 5*time.Second {
				time.Sleep(time.Millisecond)
			}
			gone <- time.Since(silentSince)
		}()
		pings := 0
		deadline := time.Now().Add(1500 * time.Millisecond)
		for time.Now().Before(deadline) {
			rh, _, ok := answering.recv(time.Until(deadline))
			if !ok {
				break
			}
			if rh.Opcode() == pdu.OpNopIn && rh.ITT() == pdu.ReservedITT {
				pings++
				answering.pong(rh)
			}
		}
		if pings < 5 {
			t.Fatalf("%d pings in 1.5s with a %v interval", pings, interval)
		}
		// Pinged at the first tick after an interval of silence (the
		// interval and at most a tick), dropped at the first tick after
		// the timeout: 500 ms here, on the bubble's clock to the
		// millisecond the watcher above polls at.
		if d := <-gone; d < interval+timeout || d > 2*interval+timeout+2*time.Millisecond {
			t.Errorf("silent connection dropped %v after its login: want the interval, at most a tick and the NOP timeout (%v to %v)", d, interval+timeout, 2*interval+timeout)
		}
		for {
			rh, _, ok := silent.recv(time.Second)
			if !ok {
				break
			}
			if rh.Opcode() != pdu.OpNopIn {
				t.Fatalf("silent connection got %s", rh.Opcode())
			}
		}
		answering.nc.SetReadDeadline(time.Time{})
		answering.command(tur(), false, 0, nil, 0)
		if r := answering.command(tur(), false, 0, nil, 0); r.status != 0 {
			t.Fatalf("answering connection: %d", r.status)
		}
	})
}

// A connection that keeps talking is not pinged: every PDU it sends
// counts as heard, whichever of the pinger's ticks it falls between.
func TestBusyConnectionIsNotPinged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startBubbleServer(t, Options{NopInterval: 100 * time.Millisecond, NopTimeout: 300 * time.Millisecond})
		c := ts.dial(t)
		c.mustLogin(normalKeys(ini)...)
		pings := 0
		for end := time.Now().Add(time.Second); time.Now().Before(end); {
			itt := c.itt
			c.itt++
			sendCommand(c, itt, tur(), false, false, 0)
			for {
				rh, _ := c.must(5 * time.Second)
				if rh.Opcode() == pdu.OpNopIn && rh.ITT() == pdu.ReservedITT {
					pings++
					continue
				}
				if rh.Opcode() != pdu.OpSCSIResponse || rh.ITT() != itt {
					t.Fatalf("got %s (ITT %#x) waiting for the response to %#x", rh.Opcode(), rh.ITT(), itt)
				}
				break
			}
			time.Sleep(90 * time.Millisecond)
		}
		if pings != 0 {
			t.Fatalf("%d pings in 1 s on a connection that sent a command every 90 ms (interval 100 ms)", pings)
		}
		// Silent from now on: pinged within the interval and a tick.
		silence := time.Now()
		rh, _, ok := c.recv(time.Second)
		if !ok || rh.Opcode() != pdu.OpNopIn || rh.ITT() != pdu.ReservedITT {
			t.Fatalf("no ping within 1 s of silence: %v %s", ok, rh.Opcode())
		}
		if d := time.Since(silence); d > 200*time.Millisecond {
			t.Fatalf("pinged %v into the silence, interval 100 ms", d)
		}
	})
}

func TestSessionReinstatement(t *testing.T) {
	ts := startServer(t, Options{}, nil)
	old := dial(t, ts.addr)
	old.mustLogin(normalKeys(ini)...)
	oldTSIH := old.tsih
	fresh := dial(t, ts.addr) // same ISID, TSIH 0
	fresh.mustLogin(normalKeys(ini)...)
	if fresh.tsih == oldTSIH {
		t.Fatal("reinstated session kept its TSIH")
	}
	if _, _, ok := old.recv(2 * time.Second); ok {
		t.Fatal("old session's connection survived reinstatement")
	}
	fresh.command(tur(), false, 0, nil, 0)
	if r := fresh.command(tur(), false, 0, nil, 0); r.status != 0 {
		t.Fatalf("new session TUR: %d", r.status)
	}
	waitfor.True(t, 2*time.Second, func() bool { return len(ts.srv.Sessions()) == 1 }, func() string {
		return fmt.Sprintf("%d sessions after reinstatement", len(ts.srv.Sessions()))
	})
}

func TestShutdownAsksForLogout(t *testing.T) {
	ts := startServer(t, Options{LogoutWait: 3 * time.Second}, nil)
	c := dial(t, ts.addr)
	c.mustLogin(normalKeys(ini)...)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := contextWithTimeout(5 * time.Second)
		defer cancel()
		done <- ts.srv.Shutdown(ctx)
	}()
	rh, _ := c.must(2 * time.Second)
	if rh.Opcode() != pdu.OpAsyncMsg || rh[36] != pdu.AsyncLogoutRequest {
		t.Fatalf("got %s event %d, want Async Message event 1", rh.Opcode(), rh[36])
	}
	lo := pdu.LogoutReq{Immediate: true, Reason: pdu.LogoutCloseSession, ITT: c.itt, CmdSN: c.cmdSN}
	var h pdu.BHS
	lo.Encode(&h)
	c.sendRaw(&h, nil, nil)
	if rh, _ = c.must(2 * time.Second); rh.Opcode() != pdu.OpLogoutResp || rh[2] != 0 {
		t.Fatalf("got %s response %d", rh.Opcode(), rh[2])
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Shutdown still waiting after the initiator logged out")
	}
	// No new connections are accepted.
	if _, err := dialErr(ts.addr); err == nil {
		t.Fatal("listener still accepting after Shutdown")
	}
}

func TestSendTargetsContinuation(t *testing.T) {
	ts := startServer(t, Options{}, nil)
	for i := range 40 {
		dev := scsitarget.NewDevice(fmt.Sprintf("iqn.2026-11.org.blockwire:extra-target-with-a-long-name-%03d", i), nil)
		be, _ := mem.New(1 << 20)
		lu, _ := scsitarget.NewLU(dev.Name(), scsitarget.LUConfig{Backend: be})
		dev.AddLU(lu)
		ts.srv.AddTarget(&Target{Name: dev.Name(), Device: dev})
	}
	c := dial(t, ts.addr)
	c.mustLogin(kv("InitiatorName", ini), kv("SessionType", "Discovery"), kv("MaxRecvDataSegmentLength", "512"))
	req := pdu.TextReq{Immediate: true, Final: true, ITT: 1, TTT: pdu.ReservedTTT, CmdSN: c.cmdSN}
	var h pdu.BHS
	req.Encode(&h)
	c.sendRaw(&h, nil, text.Append(nil, kv("SendTargets", "All")))
	var all []byte
	chunks := 0
	for {
		rh, data := c.must(2 * time.Second)
		var r pdu.TextResp
		if err := r.Decode(&rh); err != nil || rh.Opcode() != pdu.OpTextResp {
			t.Fatalf("%s: %v", rh.Opcode(), err)
		}
		if len(data) > 512 {
			t.Fatalf("text response segment of %d bytes above the declared 512", len(data))
		}
		all = append(all, data...)
		chunks++
		if r.Final {
			break
		}
		next := pdu.TextReq{Immediate: true, Final: true, ITT: 1, TTT: r.TTT, CmdSN: c.cmdSN}
		next.Encode(&h)
		c.sendRaw(&h, nil, nil)
	}
	kvs, err := text.Parse(all)
	if err != nil {
		t.Fatal(err)
	}
	names := 0
	for _, p := range kvs {
		if p.Key == "TargetName" {
			names++
		}
		if p.Key == "TargetAddress" && !strings.HasSuffix(p.Value, ",1") {
			t.Errorf("TargetAddress %q lacks the portal group tag", p.Value)
		}
	}
	if names != 41 || chunks < 2 {
		t.Fatalf("%d targets in %d chunks", names, chunks)
	}
	// SCSI commands are not allowed in a discovery session.
	cmd := pdu.SCSICommand{Final: true, ITT: 9, CmdSN: c.cmdSN}
	cmd.Encode(&h)
	c.sendRaw(&h, nil, nil)
	if rh, _ := c.must(2 * time.Second); rh.Opcode() != pdu.OpReject {
		t.Fatalf("SCSI command in discovery: %s", rh.Opcode())
	}
}

func TestDigests(t *testing.T) {
	ts := startServer(t, Options{}, nil)
	c := dial(t, ts.addr)
	_, keys := c.login(normalKeys(ini, kv("HeaderDigest", "CRC32C,None"), kv("DataDigest", "CRC32C"))...)
	if keys["HeaderDigest"] != "CRC32C" || keys["DataDigest"] != "CRC32C" {
		t.Fatalf("digests not accepted: %v", keys)
	}
	c.hd, c.dd = true, true
	c.command(tur(), false, 0, nil, 0)
	data := make([]byte, 8192)
	rand.Read(data)
	if r := c.command(write10(8, 16), false, 8192, data, 8192); r.status != 0 {
		t.Fatalf("write with digests: %d", r.status)
	}
	if r := c.command(read10(8, 16), true, 8192, nil, 0); !bytes.Equal(r.data, data) {
		t.Fatal("read back with digests differs")
	}
	// A data digest error: Reject reason 0x02, the command is discarded.
	c.badDD = true
	cmd := pdu.SCSICommand{Final: true, Write: true, ITT: 0x4000, EDTL: 512, CmdSN: c.cmdSN}
	copy(cmd.CDB[:], write10(0, 1))
	var h pdu.BHS
	cmd.Encode(&h)
	c.sendRaw(&h, nil, data[:512])
	rh, _ := c.must(2 * time.Second)
	if rh.Opcode() != pdu.OpReject || pdu.RejectReason(rh[2]) != pdu.RejectDataDigest {
		t.Fatalf("bad data digest answered with %s %#x", rh.Opcode(), rh[2])
	}
	// A header digest error drops the connection (ERL 0).
	cmd = pdu.SCSICommand{Final: true, ITT: 0x4001, CmdSN: c.cmdSN}
	cmd.Encode(&h)
	h.SetDataSegmentLength(0)
	raw := append(h[:], 0, 0, 0, 0)
	c.nc.Write(raw)
	if _, _, ok := c.recv(2 * time.Second); ok {
		t.Fatal("connection survived a header digest error")
	}
}

// TestUnsolicitedDataOut sends immediate data, then unsolicited Data-Out up
// to FirstBurstLength (InitialR2T=No, F=0 on the command), then answers the
// R2Ts for the rest (RFC 7143 §13.10, §13.14).
func TestUnsolicitedDataOut(t *testing.T) {
	ts := startServer(t, Options{}, nil)
	c := dial(t, ts.addr)
	c.mustLogin(normalKeys(ini, kv("InitialR2T", "No"), kv("FirstBurstLength", "32768"), kv("MaxBurstLength", "65536"))...)
	c.command(tur(), false, 0, nil, 0)
	data := make([]byte, 128<<10)
	rand.Read(data)
	itt := c.itt
	c.itt++
	cmd := pdu.SCSICommand{Final: false, Write: true, ITT: itt, EDTL: uint32(len(data)), CmdSN: c.cmdSN}
	c.cmdSN++
	copy(cmd.CDB[:], write10(64, 256))
	var h pdu.BHS
	cmd.Encode(&h)
	c.sendRaw(&h, nil, data[:8192])
	for off, sn := 8192, uint32(0); off < 32768; off, sn = off+8192, sn+1 {
		do := pdu.DataOut{Final: off+8192 == 32768, ITT: itt, TTT: pdu.ReservedTTT, DataSN: sn, Offset: uint32(off)}
		do.Encode(&h)
		c.sendRaw(&h, nil, data[off:off+8192])
	}
	got := uint32(32768)
	for {
		rh, _ := c.must(5 * time.Second)
		if rh.Opcode() == pdu.OpSCSIResponse {
			if rh[3] != 0 {
				t.Fatalf("write status %#x", rh[3])
			}
			break
		}
		if rh.Opcode() != pdu.OpR2T {
			t.Fatalf("got %s", rh.Opcode())
		}
		var r pdu.R2T
		r.Decode(&rh)
		if r.Offset != got || r.Desired > 65536 {
			t.Fatalf("R2T offset %d desired %d; want offset %d and at most MaxBurstLength", r.Offset, r.Desired, got)
		}
		do := pdu.DataOut{Final: true, ITT: itt, TTT: r.TTT, Offset: r.Offset}
		do.Encode(&h)
		c.sendRaw(&h, nil, data[r.Offset:r.Offset+r.Desired])
		got += r.Desired
	}
	if r := c.command(read10(64, 256), true, uint32(len(data)), nil, 0); !bytes.Equal(r.data, data) {
		t.Fatal("read back differs")
	}
	// Unsolicited data past FirstBurstLength is a protocol error: Reject.
	itt = c.itt
	c.itt++
	cmd = pdu.SCSICommand{Write: true, ITT: itt, EDTL: 65536, CmdSN: c.cmdSN}
	c.cmdSN++
	copy(cmd.CDB[:], write10(0, 128))
	cmd.Encode(&h)
	c.sendRaw(&h, nil, nil)
	do := pdu.DataOut{Final: true, ITT: itt, TTT: pdu.ReservedTTT, Offset: 32768}
	do.Encode(&h)
	c.sendRaw(&h, nil, data[:512])
	if rh, _ := c.must(2 * time.Second); rh.Opcode() != pdu.OpReject || pdu.RejectReason(rh[2]) != pdu.RejectProtocolError {
		t.Fatalf("Data-Out past FirstBurstLength answered with %s %#x", rh.Opcode(), rh[2])
	}
}

func TestTargetColdResetDropsSessions(t *testing.T) {
	ts := startServer(t, Options{}, func(tg *Target) { tg.AnyTargetReset = true })
	a := dial(t, ts.addr)
	a.mustLogin(normalKeys(ini)...)
	b := dial(t, ts.addr)
	b.isid[5] = 3
	b.mustLogin(normalKeys(ini)...)
	tmf := pdu.TaskMgmtReq{Immediate: true, Function: pdu.TMFTargetColdReset, ITT: a.itt, RTT: pdu.ReservedITT, CmdSN: a.cmdSN}
	var h pdu.BHS
	tmf.Encode(&h)
	a.sendRaw(&h, nil, nil)
	if rh, _ := a.must(2 * time.Second); rh.Opcode() != pdu.OpTaskMgmtResp || rh[2] != pdu.TMFRespComplete {
		t.Fatalf("cold reset response %s %d", rh.Opcode(), rh[2])
	}
	for _, c := range []*tclient{a, b} {
		if _, _, ok := c.recv(2 * time.Second); ok {
			t.Fatal("a connection survived TARGET COLD RESET")
		}
	}
}

// TestLoginTimeout: a connection whose login has not finished within
// LoginTimeout is dropped then, not before; one logged in is not.
func TestLoginTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 200 * time.Millisecond
		ts := startBubbleServer(t, Options{LoginTimeout: timeout})
		c := ts.dial(t)
		start := time.Now()
		if _, _, ok := c.recv(3 * time.Second); ok {
			t.Fatal("got a PDU without logging in")
		}
		if el := time.Since(start); el < timeout || el > timeout+50*time.Millisecond {
			t.Fatalf("silent connection dropped after %v, timeout %v", el, timeout)
		}
		// A login that completes in time is not affected.
		c = ts.dial(t)
		c.mustLogin(normalKeys(ini)...)
		time.Sleep(2 * timeout)
		c.command(tur(), false, 0, nil, 0)
		if r := c.command(tur(), false, 0, nil, 0); r.status != 0 {
			t.Fatalf("TUR after the login timeout elapsed: %d", r.status)
		}
	})
}

// TestOneWayNopOut: a NOP-Out with ITT and TTT both 0xffffffff only
// confirms ExpStatSN (RFC 7143 §11.18.1); it gets no answer and no Reject.
func TestOneWayNopOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startBubbleServer(t, Options{})
		c := ts.dial(t)
		c.mustLogin(normalKeys(ini)...)
		c.command(tur(), false, 0, nil, 0) // unit attention
		nop := pdu.NopOut{Immediate: true, ITT: pdu.ReservedITT, TTT: pdu.ReservedTTT, CmdSN: c.cmdSN}
		var h pdu.BHS
		nop.Encode(&h)
		c.sendRaw(&h, nil, nil)
		// Everything the target would do with it is done once the
		// bubble is idle: an answer would be buffered by then.
		synctest.Wait()
		if rh, _, ok := c.recv(time.Millisecond); ok {
			t.Fatalf("one-way NOP-Out answered with %v", rh.Opcode())
		}
		c.nc.SetReadDeadline(time.Time{})
		if r := c.command(tur(), false, 0, nil, 0); r.status != 0 {
			t.Fatalf("TUR after a one-way NOP-Out: %d", r.status)
		}
	})
}

// TestMaxSessions: a login beyond the session limit fails with "out of
// resources" (RFC 7143 §11.13.5); reinstating an existing session still
// works at the limit, and a slot freed by a logout is usable again.
func TestMaxSessions(t *testing.T) {
	ts := startServer(t, Options{MaxSessions: 2}, nil)
	cs := ts.sessions(t, 2, normalKeys(ini))
	ts.refused(t, 9, normalKeys(ini), "third session")
	// Same ISID as the first session: reinstatement, allowed at the limit.
	again := dial(t, ts.addr)
	again.isid[5] = 1
	again.mustLogin(normalKeys(ini)...)
	again.command(tur(), false, 0, nil, 0)
	if r := again.command(tur(), false, 0, nil, 0); r.status != 0 {
		t.Fatalf("reinstated session: TUR %d", r.status)
	}
	if r := cs[1].command(tur(), false, 0, nil, 0); r.status != 0 && r.status != 2 {
		t.Fatalf("second session: TUR %d", r.status)
	}
}
