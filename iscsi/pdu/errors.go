package pdu

import "fmt"

// RejectReason is the reason code of a Reject PDU (RFC 7143 §11.17.1).
type RejectReason byte

const (
	RejectDataDigest          RejectReason = 0x02
	RejectSNACK               RejectReason = 0x03
	RejectProtocolError       RejectReason = 0x04
	RejectCommandNotSupported RejectReason = 0x05
	RejectImmediateCmd        RejectReason = 0x06
	RejectTaskInProgress      RejectReason = 0x07
	RejectInvalidDataAck      RejectReason = 0x08
	RejectInvalidPDUField     RejectReason = 0x09
	RejectOutOfResources      RejectReason = 0x0a
	RejectNegotiationReset    RejectReason = 0x0b
	RejectWaitingForLogout    RejectReason = 0x0c
)

// Error is a violation of the PDU format. Rule names the RFC 7143 section
// that was broken; Reason is the Reject reason a receiver should use when
// the error does not force a connection drop.
type Error struct {
	Op     Opcode
	Rule   string
	Reason RejectReason
	Msg    string
}

func (e *Error) Error() string {
	return fmt.Sprintf("iscsi: %s: %s (RFC 7143 %s)", e.Op, e.Msg, e.Rule)
}

func errorf(op Opcode, rule string, reason RejectReason, format string, args ...any) *Error {
	return &Error{Op: op, Rule: rule, Reason: reason, Msg: fmt.Sprintf(format, args...)}
}
