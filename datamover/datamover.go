// Package datamover is the Datamover Interface (DI) of the Datamover
// Architecture for iSCSI (draft-ietf-ips-iwarp-da, draft-ietf-ips-iwarp-da, §9-§11): the
// contract between the iSCSI layer and a Datamover layer that moves its
// PDUs and data. The traditional TCP datamover (datamover/tcp) and the iSER
// datamover implement Conn; the iSCSI layer implements Upcalls.
//
// Primitive names map to Go names as follows:
//
//	Send_Control                     Conn.SendControl        (§9.1)
//	Put_Data                         Conn.PutData            (§9.2)
//	Get_Data                         Conn.GetData            (§9.3)
//	Allocate_Connection_Resources    Conn.AllocateConnectionResources (§9.4)
//	Deallocate_Connection_Resources  Conn.DeallocateConnectionResources (§9.5)
//	Enable_Datamover                 Conn.EnableDatamover    (§9.6)
//	Connection_Terminate             Conn.ConnectionTerminate (§9.7)
//	Notice_Key_Values                Conn.NoticeKeyValues    (§9.8)
//	Deallocate_Task_Resources        Conn.DeallocateTaskResources (§9.9)
//	Control_Notify                   Upcalls.ControlNotify   (§10.1)
//	Connection_Terminate_Notify      Upcalls.ConnectionTerminateNotify (§10.2)
//	Data_Completion_Notify           Upcalls.DataCompletionNotify (§10.3)
//	Data_ACK_Notify                  Upcalls.DataACKNotify   (§10.4)
package datamover

import (
	"errors"

	"github.com/blockwire/blockwire/iscsi/pdu"
)

// PDU is one iSCSI PDU as it crosses the interface: the BHS, the raw AHS
// and the data segment (without padding or digests).
type PDU struct {
	BHS  pdu.BHS
	AHS  []byte
	Data []byte

	// The I/O buffers of a SCSI Command an initiator sends (draft-ietf-ips-iwarp-da
	// §11.3.1: DataDescriptorOut, DataDescriptorIn, UnsolicitedDataSize).
	// An RDMA datamover registers them and advertises their STags; the TCP
	// datamover ignores them.
	DataOut             []byte
	DataIn              []byte
	UnsolicitedDataSize int

	// More says, on a PDU sent, that more PDUs of the connection are on
	// their way (its other commands are executing): the datamover may
	// hold this one for a moment to send them together. The TCP
	// datamover then lets the process's other goroutines run once before
	// it writes, so that responses completed together share one write.
	More bool
}

// Params are the negotiated key values a datamover needs (Notice_Key_Values,
// draft-ietf-ips-iwarp-da §9.8).
type Params struct {
	HeaderDigest bool
	DataDigest   bool
	// MaxRecvDataSegmentLength is what this side declared: the largest data
	// segment it accepts.
	MaxRecvDataSegmentLength int
	// MaxXmitDataSegmentLength is what the peer declared: the largest data
	// segment this side may send.
	MaxXmitDataSegmentLength int
	// MaxBurstLength bounds one Data-In sequence (RFC 7143 §13.13).
	MaxBurstLength int
	// RDMAExtensions, TargetRecvDataSegmentLength,
	// InitiatorRecvDataSegmentLength and MaxOutstandingUnexpectedPDUs are
	// the iSER keys (RFC 5046 §6); the TCP datamover ignores them.
	RDMAExtensions                 bool
	TargetRecvDataSegmentLength    int
	InitiatorRecvDataSegmentLength int
	// MaxOutstandingUnexpectedPDUs is what this side declared (the
	// unexpected PDUs it accepts), PeerMaxOutstandingUnexpectedPDUs what
	// the peer declared (the ones this side may send); 0 is no limit
	// (RFC 5046 §6.7, §8.1).
	MaxOutstandingUnexpectedPDUs     int
	PeerMaxOutstandingUnexpectedPDUs int
}

// ErrUnexpectedLimit is SendControl's answer when sending the PDU would
// exceed the peer's MaxOutstandingUnexpectedPDUs (RFC 5046 §8.1): the PDU
// is not sent and no sequence number is taken. An initiator may send it
// again as a regulated (non-immediate) PDU; a target drops it, even a
// Reject (§8.1.2 overrides every "MUST send a Reject").
var ErrUnexpectedLimit = errors.New("datamover: the peer's MaxOutstandingUnexpectedPDUs is reached")

// ReceiveBudget is implemented by datamovers whose incoming control PDUs
// land in pre-posted buffers (iSER, RFC 5046 §8): the values the iSCSI
// layer declares for them at login.
type ReceiveBudget interface {
	// RecvDataSize is the data segment one receive buffer holds (this
	// side's Target/InitiatorRecvDataSegmentLength).
	RecvDataSize() int
	// MaxOutstandingUnexpectedPDUs is how many unexpected control-type
	// PDUs the buffers can take beyond the command window.
	MaxOutstandingUnexpectedPDUs() int
}

// Stamper fills the sequence numbers of an outgoing PDU while the
// datamover holds its transmit order. On a target: StatSN at bytes 24-27
// (advanced when advance is set), ExpCmdSN and MaxCmdSN at bytes 28-35; on
// an initiator: CmdSN at bytes 24-27 (advanced when advance is set) and
// ExpStatSN at bytes 28-31. The iSCSI layer provides it; calling it in
// transmit order keeps the numbers monotonic on the wire (RFC 7143
// §4.2.2).
type Stamper func(h *pdu.BHS, advance bool)

// DataIn describes one Put_Data: a contiguous range of a task's data-in
// buffer (the Data_Descriptor of draft-ietf-ips-iwarp-da §7.2) and, when Final and
// WithStatus, the status that is collapsed into the last Data-In PDU (RFC
// 7143 §11.7.2 phase collapse).
type DataIn struct {
	LUN        [8]byte
	ITT        uint32
	Data       []byte // the bytes to send
	Offset     uint32 // buffer offset of Data[0]
	DataSN     *uint32
	Final      bool
	WithStatus bool
	// Ack is the A-bit (RFC 7143 §11.7.2, ErrorRecoveryLevel ≥ 1): the
	// iSCSI layer wants to know when the initiator has this data. The
	// datamover then calls DataACKNotify with the ITT and the DataSN that
	// follows (draft-ietf-ips-iwarp-da §10.4, RFC 5046 §7.3.5).
	Ack       bool
	Status    byte
	Overflow  bool
	Underflow bool
	Residual  uint32
	More      bool // as PDU.More
}

// Conn is the Datamover of one iSCSI connection (the Connection_Handle of
// draft-ietf-ips-iwarp-da §7.3).
type Conn interface {
	// AllocateConnectionResources prepares the datamover for a connection
	// that is logging in (§9.4). The TCP datamover needs nothing; iSER
	// allocates its queues here (RFC 5046 §5.1).
	AllocateConnectionResources(p Params) error
	// DeallocateConnectionResources undoes a failed login (§9.5).
	DeallocateConnectionResources()
	// NoticeKeyValues tells the datamover the negotiated keys (§9.8).
	// During login they take effect at EnableDatamover; in full feature
	// phase (a Text renegotiation) the data segment lengths apply at once.
	NoticeKeyValues(p Params)
	// MaxSendDataSegmentLength is the largest data segment this side may
	// send: the peer's MaxRecvDataSegmentLength (or, on iSER, its
	// Initiator/TargetRecvDataSegmentLength).
	MaxSendDataSegmentLength() int
	// EnableDatamover switches the connection into full feature phase
	// (§9.6): negotiated digests and segment sizes apply from the next PDU.
	// final is the target's final Login Response, which the datamover
	// transmits before switching (RFC 5046 §5.1: the Login Response is sent
	// in byte-streaming mode); an initiator passes nil after receiving it.
	// Both call it from ControlNotify of the PDU that ends the login (the
	// final Login Request, the final Login Response): a datamover that
	// changes transport there (fabric.Upgrade) hands over between two PDUs
	// its receive loop delivers.
	EnableDatamover(final *PDU) error
	// SendControl transmits a control-type PDU (§9.1).
	SendControl(p *PDU, advance bool) error
	// PutData moves data-in to the initiator (§9.2): Data-In PDUs on TCP,
	// RDMA Writes on iSER.
	PutData(d *DataIn) error
	// GetData solicits data-out from the initiator (§9.3): an R2T on TCP,
	// RDMA Reads on iSER. buf receives the data at r2t.Offset.
	GetData(r2t *pdu.R2T, buf []byte) error
	// DeallocateTaskResources releases what the datamover holds for a task
	// (§9.9).
	DeallocateTaskResources(itt uint32)
	// ConnectionTerminate closes the connection (§9.7).
	ConnectionTerminate()
	// Serve runs the receive loop, delivering every incoming PDU through
	// up until the connection ends; it then calls
	// ConnectionTerminateNotify once.
	Serve(up Upcalls)
	// RemoteAddr and LocalAddr describe the transport endpoints.
	RemoteAddr() string
	LocalAddr() string
}

// Liveness is offered by a datamover whose transport can tell, without
// waiting and without reading, that the connection is already over (the
// peer closed or reset it): what its receive loop is about to find. A
// target asks it before it admits another session of the same
// initiator, so that the loss of the old session's I_T nexus — its
// reservations and medium removal preventions released (SPC-4 §5.9,
// SBC-4 §5.11) — is complete before the new session's first command.
type Liveness interface {
	Gone() bool
}

// Upcalls are the iSCSI layer's operational primitives (draft-ietf-ips-iwarp-da §10).
type Upcalls interface {
	// DataBuffer returns the buffer the data segment of an incoming PDU is
	// placed in: the I/O buffer of its task for SCSI Command immediate data
	// and Data-Out, so data lands where it belongs without a copy. It
	// returns nil to let the datamover allocate (control PDUs), or an error
	// when the PDU is to be rejected or the connection dropped.
	DataBuffer(h *pdu.BHS) ([]byte, error)
	// ControlNotify delivers a received PDU (§10.1). It runs on the receive
	// goroutine; the PDU is valid until it returns.
	ControlNotify(p *PDU) error
	// ConnectionTerminateNotify reports that the transport connection has
	// ended (§10.2).
	ConnectionTerminateNotify(err error)
	// DataCompletionNotify reports that all data solicited by a GetData
	// has arrived (§10.3). The TCP datamover leaves this to the iSCSI
	// layer's Data-Out accounting; RDMA datamovers call it on RDMA Read
	// completion.
	DataCompletionNotify(itt uint32, ttt uint32)
	// DataACKNotify reports a Data-In acknowledgement (§10.4).
	DataACKNotify(itt uint32, dataSN uint32)
}

// ProtocolError tells the receive loop how to handle an error from
// DataBuffer or ControlNotify: answer with a Reject and go on, or drop the
// connection. Any other error drops the connection.
type ProtocolError struct {
	// Reject, when set, is answered with a Reject PDU carrying the header;
	// otherwise the connection is dropped.
	Reject bool
	Reason pdu.RejectReason
	Err    error
}

func (e *ProtocolError) Error() string { return e.Err.Error() }
func (e *ProtocolError) Unwrap() error { return e.Err }

// Optional capabilities of a Conn. A datamover has those it implements;
// the iSCSI layer asks for them through PlacesByRDMA and HasPending, never
// by interfaces of its own making, as backend/backend.go's optional
// interfaces are asked.

// Placer is a datamover that can place data by RDMA: ISER reports whether
// it does now. One that began as TCP and turned into iSER after an RFC
// 5046 login says so from its switch on.
type Placer interface{ ISER() bool }

// Lookahead is a datamover that reads ahead of what it has delivered:
// Pending reports whether bytes of a PDU not yet delivered have arrived.
// A target then leaves a command to the logical unit's workers rather
// than run it on the receiver, which has more to read.
type Lookahead interface{ Pending() bool }

// PlacesByRDMA reports whether c moves data by RDMA now (Placer).
func PlacesByRDMA(c Conn) bool {
	p, ok := c.(Placer)
	return ok && p.ISER()
}

// HasPending reports whether c has read bytes of an undelivered PDU
// (Lookahead); false for a datamover that does not read ahead.
func HasPending(c Conn) bool {
	l, ok := c.(Lookahead)
	return ok && l.Pending()
}

// Memory is memory a datamover moves without a copy: a hardware RDMA
// device's registered memory (rdma.Memory), outside the Go heap. A target
// given one takes its task buffers from it while its budget lasts, so
// data goes from the backend's buffer to the wire with no copy in
// between; its buffers go back with Free.
type Memory interface {
	Alloc(n int) ([]byte, bool)
	Free(b []byte)
}
