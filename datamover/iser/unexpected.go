package iser

import (
	"github.com/blockwire/blockwire/internal/serial"
	"github.com/blockwire/blockwire/iscsi/pdu"
)

// Flow control for "unexpected" control-type PDUs (RFC 5046 §8.1, RFC
// 5046 §8.1). Sends carry no credit in RDMA, so each side declares with
// MaxOutstandingUnexpectedPDUs how many PDUs outside iSCSI's own flow
// control it can buffer (0: no limit), and the sender counts them until
// they are retired:
//
//   - From the initiator (§8.1.1.3): PDUs with the immediate flag, except
//     a NOP-Out that answers a target's ping. One with CmdSN x is retired
//     once the initiator has sent a non-immediate control-type PDU with
//     CmdSN y ≥ x on the connection and the target has answered with
//     ExpCmdSN ≥ y+1.
//   - From the target (§8.1.2): Asynchronous Messages, Rejects that do not
//     stand for the response to a request, and NOP-Ins with ITT 0xffffffff.
//     One with StatSN x is retired by an initiator PDU with ExpStatSN ≥
//     x+1; a ping (TTT ≠ 0xffffffff) also by the NOP-Out that answers it.
//
// Both ends keep both ledgers. The sender refuses to exceed the peer's
// limit (ErrUnexpectedLimit); the receiver counts what arrives and treats
// more than it declared as a protocol error. The receiver adds later and
// retires earlier than the sender, so its count never runs ahead of a
// sender that follows the rules.

// ledger counts the outstanding unexpected PDUs of one direction.
type ledger struct {
	limit int      // the receiver's declaration; 0 is no limit
	sns   []uint32 // CmdSN (initiator's) or StatSN (target's) of each one
	ttts  []uint32 // the TTT of a target's ping, else pdu.ReservedTTT
	ys    []uint32 // initiator's: non-immediate CmdSNs seen since the oldest
}

func (l *ledger) full(reserve int) bool {
	return l.limit > 0 && len(l.sns)+reserve >= l.limit
}

func (l *ledger) add(sn, ttt uint32) {
	l.sns = append(l.sns, sn)
	l.ttts = append(l.ttts, ttt)
}

// retireWhere drops the entries for which done returns true.
func (l *ledger) retireWhere(done func(sn, ttt uint32) bool) {
	k := 0
	for i, sn := range l.sns {
		if !done(sn, l.ttts[i]) {
			l.sns[k], l.ttts[k] = sn, l.ttts[i]
			k++
		}
	}
	l.sns, l.ttts = l.sns[:k], l.ttts[:k]
	if k == 0 {
		l.ys = l.ys[:0]
	}
}

// nonImmediate notes an initiator's regulated PDU with CmdSN y.
func (l *ledger) nonImmediate(y uint32) {
	if len(l.sns) == 0 {
		return // nothing it could retire
	}
	if n := len(l.ys); n > 0 && l.ys[n-1] == y {
		return
	}
	if len(l.ys) >= 1024 {
		// Only the newest y below ExpCmdSN matters; a backlog this long
		// means responses stopped, and dropping the oldest only delays
		// retirement.
		l.ys = append(l.ys[:0], l.ys[len(l.ys)-512:]...)
	}
	l.ys = append(l.ys, y)
}

// expCmdSN applies a target PDU's ExpCmdSN to the initiator's ledger.
func (l *ledger) expCmdSN(e uint32) {
	if len(l.sns) == 0 {
		return
	}
	k := -1
	for i, y := range l.ys {
		if serial.LessThan(y, e) {
			k = i
		}
	}
	if k < 0 {
		return
	}
	y := l.ys[k]
	l.ys = append(l.ys[:0], l.ys[k+1:]...)
	l.retireWhere(func(x, _ uint32) bool { return serial.LessOrEqual(x, y) })
}

// initiatorUnexpected reports whether an initiator's control PDU is
// unexpected (RFC 5046 §8.1.1.3).
func initiatorUnexpected(h *pdu.BHS) bool {
	switch h.Opcode() {
	case pdu.OpSCSICommand, pdu.OpTaskMgmtReq, pdu.OpTextReq, pdu.OpLogoutReq:
		return h.Immediate()
	case pdu.OpNopOut:
		// Not the answer to a target's ping (§8.1.1.2).
		return h.Immediate() && h.TTT() == pdu.ReservedTTT
	}
	return false // Data-Out and SNACK: expected, no CmdSN
}

// initiatorPDU applies an initiator's control PDU, sent or received, to
// both ledgers: its ExpStatSN (and a ping's answer) retires the target's
// unexpected PDUs; a regulated one is noted for retiring the initiator's;
// an unexpected one is added. It reports whether the initiator's ledger
// now exceeds its limit.
func initiatorPDU(h *pdu.BHS, init, targ *ledger) (over bool) {
	op := h.Opcode()
	if len(targ.sns) > 0 {
		exp := h.ExpStatSN()
		pong := op == pdu.OpNopOut && h.ITT() == pdu.ReservedITT
		ttt := h.TTT()
		targ.retireWhere(func(x, t uint32) bool {
			return serial.LessThan(x, exp) || pong && t != pdu.ReservedTTT && t == ttt
		})
	}
	cmdSN := h.CmdSN()
	switch {
	case initiatorUnexpected(h):
		if init.limit == 0 {
			return false // no limit: nothing to count
		}
		init.add(cmdSN, pdu.ReservedTTT)
		return len(init.sns) > init.limit
	case !h.Immediate() && op != pdu.OpDataOut && op != pdu.OpSNACKReq:
		init.nonImmediate(cmdSN)
	}
	return false
}

// targetPDU applies a target's control PDU, sent or received: its
// ExpCmdSN retires the initiator's unexpected PDUs, and an unexpected one
// is added. It reports whether the target's ledger now exceeds its limit.
func targetPDU(h *pdu.BHS, data []byte, init, targ *ledger) (over bool) {
	init.expCmdSN(h.ExpCmdSN())
	if u, ttt := targetUnexpected(h, data); u && targ.limit > 0 {
		targ.add(h.StatSN(), ttt)
		return len(targ.sns) > targ.limit
	}
	return false
}

// targetUnexpected reports whether a target's PDU is unexpected (RFC 5046
// §8.1.2) and the TTT of a ping. data is the PDU's data segment.
func targetUnexpected(h *pdu.BHS, data []byte) (bool, uint32) {
	switch h.Opcode() {
	case pdu.OpAsyncMsg:
		return true, pdu.ReservedTTT
	case pdu.OpNopIn:
		if h.ITT() == pdu.ReservedITT {
			return true, h.TTT()
		}
	case pdu.OpReject:
		// A Reject in place of the response to a request (§8.1.1.1) is
		// expected; one for anything else (a Data-Out, a SNACK, a
		// ping's answer, garbage) is not.
		if len(data) < pdu.BHSLen {
			return true, pdu.ReservedTTT
		}
		var r pdu.BHS
		copy(r[:], data)
		switch r.Opcode() {
		case pdu.OpSCSICommand, pdu.OpTaskMgmtReq, pdu.OpTextReq, pdu.OpLogoutReq:
			return false, 0
		case pdu.OpNopOut:
			return r.ITT() == pdu.ReservedITT, pdu.ReservedTTT
		}
		return true, pdu.ReservedTTT
	}
	return false, 0
}

// unexpectedError is the protocol error of a peer that sent more
// unexpected PDUs than this side declared it can receive.
func unexpectedError(h *pdu.BHS, limit int) error {
	return formatError("%s is one unexpected control-type PDU more than the %d of MaxOutstandingUnexpectedPDUs (RFC 5046 §8.1; a protocol error, §10.1.3.4)",
		h.Opcode(), limit)
}
