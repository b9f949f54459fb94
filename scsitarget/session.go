package scsitarget

// SessionInfo describes an I_T nexus as the fabric that carries it reports
// it, for administration and metrics: every fabric (iSCSI over TCP, iSER,
// SRP) answers with this one shape.
type SessionInfo struct {
	// Fabric is "iscsi", "iser" or "srp".
	Fabric string
	// ID names the session to DropSession: an iSCSI TSIH in decimal, an
	// SRP nexus as "srp-N".
	ID        string
	Target    string
	Initiator string // iSCSI initiator name, SRP initiator port ID
	// Port is the initiator's port within its node: an iSCSI ISID in
	// hex; empty for SRP, whose Initiator is already a port.
	Port      string
	Discovery bool
	// Stats are the nexus's command counters (nil for iSCSI discovery).
	Stats *Stats
	// Params are negotiated session-wide values (iSCSI keys; SRP's
	// credits and IU lengths).
	Params map[string]string
	Conns  []ConnInfo
}

// ConnInfo describes one connection (iSCSI) or RDMA channel (SRP) of a
// session.
type ConnInfo struct {
	ID        string `json:"id"`
	Remote    string `json:"remote"`
	Transport string `json:"transport"` // "tcp", "iser", "srp"
	InFlight  int    `json:"in_flight"` // commands received and not yet answered
}
