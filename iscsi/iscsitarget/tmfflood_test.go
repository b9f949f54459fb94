package iscsitarget

import (
	"log/slog"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/internal/servetest"
	"github.com/blockwire/blockwire/iscsi/pdu"
)

// TestBackgroundRequestFloodIsBounded: an initiator that sends immediate
// task management requests, or Logouts of a connection it does not have,
// and never reads the answers makes the target hold a bounded number of
// them, not a goroutine per request; the requests beyond the bound are
// answered at once, refused.
func TestBackgroundRequestFloodIsBounded(t *testing.T) {
	const n = 200000 // 9.6 MB of answers: more than the sockets hold
	t.Run("task management", func(t *testing.T) {
		testBackgroundFlood(t, func(c *tclient, i int, h *pdu.BHS) {
			(&pdu.TaskMgmtReq{Immediate: true, Function: pdu.TMFAbortTask, ITT: uint32(0x10000 + i), RTT: 0x7fffffff,
				CmdSN: c.cmdSN, RefCmdSN: c.cmdSN, ExpStatSN: c.expStatSN}).Encode(h)
		}, func(rh pdu.BHS) bool { return rh.Opcode() == pdu.OpTaskMgmtResp && rh[2] == pdu.TMFRespRejected }, n)
	})
	t.Run("logout", func(t *testing.T) {
		testBackgroundFlood(t, func(c *tclient, i int, h *pdu.BHS) {
			(&pdu.LogoutReq{Immediate: true, Reason: pdu.LogoutCloseConnection, CID: 0x999, ITT: uint32(0x10000 + i),
				CmdSN: c.cmdSN, ExpStatSN: c.expStatSN}).Encode(h)
		}, func(rh pdu.BHS) bool { return rh.Opcode() == pdu.OpLogoutResp && rh[2] == pdu.LogoutRespCleanupFailed }, n)
	})
}

func testBackgroundFlood(t *testing.T, build func(c *tclient, i int, h *pdu.BHS), refused func(pdu.BHS) bool, n int) {
	ts := startServer(t, Options{NopInterval: -1}, nil)
	c := dial(t, ts.addr)
	c.nc.(*net.TCPConn).SetReadBuffer(4096)
	c.mustLogin(normalKeys(ini)...)
	before := runtime.NumGoroutine()
	var b []byte
	for i := range n {
		var h pdu.BHS
		build(c, i, &h)
		b = append(b, h[:]...)
	}
	// Written from a goroutine: a target that applies back-pressure
	// stops reading, and the write blocks.
	go c.nc.Write(b)
	peak := 0
	for range 20 {
		time.Sleep(100 * time.Millisecond)
		peak = max(peak, runtime.NumGoroutine()-before)
	}
	if peak > 2*maxBackground {
		t.Fatalf("%d goroutines held for %d unread requests", peak, n)
	}
	// Read now: the answers beyond the bound say so.
	for i := 0; ; i++ {
		rh, _, ok := c.recv(5 * time.Second)
		if !ok {
			t.Fatalf("after %d answers: %v", i, c.rerr)
		}
		if refused(rh) {
			break
		}
		if i == n-1 {
			t.Fatal("no request was refused: the bound was never reached")
		}
	}
}

// TestTaskManagementLogIsBounded: task management functions are logged at
// Info, the first 16 of a connection and then one in 1024, so a peer
// sending them in a loop (and reading the answers) does not flood the log.
func TestTaskManagementLogIsBounded(t *testing.T) {
	var logs servetest.LogBuffer
	ts := startServerAt(t, Options{NopInterval: -1}, nil, &logs, fabric.TCP, slog.LevelInfo)
	c := dial(t, ts.addr)
	c.mustLogin(normalKeys(ini)...)
	const n = 5000
	for i := range n {
		var h pdu.BHS
		(&pdu.TaskMgmtReq{Immediate: true, Function: pdu.TMFAbortTask, ITT: uint32(0x10000 + i), RTT: 0x7fffffff,
			CmdSN: c.cmdSN, RefCmdSN: c.cmdSN, ExpStatSN: c.expStatSN}).Encode(&h)
		c.sendRaw(&h, nil, nil)
		if rh, _, ok := c.recv(5 * time.Second); !ok || rh.Opcode() != pdu.OpTaskMgmtResp {
			t.Fatalf("request %d: %v %v", i, rh.Opcode(), c.rerr)
		}
	}
	lines := strings.Count(logs.String(), `msg="task management"`)
	if lines < 16 || lines > 16+n/1024 {
		t.Fatalf("%d task management functions logged %d lines, want 16 to %d", n, lines, 16+n/1024)
	}
}
