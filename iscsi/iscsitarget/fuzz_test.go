package iscsitarget

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/scsi"
)

// FuzzTargetConnection logs in and then sends arbitrary bytes as PDUs. The
// target must answer with Rejects or drop the connection, never panic or
// hang, and must keep serving a fresh session afterwards.
func FuzzTargetConnection(f *testing.F) {
	var h pdu.BHS
	(&pdu.SCSICommand{Final: true, Read: true, ITT: 1, EDTL: 512, CDB: [16]byte{0x28, 0, 0, 0, 0, 0, 0, 0, 1}}).Encode(&h)
	f.Add(append([]byte(nil), h[:]...))
	(&pdu.DataOut{Final: true, ITT: 1, TTT: 5}).Encode(&h)
	h.SetDataSegmentLength(4)
	f.Add(append(append([]byte(nil), h[:]...), 1, 2, 3, 4))
	(&pdu.TaskMgmtReq{Immediate: true, Function: pdu.TMFAbortTaskSet, ITT: 2}).Encode(&h)
	f.Add(append([]byte(nil), h[:]...))
	(&pdu.TextReq{Final: true, ITT: 3, TTT: pdu.ReservedTTT}).Encode(&h)
	h.SetDataSegmentLength(19)
	f.Add(append(append([]byte(nil), h[:]...), []byte("SendTargets=All\x00\x00\x00\x00\x00")...))
	ts := startServer(f, Options{LoginTimeout: 2 * time.Second}, nil)
	f.Fuzz(func(t *testing.T, b []byte) {
		c := dial(t, ts.addr)
		c.mustLogin(normalKeys(ini)...)
		c.nc.Write(b)
		// The input ends there: the target answers what it read and,
		// reading the end of the stream, drops the connection. It must
		// do so soon — a hang fails (as a wait for silence could not
		// tell), and no wait for silence slows every run.
		c.nc.(*net.TCPConn).CloseWrite()
		for {
			rh, _, ok := c.recv(5 * time.Second)
			if !ok {
				if errors.Is(c.rerr, os.ErrDeadlineExceeded) {
					t.Fatalf("the target neither answered nor dropped the connection within 5 s of the input's end (%d bytes)", len(b))
				}
				break
			}
			if op := rh.Opcode(); !op.Known() || op.FromInitiator() {
				t.Fatalf("target sent %s", op)
			}
		}
		c.nc.Close()
		// The connection ends once what it started has: a reset the
		// input asked for (a LUN or target reset) could otherwise abort
		// the fresh session's command below.
		if !waitConns(ts, 0, 10*time.Second) {
			t.Fatalf("the connection has not ended 10 s after the input's end (%d bytes)", len(b))
		}
		// The target still serves. The reset's unit attention may reach
		// the fresh session after the one of the session's start, so
		// TEST UNIT READY is repeated while it reports unit attentions,
		// and must then succeed.
		n := dial(t, ts.addr)
		n.isid[5] = 0x77
		n.mustLogin(normalKeys(ini)...)
		for try := 0; ; try++ {
			r := n.command(tur(), false, 0, nil, 0)
			if r.status == 0 {
				break
			}
			if r.status != 2 || len(r.sense) < 3 || r.sense[2]&0x0f != scsi.SenseUnitAttention || try == 4 {
				t.Fatalf("fresh session after fuzzed input: TUR status %d, sense % x (try %d)", r.status, r.sense, try)
			}
		}
		n.nc.Close()
	})
}
