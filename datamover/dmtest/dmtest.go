// Package dmtest is the conformance suite of the Datamover Interface
// (draft-ietf-ips-iwarp-da §9–§11, package datamover), in the manner of
// golang.org/x/net/nettest's TestConn: a fabric or a datamover package
// calls TestConn with a function that makes a connected initiator and
// target, and the suite checks, through the interface alone, what every
// datamover promises the iSCSI layer — whatever carries it (TCP, iSER on
// any RDMA device, a connection that turns into iSER after its login):
//
//   - a login in byte-stream PDUs, then full feature phase from the
//     target's final Login Response (Enable_Datamover);
//   - control PDUs both ways, in order, their data segments intact;
//   - a READ: Put_Data lands the data in the initiator's buffer before the
//     SCSI Response is delivered (by Data-In PDUs the initiator places,
//     or by RDMA Writes);
//   - a WRITE: Get_Data fetches the initiator's data into the target's
//     buffer (by an R2T the initiator answers with Data-Out, or by RDMA
//     Reads and Data_Completion_Notify);
//   - Connection_Terminate: each side is told once, Serve returns, and a
//     send afterwards fails instead of hanging.
//
// The suite plays a minimal iSCSI layer on both sides; it needs no SCSI
// target.
package dmtest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/iscsi/pdu"
)

// Pair connects an initiator to a target of one datamover, as its fabric
// establishes them. The target's side may need the initiator's first PDU
// before it is established (a portal that tells iSCSI from MPA by the
// first byte), so it comes from a function the suite calls once the
// initiator has sent its Login Request. What Pair sets up beyond the two
// connections (listeners, devices) it releases with t.Cleanup.
type Pair func(t *testing.T) (initiator *datamover.Established, target func() *datamover.Established)

// wait bounds every step: a datamover that loses a PDU fails the suite
// instead of hanging it.
const wait = 10 * time.Second

// TestConn runs the suite on connections mk makes, each subtest on a
// pair of its own.
func TestConn(t *testing.T, mk Pair) {
	t.Run("LoginAndControlPDUs", func(t *testing.T) { testControl(t, mk) })
	t.Run("Read", func(t *testing.T) { testRead(t, mk) })
	t.Run("Write", func(t *testing.T) { testWrite(t, mk) })
	t.Run("Terminate", func(t *testing.T) { testTerminate(t, mk) })
}

// end is one side: its Conn, and the minimal iSCSI layer above it
// (datamover.Upcalls).
type end struct {
	t         *testing.T
	name      string
	initiator bool
	kind      datamover.Kind
	dm        datamover.Conn

	mu      sync.Mutex
	buffers map[uint32][]byte // by ITT: where Data-In (initiator) or Data-Out (target) lands
	placed  map[uint32]int    // by ITT: bytes of Data-In / Data-Out PDUs delivered (their data in place)

	statSN, expCmdSN atomic.Uint32 // the target's, for its stamper
	pdus             chan *datamover.PDU
	completed        chan uint32 // Data_Completion_Notify, by ITT
	terminated       atomic.Int32
	ended            chan struct{} // closed at the first ConnectionTerminateNotify
	served           chan struct{} // closed when Serve returns
	// enable runs in ControlNotify for the PDU that ends the login (the
	// target's Login Request, the initiator's Login Response): full feature
	// phase begins on the receive goroutine, between two PDUs, as the
	// iSCSI layers do (a datamover may change transport there).
	enable func(p *datamover.PDU) error
}

func open(t *testing.T, name string, est *datamover.Established, initiator bool, enable func(*end, *datamover.PDU) error) *end {
	e := &end{t: t, name: name, initiator: initiator, kind: est.Kind,
		buffers: map[uint32][]byte{}, placed: map[uint32]int{},
		pdus: make(chan *datamover.PDU, 64), completed: make(chan uint32, 8),
		ended: make(chan struct{}), served: make(chan struct{})}
	e.statSN.Store(1)
	e.expCmdSN.Store(1)
	e.enable = func(p *datamover.PDU) error { return enable(e, p) }
	e.dm = est.Open(e.stamp)
	go func() {
		defer close(e.served)
		e.dm.Serve(e)
	}()
	t.Cleanup(func() {
		e.dm.ConnectionTerminate()
		select {
		case <-e.served:
		case <-time.After(wait):
			t.Errorf("%s: Serve did not return within %v of ConnectionTerminate", e.name, wait)
		}
	})
	return e
}

// pair connects and logs in (login).
func pair(t *testing.T, mk Pair) (ini, tgt *end) {
	i, target := mk(t)
	ini = open(t, "initiator", i, true, func(e *end, _ *datamover.PDU) error {
		e.dm.NoticeKeyValues(params(e.kind))
		return e.dm.EnableDatamover(nil)
	})
	return ini, login(t, ini, target)
}

// stamp is the datamover.Stamper: the target's StatSN, ExpCmdSN and
// MaxCmdSN (a window of 64); the initiator's PDUs carry their CmdSN
// already, and ExpStatSN is left 0.
func (e *end) stamp(h *pdu.BHS, advance bool) {
	if e.initiator {
		return
	}
	sn := e.statSN.Load()
	if advance {
		e.statSN.Add(1)
	}
	h.SetStatSN(sn)
	exp := e.expCmdSN.Load()
	binary.BigEndian.PutUint32(h[pdu.OffExpCmdSN:], exp)
	binary.BigEndian.PutUint32(h[pdu.OffMaxCmdSN:], exp+63)
}

// DataBuffer implements datamover.Upcalls: Data-In on the initiator and
// Data-Out on the target land in the task's buffer at their offset.
func (e *end) DataBuffer(h *pdu.BHS) ([]byte, error) {
	op := h.Opcode()
	if !(e.initiator && op == pdu.OpDataIn) && !(!e.initiator && op == pdu.OpDataOut) {
		return nil, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	buf := e.buffers[h.ITT()]
	off, n := int(h.BufferOffset()), h.DataSegmentLength()
	if buf == nil || off+n > len(buf) {
		return nil, fmt.Errorf("dmtest: %s for ITT %#x at %d+%d outside its %d-byte buffer", op, h.ITT(), off, n, len(buf))
	}
	return buf[off : off+n], nil
}

// ControlNotify implements datamover.Upcalls: every PDU is kept (a copy)
// for the test to take in order; an initiator answers an R2T with its
// Data-Out, off the receiving goroutine as an iSCSI layer must.
func (e *end) ControlNotify(p *datamover.PDU) error {
	c := &datamover.PDU{BHS: p.BHS, AHS: bytes.Clone(p.AHS), Data: bytes.Clone(p.Data)}
	if op := p.BHS.Opcode(); op == pdu.OpDataIn || op == pdu.OpDataOut {
		// Its data is in the buffer DataBuffer gave (not before: the
		// datamover reads it in between).
		e.mu.Lock()
		e.placed[p.BHS.ITT()] += p.BHS.DataSegmentLength()
		e.mu.Unlock()
	}
	if op := p.BHS.Opcode(); op == pdu.OpLoginReq || op == pdu.OpLoginResp {
		if err := e.enable(c); err != nil {
			return err
		}
	}
	if e.initiator && p.BHS.Opcode() == pdu.OpR2T {
		var r pdu.R2T
		if err := r.Decode(&p.BHS); err != nil {
			return err
		}
		go e.answerR2T(r)
	}
	select {
	case e.pdus <- c:
		return nil
	default:
		return errors.New("dmtest: 64 PDUs received and not taken")
	}
}

// answerR2T sends the data an R2T solicits as Data-Out PDUs.
func (e *end) answerR2T(r pdu.R2T) {
	e.mu.Lock()
	buf := e.buffers[r.ITT]
	e.mu.Unlock()
	seg := e.dm.MaxSendDataSegmentLength()
	end := int(r.Offset + r.Desired)
	if buf == nil || end > len(buf) || seg <= 0 {
		e.t.Errorf("initiator: R2T for ITT %#x at %d+%d outside its buffer (segment %d)", r.ITT, r.Offset, r.Desired, seg)
		return
	}
	sn := uint32(0)
	for off := int(r.Offset); off < end; off += seg {
		n := min(seg, end-off)
		d := pdu.DataOut{Final: off+n == end, LUN: r.LUN, ITT: r.ITT, TTT: r.TTT, DataSN: sn, Offset: uint32(off)}
		var p datamover.PDU
		d.Encode(&p.BHS)
		p.Data = buf[off : off+n]
		p.BHS.SetDataSegmentLength(n)
		if err := e.dm.SendControl(&p, false); err != nil {
			e.t.Errorf("initiator: Data-Out: %v", err)
			return
		}
		sn++
	}
}

// ConnectionTerminateNotify implements datamover.Upcalls.
func (e *end) ConnectionTerminateNotify(error) {
	if e.terminated.Add(1) == 1 {
		close(e.ended)
	}
}

// DataCompletionNotify implements datamover.Upcalls.
func (e *end) DataCompletionNotify(itt, ttt uint32) {
	select {
	case e.completed <- itt:
	default:
	}
}

// DataACKNotify implements datamover.Upcalls (ErrorRecoveryLevel 0: not
// asked for).
func (e *end) DataACKNotify(itt, dataSN uint32) {}

// next returns the next PDU received, failing the test after wait.
func (e *end) next() *datamover.PDU {
	e.t.Helper()
	select {
	case p := <-e.pdus:
		return p
	case <-time.After(wait):
		e.t.Fatalf("%s: no PDU within %v", e.name, wait)
		return nil
	}
}

// expect returns the next PDU, which must have opcode op.
func (e *end) expect(op pdu.Opcode) *datamover.PDU {
	e.t.Helper()
	p := e.next()
	if p.BHS.Opcode() != op {
		e.t.Fatalf("%s: received %s, want %s", e.name, p.BHS.Opcode(), op)
	}
	return p
}

func (e *end) send(p *datamover.PDU, advance bool) {
	e.t.Helper()
	if err := e.dm.SendControl(p, advance); err != nil {
		e.t.Fatalf("%s: SendControl %s: %v", e.name, p.BHS.Opcode(), err)
	}
}

// params are the keys both sides use: 8 KiB data segments, no digests,
// and the iSER keys on a connection that is or becomes iSER (RFC 5046
// §6).
func params(k datamover.Kind) datamover.Params {
	p := datamover.Params{MaxRecvDataSegmentLength: 8192, MaxXmitDataSegmentLength: 8192, MaxBurstLength: 262144}
	if k.RDMA() {
		p.RDMAExtensions = true
		p.TargetRecvDataSegmentLength, p.InitiatorRecvDataSegmentLength = 8192, 8192
	}
	return p
}

// login runs a one-step login (operational stage straight to full
// feature phase) and checks the PDUs' data segments arrive intact; the
// target's side is opened once the Login Request is on its way.
func login(t *testing.T, ini *end, target func() *datamover.Established) *end {
	t.Helper()
	keys := []byte("InitiatorName=iqn.2026-11.org.blockwire:dmtest\x00SessionType=Normal\x00")
	req := pdu.LoginReq{Transit: true, CSG: pdu.StageOperational, NSG: pdu.StageFullFeature, ISID: [6]byte{0x80, 0, 0, 0, 0, 1}, CmdSN: 1}
	var p datamover.PDU
	req.Encode(&p.BHS)
	p.Data = keys
	p.BHS.SetDataSegmentLength(len(keys))
	ini.send(&p, false)
	g := target()
	if g.Kind != ini.kind {
		t.Fatalf("the initiator's connection is of kind %d, the target's %d", ini.kind, g.Kind)
	}
	answer := []byte("TargetPortalGroupTag=1\x00")
	tgt := open(t, "target", g, false, func(e *end, _ *datamover.PDU) error {
		e.dm.NoticeKeyValues(params(e.kind))
		resp := pdu.LoginResp{Transit: true, CSG: pdu.StageOperational, NSG: pdu.StageFullFeature, ISID: req.ISID, TSIH: 1}
		var r datamover.PDU
		resp.Encode(&r.BHS)
		r.Data = answer
		r.BHS.SetDataSegmentLength(len(answer))
		return e.dm.EnableDatamover(&r)
	})
	got := tgt.expect(pdu.OpLoginReq)
	if !bytes.Equal(got.Data, keys) {
		t.Fatalf("target: Login Request data %q, want %q", got.Data, keys)
	}
	got = ini.expect(pdu.OpLoginResp)
	if !bytes.Equal(got.Data, answer) || got.BHS.StatSN() != 1 {
		t.Fatalf("initiator: Login Response data %q StatSN %d, want %q and 1", got.Data, got.BHS.StatSN(), answer)
	}
	return tgt
}

func testControl(t *testing.T, mk Pair) {
	ini, tgt := pair(t, mk)
	// NOP-Outs with data segments of several sizes (up to the negotiated
	// 8 KiB), then NOP-Ins back, each in order.
	sizes := []int{0, 1, 100, 4096, 8192}
	for k, n := range sizes {
		out := pdu.NopOut{ITT: uint32(k + 1), TTT: pdu.ReservedTTT, CmdSN: 1}
		var p datamover.PDU
		out.Encode(&p.BHS)
		p.BHS.SetImmediate(true)
		p.Data = pattern(n, k)
		p.BHS.SetDataSegmentLength(n)
		ini.send(&p, false)
	}
	for k, n := range sizes {
		got := tgt.expect(pdu.OpNopOut)
		if got.BHS.ITT() != uint32(k+1) || !bytes.Equal(got.Data, pattern(n, k)) {
			t.Fatalf("target: NOP-Out %d: ITT %#x, %d bytes of data (want %d, as sent)", k, got.BHS.ITT(), len(got.Data), n)
		}
	}
	for k, n := range sizes {
		in := pdu.NopIn{ITT: uint32(k + 1), TTT: pdu.ReservedTTT}
		var p datamover.PDU
		in.Encode(&p.BHS)
		p.Data = pattern(n, k+10)
		p.BHS.SetDataSegmentLength(n)
		tgt.send(&p, true)
	}
	for k, n := range sizes {
		got := ini.expect(pdu.OpNopIn)
		if got.BHS.ITT() != uint32(k+1) || !bytes.Equal(got.Data, pattern(n, k+10)) || got.BHS.StatSN() != uint32(k+2) {
			t.Fatalf("initiator: NOP-In %d: ITT %#x StatSN %d, %d bytes of data (want %d, StatSN %d)", k, got.BHS.ITT(), got.BHS.StatSN(), len(got.Data), n, k+2)
		}
	}
	for _, e := range []*end{ini, tgt} {
		if e.dm.RemoteAddr() == "" || e.dm.LocalAddr() == "" {
			t.Errorf("%s: RemoteAddr %q LocalAddr %q: both must name the endpoints", e.name, e.dm.RemoteAddr(), e.dm.LocalAddr())
		}
	}
}

// command sends a SCSI Command of n bytes from the initiator: a READ
// (data lands in buf) or a WRITE (data comes from buf).
func command(ini *end, itt uint32, write bool, buf []byte) {
	cdb := [16]byte{0x28}
	if write {
		cdb[0] = 0x2a
	}
	c := pdu.SCSICommand{Final: true, Read: !write, Write: write, ITT: itt, EDTL: uint32(len(buf)), CmdSN: 1, CDB: cdb}
	p := datamover.PDU{}
	c.Encode(&p.BHS)
	if write {
		p.DataOut = buf
	} else {
		p.DataIn = buf
	}
	ini.mu.Lock()
	ini.buffers[itt] = buf
	ini.mu.Unlock()
	ini.send(&p, false)
}

// respond sends the target's SCSI Response (GOOD) for itt and the
// initiator takes it, after any Data-In PDUs.
func respond(t *testing.T, ini, tgt *end, itt uint32) {
	t.Helper()
	r := pdu.SCSIResponse{ITT: itt, Status: 0}
	var p datamover.PDU
	r.Encode(&p.BHS)
	tgt.send(&p, true)
	for {
		got := ini.next()
		switch got.BHS.Opcode() {
		case pdu.OpDataIn, pdu.OpR2T:
			continue // placed by DataBuffer; answered by answerR2T
		case pdu.OpSCSIResponse:
			if got.BHS.ITT() != itt {
				t.Fatalf("initiator: SCSI Response for ITT %#x, want %#x", got.BHS.ITT(), itt)
			}
			return
		default:
			t.Fatalf("initiator: %s while waiting for the SCSI Response", got.BHS.Opcode())
		}
	}
}

func testRead(t *testing.T, mk Pair) {
	ini, tgt := pair(t, mk)
	for k, n := range []int{512, 8192, 65536, 256 << 10} {
		itt := uint32(0x100 + k)
		buf := make([]byte, n)
		command(ini, itt, false, buf)
		got := tgt.expect(pdu.OpSCSICommand)
		if got.BHS.ITT() != itt {
			t.Fatalf("target: SCSI Command ITT %#x, want %#x", got.BHS.ITT(), itt)
		}
		tgt.expCmdSN.Add(1)
		want := pattern(n, k)
		var sn uint32
		if err := tgt.dm.PutData(&datamover.DataIn{ITT: itt, Data: want, DataSN: &sn, Final: true}); err != nil {
			t.Fatalf("target: PutData of %d bytes: %v", n, err)
		}
		respond(t, ini, tgt, itt)
		if !bytes.Equal(buf, want) {
			t.Fatalf("READ of %d bytes: the initiator's buffer differs from what the target put", n)
		}
		ini.dm.DeallocateTaskResources(itt)
		tgt.dm.DeallocateTaskResources(itt)
	}
}

func testWrite(t *testing.T, mk Pair) {
	ini, tgt := pair(t, mk)
	for k, n := range []int{512, 8192, 65536, 256 << 10} {
		itt := uint32(0x200 + k)
		data := pattern(n, k)
		command(ini, itt, true, data)
		got := tgt.expect(pdu.OpSCSICommand)
		if got.BHS.ITT() != itt {
			t.Fatalf("target: SCSI Command ITT %#x, want %#x", got.BHS.ITT(), itt)
		}
		tgt.expCmdSN.Add(1)
		buf := make([]byte, n)
		tgt.mu.Lock()
		tgt.buffers[itt] = buf
		tgt.mu.Unlock()
		r2t := pdu.R2T{ITT: itt, TTT: uint32(0x900 + k), Offset: 0, Desired: uint32(n)}
		if err := tgt.dm.GetData(&r2t, buf); err != nil {
			t.Fatalf("target: GetData of %d bytes: %v", n, err)
		}
		// Done when the datamover says so (RDMA Reads) or when the
		// Data-Out PDUs placed every byte (TCP leaves the count to the
		// iSCSI layer).
		deadline := time.After(wait)
	collect:
		for {
			tgt.mu.Lock()
			placed := tgt.placed[itt]
			tgt.mu.Unlock()
			if placed == n {
				break
			}
			select {
			case c := <-tgt.completed:
				if c != itt {
					t.Fatalf("target: Data_Completion_Notify for ITT %#x, want %#x", c, itt)
				}
				break collect
			case p := <-tgt.pdus:
				if p.BHS.Opcode() != pdu.OpDataOut {
					t.Fatalf("target: %s while waiting for the data of a WRITE", p.BHS.Opcode())
				}
			case <-deadline:
				t.Fatalf("target: %d of %d bytes of a WRITE after %v", placed, n, wait)
			}
		}
		// Data-Out PDUs whose data was counted may still be queued.
		for len(tgt.pdus) > 0 {
			if p := <-tgt.pdus; p.BHS.Opcode() != pdu.OpDataOut {
				t.Fatalf("target: %s after the data of a WRITE", p.BHS.Opcode())
			}
		}
		if !bytes.Equal(buf, data) {
			t.Fatalf("WRITE of %d bytes: the target's buffer differs from the initiator's data", n)
		}
		respond(t, ini, tgt, itt)
		ini.dm.DeallocateTaskResources(itt)
		tgt.dm.DeallocateTaskResources(itt)
	}
}

func testTerminate(t *testing.T, mk Pair) {
	ini, tgt := pair(t, mk)
	tgt.dm.ConnectionTerminate()
	for _, e := range []*end{tgt, ini} {
		select {
		case <-e.ended:
		case <-time.After(wait):
			t.Fatalf("%s: no ConnectionTerminateNotify within %v of the target's ConnectionTerminate", e.name, wait)
		}
		select {
		case <-e.served:
		case <-time.After(wait):
			t.Fatalf("%s: Serve did not return within %v of its ConnectionTerminateNotify", e.name, wait)
		}
	}
	// Sends after the end fail, and promptly.
	for _, e := range []*end{ini, tgt} {
		done := make(chan error, 1)
		go func() {
			n := pdu.NopOut{ITT: 9, TTT: pdu.ReservedTTT}
			var p datamover.PDU
			n.Encode(&p.BHS)
			p.BHS.SetImmediate(true)
			done <- e.dm.SendControl(&p, false)
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("%s: SendControl after the connection ended returned no error", e.name)
			}
		case <-time.After(wait):
			t.Fatalf("%s: SendControl after the connection ended still blocked after %v", e.name, wait)
		}
	}
	ini.dm.ConnectionTerminate() // a second terminate is harmless
	time.Sleep(10 * time.Millisecond)
	for _, e := range []*end{ini, tgt} {
		if n := e.terminated.Load(); n != 1 {
			t.Errorf("%s: ConnectionTerminateNotify called %d times, want once", e.name, n)
		}
	}
}

// pattern is n bytes of data particular to seed.
func pattern(n, seed int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(n), uint64(seed)))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}
