package iscsitarget

import (
	"net"
	"testing"
	"time"

	"github.com/blockwire/blockwire/internal/servetest"
	"github.com/blockwire/blockwire/iscsi/pdu"
)

// TestStalledConnectionOfAnMCSSession: one connection of a two-connection
// session stops reading while the target has answers for it (pings with
// 64 KiB of data each). Its sends block; nothing else may: the session's
// other connection and another session keep getting answers at once (no
// datamover I/O under the session lock), and the stalled connection is
// dropped once a send has moved under 64 KiB in the NOP timeout — which at
// ErrorRecoveryLevel 0 ends its session (RFC 7143 §7.1.4) and nothing
// else.
func TestStalledConnectionOfAnMCSSession(t *testing.T) {
	const nopTimeout = 2 * time.Second
	var logs servetest.LogBuffer
	ts := startServerLog(t, Options{NopInterval: -1, NopTimeout: nopTimeout}, nil, &logs)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("target log:\n%s", logs.String())
		}
	})
	a := dial(t, ts.addr)
	a.nc.(*net.TCPConn).SetReadBuffer(4096)
	a.mustLogin(normalKeys(ini, kv("MaxConnections", "2"))...)
	a.command(tur(), false, 0, nil, 0) // the unit attention
	b := dial(t, ts.addr)
	b.tsih, b.cid, b.itt = a.tsih, 1, 1000
	b.cmdSN = a.cmdSN
	b.mustLogin(normalKeys(ini)...)
	other := dial(t, ts.addr)
	other.isid[5] = 9
	other.mustLogin(normalKeys(ini + "-other")...)
	other.command(tur(), false, 0, nil, 0)

	// Connection a asks for 16 MiB of ping answers and reads none.
	ping := make([]byte, 64<<10)
	var raw []byte
	for i := range 256 {
		nop := pdu.NopOut{Immediate: true, ITT: uint32(5000 + i), TTT: pdu.ReservedTTT, CmdSN: a.cmdSN, ExpStatSN: a.expStatSN}
		var h pdu.BHS
		nop.Encode(&h)
		h.SetDataSegmentLength(len(ping))
		raw = append(append(raw, h[:]...), ping...)
	}
	go a.nc.Write(raw) // blocks once the target stops reading a; fails when a is dropped
	time.Sleep(500 * time.Millisecond)

	start := time.Now()
	for i := range 5 {
		b.cmdSN = a.cmdSN + uint32(i)
		if r := b.command(tur(), false, 0, nil, 0); r.status != 0 {
			t.Fatalf("connection b: status %#x\n%s", r.status, logs.String())
		}
		if r := other.command(tur(), false, 0, nil, 0); r.status != 0 {
			t.Fatalf("the other session: status %#x", r.status)
		}
	}
	if d := time.Since(start); d > nopTimeout/4 {
		t.Fatalf("5 commands on the session's other connection took %v while connection a was stalled (the NOP timeout is %v): a blocked send held them up", d, nopTimeout)
	}

	// The stalled connection goes once a stretch of the NOP timeout has
	// moved less than sendguard.MinProgress; with it its session, at ERL
	// 0. The other session stays and works. The first stretch takes what
	// the socket's buffers hold (62,560 bytes, under the least), so the
	// drop comes after one NOP timeout (2.1 s here). It used to be any
	// byte: a stretch that moved some got a fresh deadline, and under
	// CI's load the kernel took a few bytes in later stretches too (the
	// session was still there after 10 s, 2026-11-27).
	deadline := time.Now().Add(5 * nopTimeout)
	for len(ts.srv.Sessions()) != 1 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if ss := ts.srv.Sessions(); len(ss) != 1 || ss[0].Initiator != ini+"-other" {
		t.Fatalf("%v after the stall: want only the other session: %+v", 5*nopTimeout, ss)
	}
	if r := other.command(tur(), false, 0, nil, 0); r.status != 0 {
		t.Fatalf("the other session after the drop: status %#x", r.status)
	}
}
