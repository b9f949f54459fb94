package srptarget_test

import (
	"testing"

	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/scsi"
	"github.com/blockwire/blockwire/srp"
)

// FuzzTargetIU sends arbitrary bytes as an IU on a live channel: the
// target either answers, logs the channel out or drops it — never
// panics or hangs — and a new channel is served afterwards.
func FuzzTargetIU(f *testing.F) {
	addr, srv, _ := start(f, 0)
	tur := srp.Cmd{Tag: 1, CDB: []byte{scsi.OpTestUnitReady}}
	b, _ := tur.Append(nil, 0)
	f.Add(b)
	rd := srp.Cmd{Tag: 2, CDB: []byte{scsi.OpRead10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, In: srp.Direct(srp.Desc{VA: 0x1000, Key: 0x100, Len: 512})}
	b, _ = rd.Append(nil, 0)
	f.Add(b)
	wr := srp.Cmd{Tag: 3, CDB: []byte{scsi.OpWrite10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, Out: srp.Immediate(make([]byte, 512))}
	b, _ = wr.Append(nil, 68)
	f.Add(b)
	tm := srp.TskMgmt{Tag: 4, Function: srp.TMFLUNReset}
	f.Add(tm.Append(nil))
	f.Add(srp.AppendCredRsp(nil, 5))
	f.Add((&srp.ILogout{Tag: 6}).Append(nil))
	f.Fuzz(func(t *testing.T, iu []byte) {
		if len(iu) == 0 || len(iu) > 8260 {
			return
		}
		turIU, _ := (&srp.Cmd{Tag: 77, CDB: []byte{scsi.OpTestUnitReady}}).Append(nil, 0)
		r := dialRaw(t, addr)
		r.send(t, iu)
		// A TEST UNIT READY behind it: its answer, or the channel's end,
		// says the target has taken the fuzzed IU. A target that gives
		// neither hangs, and next fails after 5 s (no fixed wait: it
		// cost each run 20 ms).
		//
		// A task management function runs beside the commands, and may
		// end after the TEST UNIT READY's answer; a LOGICAL UNIT RESET or
		// CLEAR TASK SET still running then aborts every task on the LU,
		// the fresh channel's TEST UNIT READY below too (aborted with no
		// status, SAM-5 §5.6). So its own answer (response data: the TUR's
		// has none) ends the wait, or the channel's end; it may also have
		// aborted the TEST UNIT READY.
		var tm srp.TskMgmt
		isTM := tm.Decode(iu) == nil
		if r.qp.PostSend(&rdma.SendWR{Op: rdma.OpSend, SG: [][]byte{turIU}, Unsignaled: true}) == nil {
			for {
				b := r.next(t)
				if b == nil {
					break // the channel ended
				}
				var rsp srp.Rsp
				if rsp.Decode(b) != nil {
					continue
				}
				if isTM && rsp.Tag == tm.Tag && len(rsp.RespData) > 0 || !isTM && rsp.Tag == 77 {
					break
				}
			}
		}
		r.qp.Close()
		// Whatever happened, the target must still answer a new channel.
		// The target may speak first there: an SRP_AER_REQ reports a unit
		// attention the fuzzed IU left on the nexus (a LUN RESET's), an
		// SRP_CRED_REQ grants credit.
		s := dialRaw(t, addr)
		s.send(t, turIU)
		var rsp srp.Rsp
		for {
			b := s.next(t)
			if len(b) > 0 && (srp.Opcode(b[0]) == srp.OpAerReq || srp.Opcode(b[0]) == srp.OpCredReq) {
				continue
			}
			if err := rsp.Decode(b); err != nil || rsp.Tag != 77 {
				t.Fatalf("a fresh channel after the fuzzed IU: %+v %v", rsp, err)
			}
			break
		}
		s.qp.Close()
		if n := srv.Channels(); n > 16 { // teardown is asynchronous; a leak grows without bound
			t.Fatalf("%d channels left behind", n)
		}
	})
}
