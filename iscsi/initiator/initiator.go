// Package initiator is the iSCSI initiator role of RFC 7143: discovery
// (SendTargets), login (AuthMethod None and CHAP, one-way and mutual, with
// operational negotiation), pipelined tagged SCSI commands within the
// target's CmdSN window, immediate, unsolicited and solicited (R2T) data,
// Data-In placed straight into the caller's buffer, NOP handling, ABORT
// TASK on context cancellation, logout, and ErrorRecoveryLevel 0 session
// reinstatement with replay of unfinished commands after a connection
// loss. It moves PDUs through the datamover interface (package datamover),
// the same one the target uses.
package initiator

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/blockwire/blockwire/blockdev"
	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/iscsi/auth"
	"github.com/blockwire/blockwire/iscsi/pdu"
)

// DefaultInitiatorName is used when Options.InitiatorName is empty.
const DefaultInitiatorName = "iqn.2026-11.org.blockwire:initiator"

// Options configure discovery and sessions. The zero value is usable.
type Options struct {
	InitiatorName string
	// CHAP, when set, authenticates the initiator to the target (one-way
	// CHAP); TargetCHAP, when also set, makes the target authenticate
	// itself (mutual CHAP) with these credentials.
	CHAP       *auth.Credentials
	TargetCHAP *auth.Credentials
	// HeaderDigest and DataDigest ask for CRC32C digests.
	HeaderDigest bool
	DataDigest   bool
	// MaxRecvDataSegmentLength is what the initiator declares (262144).
	MaxRecvDataSegmentLength int
	// DialTimeout bounds connecting and logging in (10s).
	DialTimeout time.Duration
	// RecoveryTimeout bounds the reconnection attempts after a connection
	// loss (30s); 0 uses the default, a negative value disables recovery.
	RecoveryTimeout time.Duration
	// Connections is the number of connections per session (1). More
	// than one needs a target that negotiates MaxConnections above 1
	// (RFC 7143 §13.2); commands are spread over them round-robin, each
	// command's data staying on its connection.
	Connections int
	// NopInterval pings an idle target (30s; negative disables).
	NopInterval time.Duration
	// Dialer connects to portals (package fabric: fabric.Dialer dials
	// iSCSI/TCP, and iSER over software iWARP or another RDMA fabric).
	// Required.
	Dialer datamover.Dialer
	// ISER connects with iSER instead of iSCSI/TCP (an iser:// URL): the
	// Dialer's RDMA connection, login and data over it.
	ISER bool
	// Prefer makes Open choose the connection as the iSER-on-InfiniBand draft lays out,
	// instead of using the URL's transport alone: "direct" tries iSER to
	// end nodes first (the connection-first CM header with flag 01b), then
	// iSER to gateways (10b), then iSCSI/TCP; "gateway" tries gateways
	// first, then end nodes, then TCP; "any" iSER to either (00b), then
	// TCP. Each round tries every portal the target's SendTargets
	// discovery lists (the URL's portal when discovery fails).
	Prefer string
	// Paths are other portals ("host[:port]") of the same target and
	// LU — other gateways in front of one shared image, each its own
	// target port group. When the connection is lost, recovery tries the
	// lost portal, then each of these in turn, and replays the unfinished
	// commands on whichever answers (failover; reads and writes are
	// idempotent, so nothing acknowledged is lost or done twice wrongly).
	Paths []string
	// ISID is the initiator part of the session's identifier (RFC 7143
	// §11.12.5); zero: a random one of the random type. An initiator that
	// gave a session up and logs in again with its ISID reinstates it
	// (§6.3.5): the target ends the old session — its tasks aborted or
	// finished — before it answers, so nothing the old session sent takes
	// effect after the new login completed.
	ISID [6]byte
	// pref is the node preference an iSER connection asks for (the
	// iSER-on-InfiniBand draft; set by Open's Prefer plan).
	pref    datamover.Preference
	prefSet bool
	Logger  *slog.Logger
}

func (o *Options) defaults() {
	if o.InitiatorName == "" {
		o.InitiatorName = DefaultInitiatorName
	}
	if o.MaxRecvDataSegmentLength == 0 {
		o.MaxRecvDataSegmentLength = 262144
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.RecoveryTimeout == 0 {
		o.RecoveryTimeout = 30 * time.Second
	}
	if o.NopInterval == 0 {
		o.NopInterval = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// LoginError is a login the target refused (RFC 7143 §11.13.5).
type LoginError struct {
	Class, Detail byte
}

func (e *LoginError) Error() string {
	return fmt.Sprintf("iscsi: login refused with status %02x%02x (%s)", e.Class, e.Detail, loginStatusText(e.Class, e.Detail))
}

func loginStatusText(class, detail byte) string {
	switch uint16(class)<<8 | uint16(detail) {
	case pdu.LoginStatusMovedTemporarily:
		return "target moved temporarily"
	case pdu.LoginStatusMovedPermanently:
		return "target moved permanently"
	case pdu.LoginStatusInitiatorError:
		return "initiator error"
	case pdu.LoginStatusAuthFailure:
		return "authentication failure"
	case pdu.LoginStatusAuthorizationFail:
		return "authorization failure"
	case pdu.LoginStatusNotFound:
		return "target not found"
	case pdu.LoginStatusTargetRemoved:
		return "target removed"
	case pdu.LoginStatusUnsupportedVersion:
		return "unsupported version"
	case pdu.LoginStatusTooManyConnections:
		return "too many connections"
	case pdu.LoginStatusMissingParameter:
		return "missing parameter"
	case pdu.LoginStatusCantIncludeInSess:
		return "cannot include in session"
	case pdu.LoginStatusSessionTypeUnsupp:
		return "session type not supported"
	case pdu.LoginStatusSessionNotFound:
		return "session does not exist"
	case pdu.LoginStatusInvalidDuringLogin:
		return "invalid request during login"
	case pdu.LoginStatusTargetError:
		return "target error"
	case pdu.LoginStatusServiceUnavailable:
		return "service unavailable"
	case pdu.LoginStatusOutOfResources:
		return "out of resources"
	}
	return "unknown status"
}

// ErrAuthFailed reports that a target failed mutual CHAP.
var ErrTargetAuth = errors.New("iscsi: the target's mutual CHAP response is wrong")

// SCSIError is a command that ended with a status other than GOOD.
type SCSIError = blockdev.SCSIError

// Result is the outcome of a command that completed.
type Result = blockdev.Result

func newISID() [6]byte {
	var b [6]byte
	rand.Read(b[:])
	b[0] = 0x80 | b[0]&0x3f // type 10b: random (RFC 7143 §11.12.5)
	return b
}
