package text

// Kind is how a key's value is negotiated (RFC 7143 §6.2).
type Kind int

const (
	// Declarative: each side states its own value; no answer is negotiated.
	Declarative Kind = iota
	// BoolAnd: result is the AND of both values.
	BoolAnd
	// BoolOr: result is the OR of both values.
	BoolOr
	// NumMin: result is the smaller of both values.
	NumMin
	// NumMax: result is the larger of both values.
	NumMax
	// NumDecl: a declared number (MaxRecvDataSegmentLength and friends).
	NumDecl
	// List: the responder picks the first offered value it supports.
	List
	// Auth: CHAP and SRP authentication keys, handled by the security stage.
	Auth
)

// Scope of a key (RFC 7143 §12 "Use", §13).
type Scope int

const (
	// ConnectionOnly (CO) keys are negotiated per connection.
	ConnectionOnly Scope = iota
	// LeadingOnly (LO) keys are session-wide and negotiated on the leading
	// connection only.
	LeadingOnly
	// SessionWide keys that any connection may carry.
	SessionWide
)

// Phase limits when a key may appear.
type Phase int

const (
	// LoginOrFFP: in login and in Text requests.
	LoginOrFFP Phase = iota
	// InitializeOnly (IO): only during login.
	InitializeOnly
	// FullFeatureOnly (FFPO): only in Text requests.
	FullFeatureOnly
	// SecurityOnly: only in the security negotiation stage.
	SecurityOnly
)

// Key describes one text key.
type Key struct {
	Name    string
	Kind    Kind
	Scope   Scope
	Phase   Phase
	Default string
	// Min and Max bound numerical values.
	Min, Max uint64
	// Values lists the values of a List key that RFC 7143 defines.
	Values []string
	// MaxLen bounds the value length (0: 255, the RFC 7143 §6.1 default).
	MaxLen int
	// ISER marks the keys of RFC 5046 §6 that only matter
	// when RDMAExtensions=Yes.
	ISER bool
}

// Keys returns the table of every key RFC 7143 §13 and RFC 5046 §6 define.
// The result is a fresh slice.
func Keys() []Key {
	const max24 = 1<<24 - 1
	return []Key{
		{Name: "HeaderDigest", Kind: List, Scope: ConnectionOnly, Phase: InitializeOnly, Default: "None", Values: []string{"None", "CRC32C"}},
		{Name: "DataDigest", Kind: List, Scope: ConnectionOnly, Phase: InitializeOnly, Default: "None", Values: []string{"None", "CRC32C"}},
		{Name: "MaxConnections", Kind: NumMin, Scope: LeadingOnly, Phase: InitializeOnly, Default: "1", Min: 1, Max: 65535},
		{Name: "SendTargets", Kind: Declarative, Scope: SessionWide, Phase: FullFeatureOnly},
		{Name: "TargetName", Kind: Declarative, Scope: SessionWide, Phase: InitializeOnly, MaxLen: 223},
		{Name: "InitiatorName", Kind: Declarative, Scope: SessionWide, Phase: InitializeOnly, MaxLen: 223},
		{Name: "TargetAlias", Kind: Declarative, Scope: SessionWide, Phase: LoginOrFFP},
		{Name: "InitiatorAlias", Kind: Declarative, Scope: SessionWide, Phase: LoginOrFFP},
		{Name: "TargetAddress", Kind: Declarative, Scope: SessionWide, Phase: LoginOrFFP},
		{Name: "TargetPortalGroupTag", Kind: Declarative, Scope: SessionWide, Phase: InitializeOnly, Min: 0, Max: 65535},
		{Name: "InitialR2T", Kind: BoolOr, Scope: LeadingOnly, Phase: InitializeOnly, Default: "Yes"},
		{Name: "ImmediateData", Kind: BoolAnd, Scope: LeadingOnly, Phase: InitializeOnly, Default: "Yes"},
		{Name: "MaxRecvDataSegmentLength", Kind: NumDecl, Scope: ConnectionOnly, Phase: LoginOrFFP, Default: "8192", Min: 512, Max: max24},
		{Name: "MaxBurstLength", Kind: NumMin, Scope: LeadingOnly, Phase: InitializeOnly, Default: "262144", Min: 512, Max: max24},
		{Name: "FirstBurstLength", Kind: NumMin, Scope: LeadingOnly, Phase: InitializeOnly, Default: "65536", Min: 512, Max: max24},
		{Name: "DefaultTime2Wait", Kind: NumMax, Scope: LeadingOnly, Phase: InitializeOnly, Default: "2", Min: 0, Max: 3600},
		{Name: "DefaultTime2Retain", Kind: NumMin, Scope: LeadingOnly, Phase: InitializeOnly, Default: "20", Min: 0, Max: 3600},
		{Name: "MaxOutstandingR2T", Kind: NumMin, Scope: LeadingOnly, Phase: InitializeOnly, Default: "1", Min: 1, Max: 65535},
		{Name: "DataPDUInOrder", Kind: BoolOr, Scope: LeadingOnly, Phase: InitializeOnly, Default: "Yes"},
		{Name: "DataSequenceInOrder", Kind: BoolOr, Scope: LeadingOnly, Phase: InitializeOnly, Default: "Yes"},
		{Name: "ErrorRecoveryLevel", Kind: NumMin, Scope: LeadingOnly, Phase: InitializeOnly, Default: "0", Min: 0, Max: 2},
		{Name: "SessionType", Kind: Declarative, Scope: LeadingOnly, Phase: InitializeOnly, Default: "Normal", Values: []string{"Discovery", "Normal"}},
		{Name: "TaskReporting", Kind: List, Scope: LeadingOnly, Phase: InitializeOnly, Default: "RFC3720", Values: []string{"RFC3720", "ResponseFence", "FastAbort"}},
		{Name: "iSCSIProtocolLevel", Kind: NumMin, Scope: LeadingOnly, Phase: InitializeOnly, Default: "0", Min: 0, Max: 31},
		// RFC 7143 §13.25 obsoletes the marker keys; peers still send them
		// and get the answer the RFC 3720 table gave.
		{Name: "IFMarker", Kind: BoolAnd, Scope: ConnectionOnly, Phase: InitializeOnly, Default: "No"},
		{Name: "OFMarker", Kind: BoolAnd, Scope: ConnectionOnly, Phase: InitializeOnly, Default: "No"},
		{Name: "IFMarkInt", Kind: Declarative, Scope: ConnectionOnly, Phase: InitializeOnly},
		{Name: "OFMarkInt", Kind: Declarative, Scope: ConnectionOnly, Phase: InitializeOnly},
		// Security keys (RFC 7143 §12.1, §13.21, RFC 1994).
		{Name: "AuthMethod", Kind: Auth, Scope: ConnectionOnly, Phase: SecurityOnly, Default: "None"},
		{Name: "CHAP_A", Kind: Auth, Scope: ConnectionOnly, Phase: SecurityOnly},
		{Name: "CHAP_I", Kind: Auth, Scope: ConnectionOnly, Phase: SecurityOnly},
		{Name: "CHAP_C", Kind: Auth, Scope: ConnectionOnly, Phase: SecurityOnly, MaxLen: MaxValueLen},
		{Name: "CHAP_N", Kind: Auth, Scope: ConnectionOnly, Phase: SecurityOnly},
		{Name: "CHAP_R", Kind: Auth, Scope: ConnectionOnly, Phase: SecurityOnly, MaxLen: MaxValueLen},
		// iSER keys: RFC 5046 §6.1-§6.4.
		{Name: "RDMAExtensions", Kind: BoolAnd, Scope: LeadingOnly, Phase: InitializeOnly, Default: "No"},
		{Name: "TargetRecvDataSegmentLength", Kind: NumDecl, Scope: ConnectionOnly, Phase: InitializeOnly, Default: "8192", Min: 512, Max: max24, ISER: true},
		{Name: "InitiatorRecvDataSegmentLength", Kind: NumDecl, Scope: ConnectionOnly, Phase: InitializeOnly, Default: "8192", Min: 512, Max: max24, ISER: true},
		{Name: "MaxOutstandingUnexpectedPDUs", Kind: NumDecl, Scope: ConnectionOnly, Phase: InitializeOnly, Default: "0", Min: 0, Max: 1<<32 - 1, ISER: true},
	}
}
