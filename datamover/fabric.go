package datamover

import (
	"context"
	"log/slog"
	"net"
	"time"
)

// The fabric side of the interface: how a Conn comes to be. The Datamover
// Architecture leaves connection establishment to the transport (draft-ietf-ips-iwarp-da
// §4: the iSCSI layer asks for a connection of a given kind and then runs
// the login over the Datamover Interface); here a fabric is an Acceptor on
// the target side and a Dialer on the initiator side, and both hand back
// an Established connection whose Conn the iSCSI layer builds with its own
// Stamper. The iSCSI packages import only these interfaces; the concrete
// fabrics (iSCSI/TCP, iSER over iWARP or an RDMA/CM device, the shared
// portal that tells them apart) live in package fabric.

// Acceptor accepts the connections of one portal.
type Acceptor interface {
	// Accept waits for the next connection. It returns promptly: the
	// fabric's own set-up (an MPA exchange, an RDMA/CM accept) happens in
	// Incoming.Establish, bounded by the iSCSI layer's login timeout.
	Accept(ctx context.Context) (Incoming, error)
	// Addr is the portal's address, "host:port" (SendTargets lists it).
	Addr() string
	// Close stops Accept; connections already accepted go on.
	Close() error
}

// Incoming is an accepted connection before it has a datamover.
type Incoming interface {
	// RemoteAddr is the peer (the iSCSI layer bounds logins in progress
	// per source address).
	RemoteAddr() net.Addr
	// Establish completes the fabric's connection set-up within ctx and
	// returns the connection, or an error when the peer is refused (the
	// fabric then answers it as its rules say: an RDMA/CM reject with a
	// reason, a closed socket).
	Establish(ctx context.Context, p AcceptParams) (*Established, error)
	// Close abandons the connection (the node is shutting down).
	Close() error
}

// AcceptParams are what an acceptor needs to know of the iSCSI layer.
type AcceptParams struct {
	// Window is the CmdSN window: an iSER connection sizes its receive
	// buffers to it (RFC 5046 §8).
	Window uint32
	// EndNode and Gateway say what this node is, for the node preference
	// an iSER initiator may put in its connection request (the iSER-on-InfiniBand draft part
	// III): EndNode when it has LUNs of its own, Gateway when it reaches
	// LUNs through other targets; neither means an end node.
	EndNode, Gateway bool
	// SendTimeout bounds how long a send may go without moving 64 KiB
	// (sendguard.MinProgress) before the connection fails: a peer that
	// stops reading, or reads a trickle; 0: no bound.
	SendTimeout time.Duration
	// Memory, when set, is charged what the connection holds once its
	// login completes (an iSER connection's receive ring and send
	// slots) and given it back when the connection ends; a connection
	// whose charge is refused ends instead of holding it.
	Memory Charger
	Logger *slog.Logger
}

// Charger is a budget memory is charged to (blockcore.IOShare is one):
// Take reports whether there was room for n bytes; Give returns them.
type Charger interface {
	Take(n int64) bool
	Give(n int64)
}

// Established is a connection whose fabric set-up is done.
type Established struct {
	// Open builds the Conn, with the iSCSI layer's Stamper. It is called
	// once.
	Open func(Stamper) Conn
	// Kind is the form the connection takes and may take.
	Kind Kind
	// Close releases the connection if Open is never called.
	Close func()
}

// Kind is what a fabric established: the form a connection's datamover
// takes, and may take.
type Kind uint8

const (
	// KindTCP is iSCSI over TCP, and nothing else.
	KindTCP Kind = iota
	// KindUpgradable is TCP now and an RDMA stream after a login that
	// negotiates RDMAExtensions (the RFC 5046 profile, RFC 5046 §5.1).
	KindUpgradable
	// KindISER is iSER from the first PDU (the connection-first form:
	// the iSER-on-InfiniBand draft, RFC 7145).
	KindISER
)

// RDMA reports whether a connection of kind k can carry iSER, now or
// after its login (RDMAExtensions is then offered or answered).
func (k Kind) RDMA() bool { return k != KindTCP }

// Preference is the iSER-on-InfiniBand draft's node preference (the Flg of the iSER CM
// private data): what an initiator wants at the other end of an iSER
// connection.
type Preference uint8

// The preferences (the iSER-on-InfiniBand draft part III).
const (
	PreferEither  Preference = 0 // 00b: an end target node or a gateway
	PreferEndNode Preference = 1 // 01b: only an end target node
	PreferGateway Preference = 2 // 10b: only a gateway
	PreferInvalid Preference = 3 // 11b: reserved and invalid: neither
)

func (p Preference) String() string {
	return [...]string{"either", "end node only", "gateway only", "invalid (11b)"}[p&3]
}

// Refusal is why a node of the given kind refuses a connection with this
// preference (the iSER-on-InfiniBand draft part III: reject with "consumer reject" and a
// readable reason, at most the 72 bytes of an InfiniBand ARI), or "" when
// it accepts. A node with neither role counts as an end node.
func (p Preference) Refusal(endNode, gateway bool) string {
	if !endNode && !gateway {
		endNode = true
	}
	switch p & 3 {
	case PreferEndNode:
		if !endNode {
			return "iSER: this node is a gateway; an end node only was asked (the iSER-on-InfiniBand draft)"
		}
	case PreferGateway:
		if !gateway {
			return "iSER: this node is an end node; a gateway only was asked (the iSER-on-InfiniBand draft)"
		}
	case PreferInvalid:
		return "iSER: connection flags 11b are invalid (the iSER-on-InfiniBand draft)"
	}
	return ""
}

// Dialer connects an initiator to a portal.
type Dialer interface {
	Dial(ctx context.Context, portal string, p DialParams) (*Established, error)
}

// DialParams are what a dialer needs to know of the iSCSI layer.
type DialParams struct {
	// ISER asks for an iSER connection rather than iSCSI/TCP.
	ISER bool
	// Preference, with HasPreference, is the node preference an iSER
	// dialer sends (the iSER-on-InfiniBand draft); other fabrics ignore it.
	Preference    Preference
	HasPreference bool
	Logger        *slog.Logger
}
