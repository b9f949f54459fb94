package iscsitarget

import (
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/internal/waitfor"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/scsitarget"
)

// connCount is the number of connections the server still runs.
func connCount(ts *testServer) int {
	ts.srv.mu.Lock()
	defer ts.srv.mu.Unlock()
	return len(ts.srv.conns)
}

// waitConns waits up to d for the server to run n connections, and
// reports whether it came to that.
func waitConns(ts *testServer, n int, d time.Duration) bool {
	return waitfor.Within(d, func() bool { return connCount(ts) == n })
}

// TestConnectionEndsAfterItsTaskManagement: a connection that dropped
// while a LOGICAL UNIT RESET it sent was still waiting — for a read of
// another session, held in the storage — ends only once that reset has.
// It used to end at once, the reset running on with nothing to show for
// it: Shutdown could return under it, and a session logged in meanwhile
// could have its commands aborted by a connection already gone (the
// rare hang of FuzzTargetConnection).
func TestConnectionEndsAfterItsTaskManagement(t *testing.T) {
	d, _ := mem.New(1 << 20)
	g := &gatedDisk{Disk: d, gate: make(chan struct{}), entered: make(chan struct{})}
	ts := startServer(t, Options{NopInterval: -1}, onLU(t, scsitarget.LUConfig{Backend: g}))
	t.Cleanup(func() {
		select {
		case <-g.gate:
		default:
			close(g.gate)
		}
	})
	// Session B: a read that the storage holds.
	b := dial(t, ts.addr)
	b.isid[5] = 0x42
	b.mustLogin(normalKeys(ini)...)
	b.command(tur(), false, 0, nil, 0) // the power-on unit attention
	sendCDB(b, 99, read10(0, 1), false, 512)
	<-g.entered

	// Session A: a LOGICAL UNIT RESET, which waits for B's read; then A
	// drops its connection.
	a := dial(t, ts.addr)
	a.mustLogin(normalKeys(ini)...)
	var h pdu.BHS
	(&pdu.TaskMgmtReq{Immediate: true, Function: pdu.TMFLUReset, ITT: 7, RTT: pdu.ReservedITT,
		CmdSN: a.cmdSN, ExpStatSN: a.expStatSN}).Encode(&h)
	a.sendRaw(&h, nil, nil)
	time.Sleep(100 * time.Millisecond) // the reset is under way
	a.nc.Close()
	if waitConns(ts, 1, 300*time.Millisecond) {
		t.Fatal("the connection ended while the reset it sent was still running")
	}
	close(g.gate)
	if !waitConns(ts, 1, 5*time.Second) {
		t.Fatalf("%d connections 5 s after the reset could end, want 1 (B's)", connCount(ts))
	}
}
