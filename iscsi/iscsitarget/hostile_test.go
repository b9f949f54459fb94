package iscsitarget

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/internal/servetest"
	"github.com/blockwire/blockwire/iscsi/initiator"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/iscsi/text"
)

// How the target must answer a hostile PDU (RFC 7143).
type answer int

const (
	answerReject  answer = iota // a Reject with the reason; the connection stays
	answerIgnore                // no answer; the connection stays
	answerDrop                  // the connection is closed
	answerLoginNo               // a Login Response with the status, then closed
)

type hostile struct {
	name   string
	keys   []text.KV // log in with these first (nil: stay in the login phase)
	act    func(c *tclient)
	want   answer
	reason pdu.RejectReason // answerReject
	status uint16           // answerLoginNo
	log    string           // what the target's log must say
}

const chapIni = "iqn.2026-11.org.blockwire:chap-initiator"

// TestHostileInitiators is a list of hostile initiators: each
// misbehaviour gets the answer RFC 7143 prescribes (a Reject with the
// right reason, a failed login with the right status, silence, or a
// dropped connection) and a log line saying why, while a well-behaved
// session writes and verifies data the whole time on the same target.
func TestHostileInitiators(t *testing.T) {
	var logs servetest.LogBuffer
	ts := startServerLog(t, Options{LoginTimeout: 800 * time.Millisecond, NopInterval: 300 * time.Millisecond, NopTimeout: 400 * time.Millisecond},
		func(tg *Target) {
			tg.InitiatorCHAP = map[string]authCreds{chapIni: {User: "chapuser", Secret: "chap-secret-16b!"}}
			tg.MutualCHAP = &authCreds{User: "target", Secret: "target-secret-16"}
		}, &logs)

	// The well-behaved session: random writes read back and compared.
	ctx, cancel := context.WithCancel(context.Background())
	verified := make(chan error, 1)
	var ios int
	go func() {
		d, err := initiator.Open(ctx, fmt.Sprintf("iscsi://%s/%s/0", ts.addr, testIQN), initiator.Options{Dialer: &fabric.Dialer{}})
		if err != nil {
			verified <- err
			return
		}
		defer d.Close()
		buf, back := make([]byte, 64<<10), make([]byte, 64<<10)
		for ctx.Err() == nil {
			rand.Read(buf)
			off := int64(ios%64) * int64(len(buf))
			if _, err := d.WriteAt(buf, off); err != nil {
				verified <- fmt.Errorf("write at %d: %w", off, err)
				return
			}
			if _, err := d.ReadAt(back, off); err != nil {
				verified <- fmt.Errorf("read at %d: %w", off, err)
				return
			}
			if !bytes.Equal(buf, back) {
				verified <- fmt.Errorf("data at %d read back differs", off)
				return
			}
			ios++
		}
		verified <- nil
	}()

	const R = pdu.ReservedTTT
	bhs := func(op pdu.Opcode, imm bool) pdu.BHS {
		var h pdu.BHS
		h[0] = byte(op)
		if imm {
			h[0] |= 0x40
		}
		h[1] = 0x80
		return h
	}
	// liveWrite starts a WRITE(10) of 4 KiB without data and returns its
	// ITT and the TTT of the R2T that asks for it: a task in progress.
	liveWrite := func(c *tclient) (itt, ttt uint32) {
		itt = c.itt
		c.itt++
		sendCDB(c, itt, write10(2000, 8), true, 4096)
		for {
			rh, _ := c.must(5 * time.Second)
			if rh.Opcode() == pdu.OpR2T {
				var r pdu.R2T
				r.Decode(&rh)
				return itt, r.TTT
			}
		}
	}
	dataOut := func(c *tclient, itt, ttt, sn, off uint32, n int, final bool) {
		do := pdu.DataOut{Final: final, ITT: itt, TTT: ttt, DataSN: sn, Offset: off, ExpStatSN: c.expStatSN}
		var h pdu.BHS
		do.Encode(&h)
		c.sendRaw(&h, nil, make([]byte, n))
	}
	loginPDU := func(c *tclient, csg, nsg byte, transit, cont bool, data []byte) {
		req := pdu.LoginReq{Transit: transit, Continue: cont, CSG: csg, NSG: nsg, ISID: c.isid, ITT: c.itt, CmdSN: c.cmdSN}
		var h pdu.BHS
		req.Encode(&h)
		c.sendRaw(&h, nil, data)
	}
	// chapExchange runs the security stage up to the initiator's CHAP_R,
	// which respond computes from the target's CHAP_I and CHAP_C.
	chapExchange := func(c *tclient, respond func(id byte, chal []byte) []text.KV) {
		loginPDU(c, pdu.StageSecurity, pdu.StageOperational, false, false,
			text.Append(nil, kv("InitiatorName", chapIni), kv("TargetName", testIQN), kv("SessionType", "Normal"), kv("AuthMethod", "CHAP")))
		c.must(2 * time.Second)
		loginPDU(c, pdu.StageSecurity, pdu.StageOperational, false, false, text.Append(nil, kv("CHAP_A", "5")))
		_, data := c.must(2 * time.Second)
		got := map[string]string{}
		kvs, _ := text.Parse(data)
		for _, x := range kvs {
			got[x.Key] = x.Value
		}
		var id int
		fmt.Sscan(got["CHAP_I"], &id)
		chal, _ := hex.DecodeString(strings.TrimPrefix(got["CHAP_C"], "0x"))
		loginPDU(c, pdu.StageSecurity, pdu.StageOperational, true, false, text.Append(nil, respond(byte(id), chal)...))
	}
	chapR := func(id byte, secret string, chal []byte) string {
		h := md5.New()
		h.Write([]byte{id})
		h.Write([]byte(secret))
		h.Write(chal)
		return "0x" + hex.EncodeToString(h.Sum(nil))
	}

	cases := []hostile{
		{name: "data segment above MaxRecvDataSegmentLength", keys: normalKeys(ini),
			act: func(c *tclient) {
				h := bhs(pdu.OpNopOut, true)
				h.SetDataSegmentLength(300000) // declared: 262144
				c.nc.Write(h[:])
			}, want: answerDrop, log: "exceeds MaxRecvDataSegmentLength"},
		{name: "truncated PDU, then silence", keys: normalKeys(ini),
			act: func(c *tclient) {
				h := bhs(pdu.OpNopOut, true)
				c.nc.Write(h[:20])
			}, want: answerDrop, log: "NOP-In ping unanswered"},
		{name: "AHS length past the PDU", keys: normalKeys(ini),
			act: func(c *tclient) {
				cmd := pdu.SCSICommand{Final: true, Attr: pdu.AttrSimple, ITT: 0x99, CmdSN: c.cmdSN, ExpStatSN: c.expStatSN}
				var h pdu.BHS
				cmd.Encode(&h)
				// One AHS word whose own length field claims 256 bytes.
				c.sendRaw(&h, []byte{0x01, 0x00, 0x01, 0x00}, nil)
			}, want: answerReject, reason: pdu.RejectProtocolError, log: "AHS length 256 runs past"},
		{name: "unknown opcode", keys: normalKeys(ini),
			act: func(c *tclient) {
				h := bhs(pdu.Opcode(0x1b), true)
				c.sendRaw(&h, nil, nil)
			}, want: answerReject, reason: pdu.RejectCommandNotSupported, log: "unknown opcode"},
		{name: "reserved bit set (I on a Data-Out)", keys: normalKeys(ini),
			act: func(c *tclient) {
				itt, ttt := liveWrite(c)
				do := pdu.DataOut{Final: true, ITT: itt, TTT: ttt, ExpStatSN: c.expStatSN}
				var h pdu.BHS
				do.Encode(&h)
				h[0] |= 0x40
				c.sendRaw(&h, nil, make([]byte, 4096))
			}, want: answerReject, reason: pdu.RejectInvalidPDUField, log: "I bit set on Data-Out"},
		{name: "CmdSN outside the window", keys: normalKeys(ini),
			act: func(c *tclient) {
				cmd := pdu.SCSICommand{Final: true, Attr: pdu.AttrSimple, ITT: 0x77, CmdSN: c.cmdSN + 100000, ExpStatSN: c.expStatSN}
				copy(cmd.CDB[:], tur())
				var h pdu.BHS
				cmd.Encode(&h)
				c.sendRaw(&h, nil, nil)
			}, want: answerIgnore, log: "outside the CmdSN window"},
		{name: "ITT reused while its task is live", keys: normalKeys(ini),
			act: func(c *tclient) {
				itt, _ := liveWrite(c)
				cmd := pdu.SCSICommand{Final: true, Attr: pdu.AttrSimple, ITT: itt, CmdSN: c.cmdSN, ExpStatSN: c.expStatSN}
				c.cmdSN++
				copy(cmd.CDB[:], tur())
				var h pdu.BHS
				cmd.Encode(&h)
				c.sendRaw(&h, nil, nil)
			}, want: answerReject, reason: pdu.RejectTaskInProgress, log: "already in use"},
		{name: "Data-Out with an unknown TTT", keys: normalKeys(ini),
			act: func(c *tclient) {
				itt, ttt := liveWrite(c)
				dataOut(c, itt, ttt+1000, 0, 0, 4096, true)
			}, want: answerReject, reason: pdu.RejectInvalidPDUField, log: "unknown TTT"},
		{name: "Data-Out beyond the expected transfer length", keys: normalKeys(ini),
			act: func(c *tclient) {
				itt, ttt := liveWrite(c)
				dataOut(c, itt, ttt, 0, 8192, 4096, true)
			}, want: answerReject, reason: pdu.RejectProtocolError, log: "beyond Expected Data Transfer Length"},
		{name: "overlapping Data-Out in one burst", keys: normalKeys(ini),
			act: func(c *tclient) {
				itt, ttt := liveWrite(c)
				dataOut(c, itt, ttt, 0, 0, 2048, false)
				dataOut(c, itt, ttt, 1, 1024, 2048, true)
			}, want: answerReject, reason: pdu.RejectProtocolError, log: "expected 2048"},
		{name: "more unsolicited data than FirstBurstLength",
			keys: normalKeys(ini, kv("InitialR2T", "No"), kv("FirstBurstLength", "8192"), kv("MaxBurstLength", "65536")),
			act: func(c *tclient) {
				cmd := pdu.SCSICommand{Write: true, Attr: pdu.AttrSimple, ITT: 0x55, EDTL: 32768, CmdSN: c.cmdSN, ExpStatSN: c.expStatSN}
				c.cmdSN++
				copy(cmd.CDB[:], write10(3000, 64))
				var h pdu.BHS
				cmd.Encode(&h)
				c.sendRaw(&h, nil, nil)
				dataOut(c, 0x55, R, 0, 0, 16384, true)
			}, want: answerReject, reason: pdu.RejectProtocolError, log: "exceeds FirstBurstLength"},
		{name: "text request that never sets F", keys: normalKeys(ini),
			act: func(c *tclient) {
				chunk := text.Append(nil, kv("X-org.blockwire.junk", strings.Repeat("j", 4000)))
				ttt := uint32(R)
				for i := 0; i < 20; i++ {
					req := pdu.TextReq{Continue: true, ITT: 0x4000, TTT: ttt, CmdSN: c.cmdSN, ExpStatSN: c.expStatSN}
					var h pdu.BHS
					req.Encode(&h)
					c.sendRaw(&h, nil, chunk)
					c.cmdSN++ // each part takes its CmdSN (RFC 7143 §4.2.2.1)
					rh, _ := c.must(2 * time.Second)
					if rh.Opcode() == pdu.OpReject {
						c.pending = &rh
						return
					}
					var tr pdu.TextResp
					tr.Decode(&rh)
					ttt = tr.TTT
				}
			}, want: answerReject, reason: pdu.RejectProtocolError, log: "text request exceeds"},
		{name: "SCSI command before login",
			act: func(c *tclient) {
				cmd := pdu.SCSICommand{Final: true, Attr: pdu.AttrSimple, ITT: 1}
				copy(cmd.CDB[:], tur())
				var h pdu.BHS
				cmd.Encode(&h)
				c.sendRaw(&h, nil, nil)
			}, want: answerLoginNo, status: pdu.LoginStatusInvalidDuringLogin, log: "SCSI Command received during login"},
		{name: "login jumping to a reserved stage",
			act: func(c *tclient) {
				loginPDU(c, pdu.StageOperational, 2, true, false, text.Append(nil, normalKeys(ini)...))
			}, want: answerLoginNo, status: pdu.LoginStatusInitiatorError, log: "stage 2 is reserved"},
		{name: "login going back from operational to security",
			act: func(c *tclient) {
				loginPDU(c, pdu.StageOperational, pdu.StageSecurity, true, false, text.Append(nil, normalKeys(ini)...))
			}, want: answerLoginNo, status: pdu.LoginStatusInitiatorError, log: "does not advance"},
		{name: "login repeating a key",
			act: func(c *tclient) {
				loginPDU(c, pdu.StageOperational, pdu.StageFullFeature, true, false,
					text.Append(nil, normalKeys(ini, kv("MaxBurstLength", "512"), kv("MaxBurstLength", "1024"))...))
			}, want: answerLoginNo, status: pdu.LoginStatusInitiatorError, log: "MaxBurstLength"},
		{name: "login with 64 KiB of keys",
			act: func(c *tclient) {
				junk := text.Append(nil, kv("X-org.blockwire.junk", strings.Repeat("k", 8000)))
				for i := 0; i < 9; i++ {
					loginPDU(c, pdu.StageOperational, pdu.StageFullFeature, false, true, junk)
					if rh, _ := c.must(2 * time.Second); rh[36] != 0 {
						c.pending = &rh
						return
					}
				}
			}, want: answerLoginNo, status: pdu.LoginStatusInitiatorError, log: "login text exceeds"},
		{name: "login that never finishes",
			act: func(c *tclient) {
				loginPDU(c, pdu.StageOperational, pdu.StageFullFeature, false, false, text.Append(nil, normalKeys(ini)...))
				c.must(2 * time.Second)
			}, want: answerDrop, log: "login not complete"},
		{name: "CHAP with a wrong response",
			act: func(c *tclient) {
				chapExchange(c, func(id byte, chal []byte) []text.KV {
					return []text.KV{kv("CHAP_N", "chapuser"), kv("CHAP_R", chapR(id, "not-the-secret!!", chal))}
				})
			}, want: answerLoginNo, status: pdu.LoginStatusAuthFailure, log: "wrong CHAP_N or CHAP_R"},
		{name: "CHAP with the target's own challenge reflected",
			act: func(c *tclient) {
				chapExchange(c, func(id byte, chal []byte) []text.KV {
					return []text.KV{kv("CHAP_N", "chapuser"), kv("CHAP_R", chapR(id, "chap-secret-16b!", chal)),
						kv("CHAP_I", fmt.Sprint(id)), kv("CHAP_C", "0x"+hex.EncodeToString(chal))}
				})
			}, want: answerLoginNo, status: pdu.LoginStatusAuthFailure, log: "reflect"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := len(logs.String())
			c := dial(t, ts.addr)
			c.isid[5] = 0x42
			if tc.keys != nil {
				c.mustLogin(tc.keys...)
				c.command(tur(), false, 0, nil, 0) // the power-on unit attention
			}
			tc.act(c)
			switch tc.want {
			case answerReject:
				rh := c.nextNonNop(t)
				if rh.Opcode() != pdu.OpReject || pdu.RejectReason(rh[2]) != tc.reason {
					t.Fatalf("got %s (byte 2 %#x), want Reject %#x", rh.Opcode(), rh[2], tc.reason)
				}
				c.stillServes(t)
			case answerIgnore:
				if rh, _, ok := c.recv(400 * time.Millisecond); ok && rh.Opcode() != pdu.OpNopIn {
					t.Fatalf("answered with %s", rh.Opcode())
				}
				c.nc.SetReadDeadline(time.Time{})
				c.stillServes(t)
			case answerLoginNo:
				rh := c.nextNonNop(t)
				if st := uint16(rh[36])<<8 | uint16(rh[37]); rh.Opcode() != pdu.OpLoginResp || st != tc.status {
					t.Fatalf("got %s status %04x, want Login Response %04x", rh.Opcode(), st, tc.status)
				}
				fallthrough
			case answerDrop:
				deadline := time.Now().Add(5 * time.Second)
				for {
					if _, _, ok := c.recv(time.Until(deadline)); !ok {
						break
					}
				}
				if time.Now().After(deadline) {
					t.Fatal("the connection was not dropped")
				}
			}
			waitLog(t, &logs, before, tc.log)
		})
	}
	cancel()
	if err := <-verified; err != nil {
		t.Fatalf("the well-behaved session: %v", err)
	}
	if ios < 10 {
		t.Fatalf("the well-behaved session verified only %d writes", ios)
	}
	t.Logf("the well-behaved session verified %d 64 KiB writes meanwhile", ios)
}

// nextNonNop returns the next PDU that is not a NOP-In ping (answering
// pings), or the one an action already read.
func (c *tclient) nextNonNop(t *testing.T) pdu.BHS {
	t.Helper()
	if c.pending != nil {
		h := *c.pending
		c.pending = nil
		return h
	}
	for {
		rh, _, ok := c.recv(5 * time.Second)
		if !ok {
			t.Fatal("the connection closed instead of answering")
		}
		if rh.Opcode() != pdu.OpNopIn {
			return rh
		}
		c.pong(rh)
	}
}

// pong answers a target's NOP-In ping.
func (c *tclient) pong(rh pdu.BHS) {
	var n pdu.NopIn
	if n.Decode(&rh) != nil || n.TTT == pdu.ReservedTTT {
		return
	}
	out := pdu.NopOut{Immediate: true, ITT: pdu.ReservedITT, TTT: n.TTT, CmdSN: c.cmdSN, ExpStatSN: c.expStatSN}
	var h pdu.BHS
	out.Encode(&h)
	c.sendRaw(&h, nil, nil)
}

// stillServes checks that the connection still carries commands: a ping
// is answered.
func (c *tclient) stillServes(t *testing.T) {
	t.Helper()
	nop := pdu.NopOut{Immediate: true, ITT: 0x7777, TTT: pdu.ReservedTTT, CmdSN: c.cmdSN, ExpStatSN: c.expStatSN}
	var h pdu.BHS
	nop.Encode(&h)
	c.sendRaw(&h, nil, nil)
	for {
		rh, _, ok := c.recv(5 * time.Second)
		if !ok {
			t.Fatal("the connection closed after the answer")
		}
		switch {
		case rh.Opcode() == pdu.OpNopIn && rh.ITT() == 0x7777:
			return
		case rh.Opcode() == pdu.OpNopIn:
			c.pong(rh)
		case rh.Opcode() == pdu.OpReject, rh.Opcode() == pdu.OpSCSIResponse, rh.Opcode() == pdu.OpR2T:
		default:
			t.Fatalf("after the answer: %s", rh.Opcode())
		}
	}
}

func waitLog(t *testing.T, logs *servetest.LogBuffer, from int, want string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		if strings.Contains(logs.String()[from:], want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the target's log does not say %q:\n%s", want, logs.String()[from:])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCHAPSecretRules: RFC 7143 §12.1.3 — a secret under 96 bits, or a
// target secret that an initiator also uses, is refused when the target
// is configured, before any initiator could try it.
func TestCHAPSecretRules(t *testing.T) {
	srv := NewServer(nil, Options{})
	dev := startServer(t, Options{}, nil).dev
	for name, tg := range map[string]*Target{
		"short CHAP secret":      {Name: "iqn.2026-11.org.blockwire:a", Device: dev, CHAP: &authCreds{User: "u", Secret: "short"}},
		"short initiator secret": {Name: "iqn.2026-11.org.blockwire:b", Device: dev, InitiatorCHAP: map[string]authCreds{ini: {User: "u", Secret: "elevenbytes"}}},
		"short mutual secret":    {Name: "iqn.2026-11.org.blockwire:c", Device: dev, CHAP: &authCreds{User: "u", Secret: "long-enough-1"}, MutualCHAP: &authCreds{User: "t", Secret: "tiny"}},
		"shared secret":          {Name: "iqn.2026-11.org.blockwire:d", Device: dev, CHAP: &authCreds{User: "u", Secret: "same-secret-12"}, MutualCHAP: &authCreds{User: "t", Secret: "same-secret-12"}},
	} {
		if err := srv.AddTarget(tg); err == nil || !strings.Contains(err.Error(), "§12.1.3") {
			t.Errorf("%s: AddTarget returned %v", name, err)
		}
	}
	ok := &Target{Name: "iqn.2026-11.org.blockwire:e", Device: dev, CHAP: &authCreds{User: "u", Secret: "twelve-bytes"}, MutualCHAP: &authCreds{User: "t", Secret: "other-secret"}}
	if err := srv.AddTarget(ok); err != nil {
		t.Fatalf("12-byte secrets: %v", err)
	}
}

// TestLimitsAtTheirEdges: each configurable limit admits exactly its
// value and refuses one more, with the answer RFC 7143 gives.
func TestLimitsAtTheirEdges(t *testing.T) {
	t.Run("MaxConnections", func(t *testing.T) {
		ts := startServer(t, Options{MaxConnections: 2}, nil)
		a := dial(t, ts.addr)
		_, keys := a.login(normalKeys(ini, kv("MaxConnections", "8"))...)
		if keys["MaxConnections"] != "2" {
			t.Fatalf("MaxConnections answered %q, want 2", keys["MaxConnections"])
		}
		b := dial(t, ts.addr)
		b.tsih, b.cid = a.tsih, 1
		b.mustLogin(normalKeys(ini, kv("MaxConnections", "8"))...)
		c := dial(t, ts.addr)
		c.tsih, c.cid = a.tsih, 2
		if st, _ := c.login(normalKeys(ini, kv("MaxConnections", "8"))...); st != pdu.LoginStatusTooManyConnections {
			t.Fatalf("third connection: status %04x, want 0206", st)
		}
	})
	t.Run("MaxRecvDataSegmentLength", func(t *testing.T) {
		ts := startServer(t, Options{MaxRecvDataSegmentLength: 8192}, nil)
		c := dial(t, ts.addr)
		if _, keys := c.login(normalKeys(ini)...); keys["MaxRecvDataSegmentLength"] != "8192" {
			t.Fatalf("declared %q", keys["MaxRecvDataSegmentLength"])
		}
		ping := func(n int) {
			nop := pdu.NopOut{Immediate: true, ITT: uint32(n), TTT: pdu.ReservedTTT, CmdSN: c.cmdSN, ExpStatSN: c.expStatSN}
			var h pdu.BHS
			nop.Encode(&h)
			c.sendRaw(&h, nil, make([]byte, n))
		}
		ping(8192)
		if rh, _ := c.must(5 * time.Second); rh.Opcode() != pdu.OpNopIn || rh.ITT() != 8192 || rh.DataSegmentLength() != 8192 {
			t.Fatalf("8192-byte ping: %s with %d bytes", rh.Opcode(), rh.DataSegmentLength())
		}
		ping(8193)
		if _, _, ok := c.recv(3 * time.Second); ok {
			t.Fatal("an 8193-byte data segment did not drop the connection")
		}
	})
	t.Run("CmdWindow", func(t *testing.T) {
		ts := startServer(t, Options{CmdWindow: 4}, nil)
		c := dial(t, ts.addr)
		c.mustLogin(normalKeys(ini)...)
		cmd := func(sn uint32) {
			x := pdu.SCSICommand{Final: true, Attr: pdu.AttrSimple, ITT: 0x100 + sn, CmdSN: sn, ExpStatSN: c.expStatSN}
			copy(x.CDB[:], tur())
			var h pdu.BHS
			x.Encode(&h)
			c.sendRaw(&h, nil, nil)
		}
		cmd(c.cmdSN)
		rh := c.nextNonNop(t)
		exp, mx := binary.BigEndian.Uint32(rh[28:]), binary.BigEndian.Uint32(rh[32:])
		if mx-exp+1 != 4 {
			t.Fatalf("window [%d, %d], want 4 commands", exp, mx)
		}
		// One past MaxCmdSN is ignored; the window's whole range, sent
		// without waiting, is answered.
		cmd(mx + 1)
		for sn := exp; sn != mx+1; sn++ {
			cmd(sn)
		}
		answered := map[uint32]bool{}
		for len(answered) < 4 {
			rh := c.nextNonNop(t)
			answered[rh.ITT()-0x100] = true
		}
		if answered[mx+1] {
			t.Fatal("the command one past MaxCmdSN was executed")
		}
		if rh, _, ok := c.recv(300 * time.Millisecond); ok && rh.Opcode() != pdu.OpNopIn {
			t.Fatalf("then %s (ITT %#x)", rh.Opcode(), rh.ITT())
		}
	})
}
