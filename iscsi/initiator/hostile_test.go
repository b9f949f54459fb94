package initiator

// A target that misbehaves — sends what no command asked for, text without
// end, the same answer twice, or bytes that are no PDU at all — must not
// make our initiator panic, hang, or hold without bound what it sends:
// every call ends, with an error where the target broke the protocol.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/datamover/tcp"
	"github.com/blockwire/blockwire/internal/servetest"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/iscsi/text"
)

// scriptDialer connects the initiator to a scripted target over an
// in-memory pipe: script plays the target's side and the pipe closes when
// it returns.
// When hold is set, the target stops reading after each PDU hold
// reports true for, until resume closes (its receiver busy).
type scriptDialer struct {
	script func(*fakeTarget)
	hold   func(fakePDU) bool
	resume chan struct{}
}

func (d scriptDialer) Dial(ctx context.Context, portal string, p datamover.DialParams) (*datamover.Established, error) {
	a, b := net.Pipe()
	f := &fakeTarget{c: b, reqs: make(chan fakePDU, 64), hold: d.hold, resume: d.resume}
	go f.read()
	go func() {
		defer b.Close()
		d.script(f)
	}()
	return &datamover.Established{Open: func(st datamover.Stamper) datamover.Conn { return tcp.New(a, st) },
		Close: func() { a.Close() }}, nil
}

type fakePDU struct {
	h    pdu.BHS
	data []byte
}

// fakeTarget is the target's end of the pipe: what the initiator sends
// arrives on reqs (closed when the initiator closes); what the script
// writes goes out as it is.
type fakeTarget struct {
	c     net.Conn
	reqs  chan fakePDU
	sent  atomic.Int64 // bytes written
	stuck atomic.Bool  // a write found the initiator not reading
	// hold and resume: scriptDialer's.
	hold   func(fakePDU) bool
	resume chan struct{}
}

var errDeadline = os.ErrDeadlineExceeded

func (f *fakeTarget) read() {
	defer close(f.reqs)
	for {
		var p fakePDU
		if _, err := io.ReadFull(f.c, p.h[:]); err != nil {
			return
		}
		n := p.h.TotalAHSLength() + (p.h.DataSegmentLength()+3)&^3
		buf := make([]byte, n)
		if _, err := io.ReadFull(f.c, buf); err != nil {
			return
		}
		p.data = buf[p.h.TotalAHSLength():][:p.h.DataSegmentLength()]
		select {
		case f.reqs <- p:
		default: // nobody looks at that many: dropped, the pipe drained
		}
		if f.hold != nil && f.hold(p) {
			<-f.resume
		}
	}
}

// next waits for the initiator's next PDU (ok false once it closed).
func (f *fakeTarget) next() (fakePDU, bool) {
	select {
	case p, ok := <-f.reqs:
		return p, ok
	case <-time.After(5 * time.Second):
		return fakePDU{}, false
	}
}

// write sends b; an initiator that stops reading for 2 s while the
// connection is open (its receiver stuck) fails the write.
func (f *fakeTarget) write(b []byte) error {
	f.c.SetWriteDeadline(time.Now().Add(2 * time.Second))
	n, err := f.c.Write(b)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errDeadline) {
		f.stuck.Store(true)
	}
	f.sent.Add(int64(n))
	return err
}

// pduBytes is a PDU as the wire carries it: the BHS with its data segment
// length set, the data, padding to 4 bytes.
func pduBytes(h pdu.BHS, data []byte) []byte {
	h.SetDataSegmentLength(len(data))
	b := append(h[:], data...)
	return append(b, make([]byte, (4-len(data)%4)%4)...)
}

// loginKeys are a target's answer to our operational keys; FirstBurstLength
// 4096 makes a larger write wait for an R2T.
var loginKeys = []text.KV{
	{Key: "HeaderDigest", Value: "None"}, {Key: "DataDigest", Value: "None"},
	{Key: "MaxRecvDataSegmentLength", Value: "8192"}, {Key: "DefaultTime2Wait", Value: "0"},
	{Key: "DefaultTime2Retain", Value: "0"}, {Key: "ErrorRecoveryLevel", Value: "0"},
	{Key: "IFMarker", Value: "No"}, {Key: "OFMarker", Value: "No"},
	{Key: "InitialR2T", Value: "No"}, {Key: "ImmediateData", Value: "Yes"},
	{Key: "MaxBurstLength", Value: "262144"}, {Key: "FirstBurstLength", Value: "4096"},
	{Key: "MaxOutstandingR2T", Value: "1"}, {Key: "MaxConnections", Value: "1"},
	{Key: "DataPDUInOrder", Value: "Yes"}, {Key: "DataSequenceInOrder", Value: "Yes"},
}

// login answers the initiator's first Login Request with a final
// response (CmdSN window of 32) and returns false if none came.
func (f *fakeTarget) login() bool { return f.loginWith(text.Append(nil, loginKeys...)) }

// loginWith is login with keys as the response's text.
func (f *fakeTarget) loginWith(keys []byte) bool {
	p, ok := f.next()
	if !ok || p.h.Opcode() != pdu.OpLoginReq {
		return false
	}
	var req pdu.LoginReq
	if req.Decode(&p.h) != nil {
		return false
	}
	r := pdu.LoginResp{Transit: true, CSG: pdu.StageOperational, NSG: pdu.StageFullFeature, ISID: req.ISID, TSIH: 1,
		ITT: req.ITT, StatSN: 1, ExpCmdSN: req.CmdSN, MaxCmdSN: req.CmdSN + 31}
	var h pdu.BHS
	r.Encode(&h)
	return f.write(pduBytes(h, keys)) == nil
}

func hostileOptions(d scriptDialer) Options {
	return Options{Dialer: d, DialTimeout: 5 * time.Second, RecoveryTimeout: -1, NopInterval: -1}
}

// TestHostileTargetEndlessLoginText: a target that answers every Login
// Request with "more text follows" (the C bit) is given up on once the
// text passes text.MaxTextLen, not read until the login times out.
func TestHostileTargetEndlessLoginText(t *testing.T) {
	d := scriptDialer{script: func(f *fakeTarget) {
		chunk := bytes.Repeat([]byte("a"), 8192)
		for {
			p, ok := f.next()
			if !ok {
				return
			}
			r := pdu.LoginResp{Continue: true, CSG: pdu.StageOperational, NSG: pdu.StageFullFeature, ITT: p.h.ITT(), StatSN: 1, ExpCmdSN: 1, MaxCmdSN: 32}
			var h pdu.BHS
			r.Encode(&h)
			if f.write(pduBytes(h, chunk)) != nil {
				return
			}
		}
	}}
	start := time.Now()
	_, err := Login(context.Background(), "fake:3260", "iqn.2026-11.org.blockwire:fake", hostileOptions(d))
	took := time.Since(start)
	if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "exceeds") {
		t.Fatalf("login against endless text: err %v after %v; want a text-limit error", err, took)
	}
	if took > 2*time.Second {
		t.Fatalf("the initiator read endless login text for %v", took)
	}
}

// TestHostileTargetEndlessDiscoveryText: the same for SendTargets: Text
// Responses that never set F stop once the text passes text.MaxTextLen.
func TestHostileTargetEndlessDiscoveryText(t *testing.T) {
	var sent atomic.Int64
	d := scriptDialer{script: func(f *fakeTarget) {
		defer func() { sent.Store(f.sent.Load()) }()
		if !f.login() {
			return
		}
		chunk := bytes.Repeat([]byte("a"), 8192)
		for {
			p, ok := f.next()
			if !ok || p.h.Opcode() != pdu.OpTextReq {
				return
			}
			r := pdu.TextResp{ITT: p.h.ITT(), TTT: 7, StatSN: 2, ExpCmdSN: 1, MaxCmdSN: 32}
			var h pdu.BHS
			r.Encode(&h)
			if f.write(pduBytes(h, chunk)) != nil {
				return
			}
		}
	}}
	_, err := Discover(context.Background(), "fake:3260", hostileOptions(d))
	if err == nil || !strings.Contains(err.Error(), "exceeds") {
		t.Fatalf("discovery against endless text: err %v; want a text-limit error", err)
	}
	time.Sleep(100 * time.Millisecond) // the script sees the close
	if n := sent.Load(); n > 2*text.MaxTextLen {
		t.Fatalf("the initiator took %d bytes of SendTargets text; the bound is %d", n, text.MaxTextLen)
	}
}

// TestHostileTargetTwoLogoutResponses: a target that answers our Logout
// twice must not crash the initiator (the second answer is ignored).
func TestHostileTargetTwoLogoutResponses(t *testing.T) {
	d := scriptDialer{script: func(f *fakeTarget) {
		if !f.login() {
			return
		}
		p, ok := f.next()
		if !ok || p.h.Opcode() != pdu.OpLogoutReq {
			return
		}
		var h pdu.BHS
		h[0] = byte(pdu.OpLogoutResp)
		h[1] = 0x80
		binary.BigEndian.PutUint32(h[16:], p.h.ITT())
		binary.BigEndian.PutUint32(h[24:], 2)
		binary.BigEndian.PutUint32(h[28:], 1)
		binary.BigEndian.PutUint32(h[32:], 32)
		b := pduBytes(h, nil)
		f.write(append(b, b...))
		time.Sleep(50 * time.Millisecond)
	}}
	s, err := Login(context.Background(), "fake:3260", "iqn.2026-11.org.blockwire:fake", hostileOptions(d))
	if err != nil {
		t.Fatal(err)
	}
	if err := servetest.Closes(t, s.Close, 5*time.Second); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// FuzzHostileTarget: after a good login, the initiator sends one command
// (the first byte: even a READ of 8 KiB, odd a WRITE of 16 KiB whose
// last 12 KiB wait for an R2T) and the target answers with the rest of the
// input as raw bytes, then closes the connection. The command must end —
// with an error or a result within its buffer — and the session close,
// with the initiator reading all the while: no panic, no hang.
func FuzzHostileTarget(f *testing.F) {
	lun := [8]byte{}
	enc := func(h pdu.BHS, data []byte) []byte { return pduBytes(h, data) }
	var h pdu.BHS
	// A read answered in full: Data-In with status.
	(&pdu.DataIn{Final: true, HasStatus: true, LUN: lun, ITT: 1, TTT: pdu.ReservedTTT, StatSN: 1, ExpCmdSN: 2, MaxCmdSN: 33}).Encode(&h)
	f.Add(append([]byte{0}, enc(h, make([]byte, 8192))...))
	// Data-In beyond the buffer.
	(&pdu.DataIn{Final: true, HasStatus: true, LUN: lun, ITT: 1, TTT: pdu.ReservedTTT, StatSN: 1, ExpCmdSN: 2, MaxCmdSN: 33, Offset: 8000}).Encode(&h)
	f.Add(append([]byte{0}, enc(h, make([]byte, 512))...))
	// A SCSI Response with sense data, and a second one for the same task.
	(&pdu.SCSIResponse{Status: 0x02, ITT: 1, StatSN: 1, ExpCmdSN: 2, MaxCmdSN: 33}).Encode(&h)
	sense := []byte{0, 18, 0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0}
	r := enc(h, sense)
	f.Add(append(append([]byte{0}, r...), r...))
	// A sense length that runs past the data.
	f.Add(append([]byte{0}, enc(h, []byte{0xff, 0xff, 0x70, 0})...))
	// R2Ts for the write: in range, beyond it, twice.
	(&pdu.R2T{LUN: lun, ITT: 1, TTT: 9, StatSN: 1, ExpCmdSN: 2, MaxCmdSN: 33, Offset: 4096, Desired: 12288}).Encode(&h)
	r = enc(h, nil)
	f.Add(append(append([]byte{1}, r...), r...))
	(&pdu.R2T{LUN: lun, ITT: 1, TTT: 9, StatSN: 1, ExpCmdSN: 2, MaxCmdSN: 33, Offset: 0xfffff000, Desired: 0xffffffff}).Encode(&h)
	f.Add(append([]byte{1}, enc(h, nil)...))
	// A ping from the target, a Reject of our command, an Async Message
	// asking for logout, an unsolicited Logout and Text Response.
	(&pdu.NopIn{LUN: lun, ITT: pdu.ReservedITT, TTT: 5, StatSN: 1, ExpCmdSN: 2, MaxCmdSN: 33}).Encode(&h)
	f.Add(append([]byte{0}, enc(h, nil)...))
	(&pdu.Reject{Reason: pdu.RejectProtocolError, StatSN: 1, ExpCmdSN: 2, MaxCmdSN: 33}).Encode(&h)
	var cmd pdu.BHS
	(&pdu.SCSICommand{Final: true, Read: true, LUN: lun, ITT: 1, EDTL: 8192, CmdSN: 1}).Encode(&cmd)
	f.Add(append([]byte{0}, enc(h, cmd[:])...))
	(&pdu.AsyncMsg{LUN: lun, StatSN: 1, ExpCmdSN: 2, MaxCmdSN: 33, Event: pdu.AsyncLogoutRequest, Parameter3: 1}).Encode(&h)
	f.Add(append([]byte{0}, enc(h, nil)...))
	var lo pdu.BHS
	lo[0], lo[1] = byte(pdu.OpLogoutResp), 0x80
	f.Add(append([]byte{1}, enc(lo, nil)...))
	(&pdu.TextResp{Final: true, ITT: 3, TTT: pdu.ReservedTTT, StatSN: 1, ExpCmdSN: 2, MaxCmdSN: 33}).Encode(&h)
	f.Add(append([]byte{0}, enc(h, []byte("a=b\x00"))...))
	// A window that closes (MaxCmdSN below ExpCmdSN), and a data segment
	// longer than we declared.
	(&pdu.NopIn{LUN: lun, ITT: pdu.ReservedITT, TTT: pdu.ReservedTTT, StatSN: 1, ExpCmdSN: 40, MaxCmdSN: 2}).Encode(&h)
	f.Add(append([]byte{1}, enc(h, nil)...))
	(&pdu.DataIn{LUN: lun, ITT: 1, TTT: pdu.ReservedTTT}).Encode(&h)
	h.SetDataSegmentLength(0xffffff)
	f.Add(append([]byte{0}, h[:]...))

	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 || len(in) > 1<<20 {
			return
		}
		mode, raw := in[0], in[1:]
		var target *fakeTarget
		closed := make(chan struct{})
		d := scriptDialer{script: func(f *fakeTarget) {
			target = f
			defer close(closed)
			if !f.login() {
				return
			}
			if _, ok := f.next(); !ok {
				return
			}
			f.write(raw)
		}}
		s, err := Login(context.Background(), "fake:3260", "iqn.2026-11.org.blockwire:fake", hostileOptions(d))
		if err != nil {
			t.Fatalf("login: %v", err)
		}
		wait := servetest.OneCommand(s.Do, mode%2 == 1)
		<-closed
		wait(t)
		if target.stuck.Load() {
			t.Fatal("the initiator stopped reading the connection")
		}
		servetest.Closes(t, s.Close, 15*time.Second)
	})
}

// FuzzHostileLogin: the target answers the first Login Request with a
// final response carrying the input as its text (the keys it declares),
// then asks for a 16 KiB write's data with one R2T. The login either
// fails with an error or gives a session whose write sends what the R2T
// asked in PDUs the declared sizes allow — not a flood of PDUs — and
// ends once the target closes.
func FuzzHostileLogin(f *testing.F) {
	f.Add(text.Append(nil, loginKeys...))
	for _, kv := range []text.KV{{Key: "MaxRecvDataSegmentLength", Value: "0"}, {Key: "MaxRecvDataSegmentLength", Value: "16777216"},
		{Key: "FirstBurstLength", Value: "0"}, {Key: "MaxRecvDataSegmentLength", Value: "18446744073709551615"}, {Key: "MaxBurstLength", Value: "1"}, {Key: "MaxConnections", Value: "0"},
		{Key: "HeaderDigest", Value: "CRC32C"}, {Key: "ImmediateData", Value: "No"}, {Key: "InitialR2T", Value: "Yes"}} {
		keys := slices.Clone(loginKeys)
		for i := range keys {
			if keys[i].Key == kv.Key {
				keys[i] = kv
			}
		}
		f.Add(text.Append(nil, keys...))
	}
	f.Fuzz(func(t *testing.T, keys []byte) {
		if len(keys) > 8192 {
			return
		}
		var pdus atomic.Int64
		closed := make(chan struct{})
		d := scriptDialer{script: func(f *fakeTarget) {
			defer close(closed)
			if !f.loginWith(keys) {
				return
			}
			cmd, ok := f.next()
			if !ok || cmd.h.Opcode() != pdu.OpSCSICommand {
				return
			}
			var h pdu.BHS
			(&pdu.R2T{ITT: cmd.h.ITT(), TTT: 9, StatSN: 2, ExpCmdSN: 2, MaxCmdSN: 33, Offset: 0, Desired: 16384}).Encode(&h)
			f.write(pduBytes(h, nil))
			// What the write sends, for a while: a bounded number of
			// Data-Out PDUs.
			deadline := time.After(200 * time.Millisecond)
			for {
				select {
				case p, ok := <-f.reqs:
					if !ok {
						return
					}
					pdus.Add(1)
					if p.h.Opcode() == pdu.OpDataOut && p.h.Final() && p.h.TTT() == 9 {
						return // the R2T's data is all there
					}
				case <-deadline:
					return
				}
			}
		}}
		s, err := Login(context.Background(), "fake:3260", "iqn.2026-11.org.blockwire:fake", hostileOptions(d))
		if err != nil {
			<-closed
			return
		}
		wait := servetest.OneCommand(s.Do, true)
		<-closed
		wait(t)
		// 16 KiB in PDUs of at least 512 bytes is 32 of them, and twice
		// that when the R2T asks again for data already sent unsolicited;
		// and the command.
		if n := pdus.Load(); n > 65 {
			t.Fatalf("the initiator sent %d PDUs for a 16 KiB write (declared keys %q)", n, keys)
		}
		s.Close()
	})
}

// TestHostileTargetImpossibleAnswers: a target's answer to an offer of
// ours must be what the key's function could give (RFC 7143 §6.2.2);
// anything else fails the login instead of running on values the two
// sides disagree on. InitialR2T=Maybe was taken for No: the initiator
// then sent unsolicited data a target meaning Yes does not expect. The
// special answers leave a key at its default, and the login goes on.
func TestHostileTargetImpossibleAnswers(t *testing.T) {
	for _, tc := range []struct {
		kv text.KV
		ok bool
	}{
		{text.KV{Key: "InitialR2T", Value: "Maybe"}, false},
		{text.KV{Key: "ImmediateData", Value: "yes"}, false},
		{text.KV{Key: "DataPDUInOrder", Value: "No"}, false},       // OR with our Yes is Yes
		{text.KV{Key: "MaxBurstLength", Value: "16777215"}, false}, // above our 16776192
		{text.KV{Key: "ErrorRecoveryLevel", Value: "2"}, false},    // above our 0
		{text.KV{Key: "MaxOutstandingR2T", Value: "0"}, false},     // below the key's range
		{text.KV{Key: "InitialR2T", Value: "Yes"}, true},           // OR with our No
		{text.KV{Key: "ImmediateData", Value: "No"}, true},
		{text.KV{Key: "ImmediateData", Value: "Reject"}, true},
		{text.KV{Key: "FirstBurstLength", Value: "NotUnderstood"}, true},
	} {
		keys := slices.Clone(loginKeys)
		for i := range keys {
			if keys[i].Key == tc.kv.Key {
				keys[i] = tc.kv
			}
		}
		// After the login the connection ends: no Logout to wait for.
		d := scriptDialer{script: func(f *fakeTarget) { f.loginWith(text.Append(nil, keys...)) }}
		s, err := Login(context.Background(), "fake:3260", "iqn.2026-11.org.blockwire:fake", hostileOptions(d))
		if s != nil {
			s.Close()
		}
		if tc.ok != (err == nil) {
			t.Errorf("answer %s=%s: login error %v, want ok=%v", tc.kv.Key, tc.kv.Value, err, tc.ok)
		} else if err != nil {
			t.Logf("%s=%s: %v", tc.kv.Key, tc.kv.Value, err)
		}
	}
}

// TestConnectionEndedDuringLoginIsRecovered: a connection of the session
// that ends while the session is still logging in its other connections
// (before the session holds any of them) is lost like one that ends a
// moment later: the session reinstates itself instead of keeping a
// connection that is gone.
func TestConnectionEndedDuringLoginIsRecovered(t *testing.T) {
	keys := slices.Clone(loginKeys)
	for i := range keys {
		if keys[i].Key == "MaxConnections" {
			keys[i].Value = "2"
		}
	}
	var dials atomic.Int32
	first := make(chan *fakeTarget, 1)
	d := scriptDialer{script: func(f *fakeTarget) {
		switch dials.Add(1) {
		case 1:
			if f.loginWith(text.Append(nil, keys...)) {
				first <- f
			}
		case 2:
			// The first connection ends before this one's login is
			// answered, so before Login returns.
			select {
			case f1 := <-first:
				f1.c.Close()
			case <-time.After(5 * time.Second):
				return
			}
			time.Sleep(100 * time.Millisecond)
			f.loginWith(text.Append(nil, keys...))
			untilLogout(f)
		default:
			f.loginWith(text.Append(nil, keys...))
			untilLogout(f)
		}
	}}
	opts := hostileOptions(d)
	opts.Connections = 2
	opts.RecoveryTimeout = 10 * time.Second
	s, err := Login(context.Background(), "fake:3260", "iqn.2026-11.org.blockwire:fake", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	deadline := time.Now().Add(5 * time.Second)
	for dials.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := dials.Load(); n < 3 {
		t.Fatalf("%d connections dialled: the session kept a connection that ended during its login and did not reinstate", n)
	}
	if n := s.Connections(); n != 2 {
		t.Errorf("the reinstated session has %d connections, want 2", n)
	}
}

// untilLogout reads what the initiator sends until a Logout Request, and
// then ends the connection (which the initiator takes for the answer).
func untilLogout(f *fakeTarget) {
	for p := range f.reqs {
		if p.h.Opcode() == pdu.OpLogoutReq {
			return
		}
	}
}

// TestReceiverReadsWhileDataOutWaits: the Data-Out an R2T asks for goes
// out beside the receiver, not from it, so a target that reads nothing for
// a while (its own receiver busy writing to us) can still hand us what it
// sends meanwhile. Sent from the receiver, each side waited on a write the
// other did not read: against our own target, 1 MiB writes at QD 32 beside
// reads stalled for 15-30 s until a send timed out.
func TestReceiverReadsWhileDataOutWaits(t *testing.T) {
	resume := make(chan struct{})
	answered := make(chan error, 1)
	d := scriptDialer{hold: func(p fakePDU) bool { return p.h.Opcode() == pdu.OpSCSICommand }, resume: resume}
	d.script = func(f *fakeTarget) {
		answered <- func() error {
			if !f.login() {
				return errors.New("no login")
			}
			cmd, ok := f.next()
			if !ok || cmd.h.Opcode() != pdu.OpSCSICommand {
				return errors.New("no command")
			}
			var c pdu.SCSICommand
			c.Decode(&cmd.h)
			var h pdu.BHS
			(&pdu.R2T{LUN: c.LUN, ITT: c.ITT, TTT: 9, StatSN: 2, ExpCmdSN: c.CmdSN + 1, MaxCmdSN: c.CmdSN + 32, Offset: 4096, Desired: 61440}).Encode(&h)
			if err := f.write(pduBytes(h, nil)); err != nil {
				return err
			}
			// Our receiver is busy: the Data-Out waits; the initiator
			// must still take this ping.
			(&pdu.NopIn{ITT: pdu.ReservedITT, TTT: pdu.ReservedTTT, StatSN: 2, ExpCmdSN: c.CmdSN + 1, MaxCmdSN: c.CmdSN + 32}).Encode(&h)
			if err := f.write(pduBytes(h, nil)); err != nil {
				return errors.New("the initiator stopped reading while its Data-Out waited for us")
			}
			close(resume)
			for got := 0; got < 61440; {
				p, ok := f.next()
				if !ok {
					return errors.New("the Data-Out did not come")
				}
				if p.h.Opcode() == pdu.OpDataOut {
					got += len(p.data)
				}
			}
			(&pdu.SCSIResponse{ITT: c.ITT, StatSN: 2, ExpCmdSN: c.CmdSN + 1, MaxCmdSN: c.CmdSN + 32}).Encode(&h)
			if err := f.write(pduBytes(h, nil)); err != nil {
				return err
			}
			untilLogout(f)
			return nil
		}()
	}
	s, err := Login(context.Background(), "fake:3260", "iqn.2026-11.org.blockwire:fake", hostileOptions(d))
	if err != nil {
		t.Fatal(err)
	}
	cdb := []byte{0x2a, 0, 0, 0, 0, 0, 0, 0, 128, 0} // WRITE(10), 128 blocks
	if _, err := s.Do(context.Background(), 0, cdb, make([]byte, 65536), nil); err != nil {
		t.Errorf("the write: %v", err)
	}
	servetest.Closes(t, s.Close, 15*time.Second)
	if err := <-answered; err != nil {
		t.Fatal(err)
	}
}
