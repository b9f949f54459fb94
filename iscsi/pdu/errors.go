package pdu

import "fmt"

// RejectReason is the reason code of a Reject PDU (RFC 7143 §11.17.1).
type RejectReason byte

// The reasons (RFC 7143 §11.17.1).
const (
	RejectDataDigest          RejectReason = 0x02 // data (payload) digest error
	RejectSNACK               RejectReason = 0x03 // SNACK Reject
	RejectProtocolError       RejectReason = 0x04 // protocol error
	RejectCommandNotSupported RejectReason = 0x05 // command not supported
	RejectImmediateCmd        RejectReason = 0x06 // immediate command reject: too many immediate commands
	RejectTaskInProgress      RejectReason = 0x07 // task in progress
	RejectInvalidDataAck      RejectReason = 0x08 // invalid data ack
	RejectInvalidPDUField     RejectReason = 0x09 // invalid PDU field
	RejectOutOfResources      RejectReason = 0x0a // long operation reject: cannot generate a Target Transfer Tag
	RejectNegotiationReset    RejectReason = 0x0b // deprecated (negotiation reset)
	RejectWaitingForLogout    RejectReason = 0x0c // waiting for Logout
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

// Error implements error: the opcode, what is wrong and the section.
func (e *Error) Error() string {
	return fmt.Sprintf("iscsi: %s: %s (RFC 7143 %s)", e.Op, e.Msg, e.Rule)
}

func errorf(op Opcode, rule string, reason RejectReason, format string, args ...any) *Error {
	return &Error{Op: op, Rule: rule, Reason: reason, Msg: fmt.Sprintf(format, args...)}
}
