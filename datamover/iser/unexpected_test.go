package iser

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/iscsi/pdu"
)

// bhs builds a BHS: opcode (with the immediate bit when imm), ITT, TTT
// (bytes 20-23), CmdSN or StatSN (24-27), ExpStatSN or ExpCmdSN (28-31).
func bhs(op pdu.Opcode, imm bool, itt, ttt, sn, exp uint32) pdu.BHS {
	var h pdu.BHS
	h[0] = byte(op)
	if imm {
		h[0] |= 0x40
	}
	h[1] = 0x80
	binary.BigEndian.PutUint32(h[16:], itt)
	binary.BigEndian.PutUint32(h[20:], ttt)
	binary.BigEndian.PutUint32(h[24:], sn)
	binary.BigEndian.PutUint32(h[28:], exp)
	return h
}

// TestLedgerFromInitiator follows RFC 5046 §8.1.1.3: immediate PDUs are
// unexpected (a ping's answer is not); one with CmdSN x retires once a
// non-immediate PDU with CmdSN y ≥ x went on the connection and the target
// answered with ExpCmdSN ≥ y+1.
func TestLedgerFromInitiator(t *testing.T) {
	ini, tgt := ledger{limit: 2}, ledger{}
	const R = pdu.ReservedTTT
	for _, h := range []pdu.BHS{
		bhs(pdu.OpNopOut, true, 1, R, 5, 0),        // a ping: unexpected
		bhs(pdu.OpTaskMgmtReq, true, 2, R, 5, 0),   // an immediate TMF: unexpected
		bhs(pdu.OpNopOut, true, R, 77, 5, 0),       // the answer to a target's ping: expected
		bhs(pdu.OpDataOut, false, 3, R, 0, 0),      // unsolicited data: expected
		bhs(pdu.OpSCSICommand, false, 4, R, 5, 0),  // regulated, CmdSN 5
		bhs(pdu.OpSCSICommand, false, 5, R, 6, 0),  // regulated, CmdSN 6
		bhs(pdu.OpLogoutReq, false, 6, R, 7, 0),    // regulated, CmdSN 7
		bhs(pdu.OpTextReq, false, 7, R, 8, 0),      // regulated, CmdSN 8
		bhs(pdu.OpSCSICommand, false, 8, R, 9, 0),  // regulated, CmdSN 9
		bhs(pdu.OpSCSICommand, false, 9, R, 10, 0), // regulated, CmdSN 10
	} {
		if initiatorPDU(&h, &ini, &tgt) {
			t.Fatalf("%s counted over the limit", h.Opcode())
		}
	}
	if len(ini.sns) != 2 {
		t.Fatalf("outstanding %v, want the ping and the TMF", ini.sns)
	}
	over := bhs(pdu.OpTextReq, true, 10, R, 11, 0)
	if !initiatorPDU(&over, &ini, &tgt) {
		t.Fatal("a third unexpected PDU with a limit of 2 was not reported")
	}
	ini.sns, ini.ttts = ini.sns[:2], ini.ttts[:2]
	// ExpCmdSN 5 acknowledges nothing sent after the two; 6 covers the
	// command with CmdSN 5 and so retires both (x = 5 ≤ y = 5).
	resp := bhs(pdu.OpSCSIResponse, false, 4, 0, 1, 5)
	targetPDU(&resp, nil, &ini, &tgt)
	if len(ini.sns) != 2 {
		t.Fatalf("ExpCmdSN 5 retired %v", ini.sns)
	}
	resp = bhs(pdu.OpSCSIResponse, false, 4, 0, 1, 6)
	targetPDU(&resp, nil, &ini, &tgt)
	if len(ini.sns) != 0 || len(ini.ys) != 0 {
		t.Fatalf("ExpCmdSN 6 left %v (ys %v)", ini.sns, ini.ys)
	}
	// With no regulated PDU after it, no ExpCmdSN retires an immediate
	// one: the CmdSN it carries was never consumed.
	h := bhs(pdu.OpNopOut, true, 11, R, 11, 0)
	initiatorPDU(&h, &ini, &tgt)
	resp = bhs(pdu.OpNopIn, false, 11, R, 1, 100)
	targetPDU(&resp, nil, &ini, &tgt)
	if len(ini.sns) != 1 {
		t.Fatalf("an ExpCmdSN without a regulated PDU retired %v", ini.sns)
	}
}

// TestLedgerFromTarget follows RFC 5046 §8.1.2: Async Messages, Rejects
// that are not a request's answer and NOP-Ins with ITT 0xffffffff are
// unexpected; StatSN x retires with ExpStatSN ≥ x+1, a ping also with its
// answer.
func TestLedgerFromTarget(t *testing.T) {
	ini, tgt := ledger{}, ledger{limit: 3}
	const R = pdu.ReservedTTT
	rejected := func(op pdu.Opcode, itt uint32) []byte {
		h := bhs(op, false, itt, R, 0, 0)
		return h[:]
	}
	for _, tc := range []struct {
		h    pdu.BHS
		data []byte
		want bool
	}{
		{bhs(pdu.OpAsyncMsg, false, R, 0, 10, 0), nil, true},
		{bhs(pdu.OpNopIn, false, R, 9, 11, 0), nil, true},                              // a ping
		{bhs(pdu.OpNopIn, false, 4, R, 11, 0), nil, false},                             // answers a ping
		{bhs(pdu.OpReject, false, R, 0, 11, 0), rejected(pdu.OpSCSICommand, 5), false}, // instead of a response
		{bhs(pdu.OpReject, false, R, 0, 12, 0), rejected(pdu.OpNopOut, 6), false},      // a ping's Reject
		{bhs(pdu.OpReject, false, R, 0, 13, 0), rejected(pdu.OpDataOut, 7), true},      // after the task is active
		{bhs(pdu.OpSCSIResponse, false, 5, 0, 14, 0), nil, false},
	} {
		before := len(tgt.sns)
		if targetPDU(&tc.h, tc.data, &ini, &tgt) {
			t.Fatalf("%s counted over the limit", tc.h.Opcode())
		}
		if got := len(tgt.sns) > before; got != tc.want {
			t.Errorf("%s (data %x…): unexpected %v, want %v", tc.h.Opcode(), tc.data[:min(len(tc.data), 1)], got, tc.want)
		}
	}
	extra := bhs(pdu.OpAsyncMsg, false, R, 0, 15, 0)
	if !targetPDU(&extra, nil, &ini, &tgt) {
		t.Fatal("a fourth unexpected PDU with a limit of 3 was not reported")
	}
	tgt.sns, tgt.ttts = tgt.sns[:3], tgt.ttts[:3]
	// ExpStatSN 11 retires the Async Message (StatSN 10) only.
	h := bhs(pdu.OpSCSICommand, false, 20, R, 30, 11)
	initiatorPDU(&h, &ini, &tgt)
	if len(tgt.sns) != 2 {
		t.Fatalf("ExpStatSN 11 left %v", tgt.sns)
	}
	// The ping's answer retires the ping whatever its ExpStatSN.
	h = bhs(pdu.OpNopOut, true, R, 9, 31, 11)
	initiatorPDU(&h, &ini, &tgt)
	if len(tgt.sns) != 1 || tgt.sns[0] != 13 {
		t.Fatalf("the ping's answer left %v", tgt.sns)
	}
	h = bhs(pdu.OpDataOut, false, 5, R, 0, 14)
	initiatorPDU(&h, &ini, &tgt)
	if len(tgt.sns) != 0 {
		t.Fatalf("ExpStatSN 14 left %v", tgt.sns)
	}
}

func enable(c *Conn, own, peer int) {
	c.NoticeKeyValues(datamover.Params{RDMAExtensions: true, MaxOutstandingUnexpectedPDUs: own, PeerMaxOutstandingUnexpectedPDUs: peer})
	c.EnableDatamover(nil)
}

func (u *upcalls) waitFor(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		u.mu.Lock()
		got := len(u.pdus)
		u.mu.Unlock()
		if got >= n {
			return
		}
	}
	t.Fatalf("the datamover did not deliver %d PDUs", n)
}

// TestTargetEnforcesUnexpectedLimit: an initiator that sends more
// unexpected PDUs than the target declared is a protocol error (RFC 5046
// §10.1.3.4): the stream ends. Retired ones do not count.
func TestTargetEnforcesUnexpectedLimit(t *testing.T) {
	c, peer := pair(t, Options{})
	enable(c, 2, 0)
	u := newUpcalls()
	go c.Serve(u)
	const R = pdu.ReservedTTT
	send := func(h pdu.BHS) {
		msg := make([]byte, HeaderLenLinux+pdu.BHSLen)
		(&Header{}).Encode(msg, HeaderLenLinux)
		copy(msg[HeaderLenLinux:], h[:])
		peer.send(t, msg)
	}
	send(bhs(pdu.OpNopOut, true, 1, R, 1, 0))
	send(bhs(pdu.OpTaskMgmtReq, true, 2, R, 1, 0))
	send(bhs(pdu.OpNopOut, false, 3, R, 1, 0)) // regulated, CmdSN 1
	u.waitFor(t, 3)
	// The target's answer with ExpCmdSN 2 retires both.
	resp := datamover.PDU{BHS: bhs(pdu.OpNopIn, false, 3, R, 1, 2)}
	if err := c.SendControl(&resp, true); err != nil {
		t.Fatal(err)
	}
	peer.recv(t)
	send(bhs(pdu.OpNopOut, true, 4, R, 2, 0))
	send(bhs(pdu.OpTextReq, true, 5, R, 2, 0))
	u.waitFor(t, 5)
	select {
	case err := <-u.ended:
		t.Fatalf("ended after retired PDUs: %v", err)
	default:
	}
	send(bhs(pdu.OpLogoutReq, true, 6, R, 2, 0))
	err := ended(t, u)
	if err == nil || !strings.Contains(err.Error(), "MaxOutstandingUnexpectedPDUs") {
		t.Fatalf("ended with %v", err)
	}
	var fe *FormatError
	if !errors.As(err, &fe) {
		t.Fatalf("%v is not handled as a format error", err)
	}
}

// TestUnexpectedSendLimits: neither side sends more unexpected PDUs than
// the peer declared (RFC 5046 §8.1.1.3, §8.1.2); the target keeps its last
// one for a ping, and retirement makes room again.
func TestUnexpectedSendLimits(t *testing.T) {
	const R = pdu.ReservedTTT
	t.Run("target", func(t *testing.T) {
		c, peer := pair(t, Options{})
		enable(c, 0, 2)
		u := newUpcalls()
		go c.Serve(u)
		sendCtl := func(h pdu.BHS) error { p := datamover.PDU{BHS: h}; return c.SendControl(&p, false) }
		if err := sendCtl(bhs(pdu.OpAsyncMsg, false, R, 0, 10, 1)); err != nil {
			t.Fatal(err)
		}
		peer.recv(t)
		if err := sendCtl(bhs(pdu.OpAsyncMsg, false, R, 0, 11, 1)); !errors.Is(err, datamover.ErrUnexpectedLimit) {
			t.Fatalf("a second Async Message with a limit of 2: %v, want ErrUnexpectedLimit (the last is a ping's)", err)
		}
		if err := sendCtl(bhs(pdu.OpNopIn, false, R, 9, 11, 1)); err != nil {
			t.Fatalf("the ping kept in reserve: %v", err)
		}
		peer.recv(t)
		if err := sendCtl(bhs(pdu.OpNopIn, false, R, 10, 11, 1)); !errors.Is(err, datamover.ErrUnexpectedLimit) {
			t.Fatalf("a third: %v", err)
		}
		// Expected PDUs are never held back.
		if err := sendCtl(bhs(pdu.OpSCSIResponse, false, 1, 0, 11, 1)); err != nil {
			t.Fatal(err)
		}
		peer.recv(t)
		// The ping's answer (ExpStatSN 11) retires the Async Message and
		// the ping.
		msg := make([]byte, HeaderLenLinux+pdu.BHSLen)
		(&Header{}).Encode(msg, HeaderLenLinux)
		h := bhs(pdu.OpNopOut, true, R, 9, 1, 11)
		copy(msg[HeaderLenLinux:], h[:])
		peer.send(t, msg)
		u.waitFor(t, 1)
		if err := sendCtl(bhs(pdu.OpAsyncMsg, false, R, 0, 12, 1)); err != nil {
			t.Fatalf("after retirement: %v", err)
		}
	})
	t.Run("initiator", func(t *testing.T) {
		c, peer := pair(t, Options{Initiator: true})
		enable(c, 0, 2)
		u := newUpcalls()
		go c.Serve(u)
		sendCtl := func(h pdu.BHS) error { p := datamover.PDU{BHS: h}; return c.SendControl(&p, false) }
		for i := uint32(1); i <= 2; i++ {
			if err := sendCtl(bhs(pdu.OpNopOut, true, i, R, 1, 1)); err != nil {
				t.Fatal(err)
			}
			peer.recv(t)
		}
		if err := sendCtl(bhs(pdu.OpTaskMgmtReq, true, 3, R, 1, 1)); !errors.Is(err, datamover.ErrUnexpectedLimit) {
			t.Fatalf("a third immediate PDU with a limit of 2: %v, want ErrUnexpectedLimit", err)
		}
		// The answer to a ping is expected, and a regulated PDU goes.
		if err := sendCtl(bhs(pdu.OpNopOut, true, R, 5, 1, 1)); err != nil {
			t.Fatal(err)
		}
		peer.recv(t)
		p := datamover.PDU{BHS: bhs(pdu.OpTaskMgmtReq, false, 3, R, 1, 1)}
		if err := c.SendControl(&p, true); err != nil {
			t.Fatal(err)
		}
		peer.recv(t)
		// The target's answer with ExpCmdSN 2 retires all three.
		msg := make([]byte, HeaderLenLinux+pdu.BHSLen)
		(&Header{}).Encode(msg, HeaderLenLinux)
		h := bhs(pdu.OpTaskMgmtResp, false, 3, R, 1, 2)
		copy(msg[HeaderLenLinux:], h[:])
		peer.send(t, msg)
		u.waitFor(t, 1)
		if err := sendCtl(bhs(pdu.OpNopOut, true, 6, R, 2, 1)); err != nil {
			t.Fatalf("after retirement: %v", err)
		}
	})
}
