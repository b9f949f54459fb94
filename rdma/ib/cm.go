package ib

import (
	"encoding/binary"
)

// Management datagrams (MADs) and the Communication Manager's messages
// (InfiniBand Architecture Specification vol. 1, §13.4 and §12.6): a CM
// MAD travels as a UD SEND to QP 1 (the GSI) with Q_Key 0x80010000, and
// its 232 data bytes are a REQ, REP, RTU, REJ, DREQ, DREP or MRA. The iSER-on-InfiniBand draft
// §II puts iSER's connection parameters into the private data of REQ and
// REP (after the 36-byte RDMA/CM IP header Linux puts in a REQ's); the SRP
// InfiniBand annex puts the SRP login into REQ's.

// MAD sizes and the CM's constants.
const (
	MADLen       = 256
	MADHeaderLen = 24
	CMDataLen    = MADLen - MADHeaderLen

	GSIQKey        = 0x80010000
	MgmtClassCM    = 0x07
	CMClassVersion = 2
	MethodSend     = 0x03
)

// CM attribute IDs.
const (
	AttrClassPortInfo = 0x0001
	AttrREQ           = 0x0010
	AttrMRA           = 0x0011
	AttrREJ           = 0x0012
	AttrREP           = 0x0013
	AttrRTU           = 0x0014
	AttrDREQ          = 0x0015
	AttrDREP          = 0x0016
)

// MAD is a management datagram: the common header and the class's data.
type MAD struct {
	BaseVersion   uint8 // 1
	MgmtClass     uint8
	ClassVersion  uint8
	Method        uint8
	Status        uint16
	ClassSpecific uint16
	TID           uint64
	AttrID        uint16
	AttrMod       uint32
	Data          [CMDataLen]byte
}

// DecodeMAD reads a 256-byte MAD.
func DecodeMAD(b []byte) (MAD, error) {
	var m MAD
	if len(b) < MADLen {
		return m, errorf("MAD of %d bytes, want %d", len(b), MADLen)
	}
	m.BaseVersion, m.MgmtClass, m.ClassVersion, m.Method = b[0], b[1], b[2], b[3]
	m.Status = binary.BigEndian.Uint16(b[4:])
	m.ClassSpecific = binary.BigEndian.Uint16(b[6:])
	m.TID = binary.BigEndian.Uint64(b[8:])
	m.AttrID = binary.BigEndian.Uint16(b[16:])
	m.AttrMod = binary.BigEndian.Uint32(b[20:])
	copy(m.Data[:], b[MADHeaderLen:MADLen])
	if m.BaseVersion != 1 {
		return m, errorf("MAD base version %d (only 1 exists)", m.BaseVersion)
	}
	return m, nil
}

// Append adds the MAD's 256 bytes to dst.
func (m *MAD) Append(dst []byte) []byte {
	dst = append(dst, m.BaseVersion, m.MgmtClass, m.ClassVersion, m.Method)
	dst = binary.BigEndian.AppendUint16(dst, m.Status)
	dst = binary.BigEndian.AppendUint16(dst, m.ClassSpecific)
	dst = binary.BigEndian.AppendUint64(dst, m.TID)
	dst = binary.BigEndian.AppendUint16(dst, m.AttrID)
	dst = append(dst, 0, 0)
	dst = binary.BigEndian.AppendUint32(dst, m.AttrMod)
	return append(dst, m.Data[:]...)
}

// Path is a REQ's primary or alternate path. On RoCEv2 the GIDs carry the
// IP addresses (IPv4 as ::ffff:a.b.c.d) and the LIDs are 0xffff.
type Path struct {
	LocalLID, RemoteLID uint16
	LocalGID, RemoteGID [16]byte
	FlowLabel           uint32 // 20 bits
	PacketRate          uint8  // 6 bits
	TrafficClass        uint8
	HopLimit            uint8
	SL                  uint8 // 4 bits
	SubnetLocal         bool
	LocalACKTimeout     uint8 // 5 bits: 4.096 µs × 2^n
}

func (p *Path) decode(b []byte) {
	p.LocalLID = binary.BigEndian.Uint16(b[0:])
	p.RemoteLID = binary.BigEndian.Uint16(b[2:])
	copy(p.LocalGID[:], b[4:20])
	copy(p.RemoteGID[:], b[20:36])
	w := binary.BigEndian.Uint32(b[36:])
	p.FlowLabel, p.PacketRate = w>>12, uint8(w&0x3f)
	p.TrafficClass, p.HopLimit = b[40], b[41]
	p.SL, p.SubnetLocal = b[42]>>4, b[42]&0x08 != 0
	p.LocalACKTimeout = b[43] >> 3
}

func (p *Path) put(b []byte) {
	binary.BigEndian.PutUint16(b[0:], p.LocalLID)
	binary.BigEndian.PutUint16(b[2:], p.RemoteLID)
	copy(b[4:20], p.LocalGID[:])
	copy(b[20:36], p.RemoteGID[:])
	binary.BigEndian.PutUint32(b[36:], p.FlowLabel&0xfffff<<12|uint32(p.PacketRate&0x3f))
	b[40], b[41] = p.TrafficClass, p.HopLimit
	b[42] = p.SL << 4
	if p.SubnetLocal {
		b[42] |= 0x08
	}
	b[43] = p.LocalACKTimeout << 3
}

// REQ is a connection request.
type REQ struct {
	LocalCommID             uint32
	ServiceID               uint64
	LocalCAGUID             uint64
	LocalQKey               uint32
	LocalQPN                uint32 // 24 bits
	ResponderResources      uint8
	LocalEECN               uint32
	InitiatorDepth          uint8
	RemoteEECN              uint32
	RemoteCMResponseTimeout uint8 // 5 bits
	TransportType           uint8 // 2 bits: 0 RC, 1 UC, 3 extended
	EndToEndFlowControl     bool
	StartingPSN             uint32 // 24 bits
	LocalCMResponseTimeout  uint8  // 5 bits
	RetryCount              uint8  // 3 bits
	PKey                    uint16
	PathMTU                 uint8 // 4 bits: 1 256, 2 512, 3 1024, 4 2048, 5 4096
	RDCExists               bool
	RNRRetryCount           uint8 // 3 bits; 7 = infinite
	MaxCMRetries            uint8 // 4 bits
	SRQ                     bool
	ExtTransportType        uint8 // 3 bits
	Primary, Alternate      Path
	PrivateData             [REQPrivateDataLength]byte
}

// DecodeREQ reads a REQ from a CM MAD's data.
func DecodeREQ(d *[CMDataLen]byte) REQ {
	var r REQ
	be := binary.BigEndian
	r.LocalCommID = be.Uint32(d[0:])
	r.ServiceID = be.Uint64(d[8:])
	r.LocalCAGUID = be.Uint64(d[16:])
	r.LocalQKey = be.Uint32(d[28:])
	r.LocalQPN, r.ResponderResources = be.Uint32(d[32:])>>8, d[35]
	r.LocalEECN, r.InitiatorDepth = be.Uint32(d[36:])>>8, d[39]
	r.RemoteEECN = be.Uint32(d[40:]) >> 8
	r.RemoteCMResponseTimeout, r.TransportType, r.EndToEndFlowControl = d[43]>>3, d[43]>>1&3, d[43]&1 != 0
	r.StartingPSN = be.Uint32(d[44:]) >> 8
	r.LocalCMResponseTimeout, r.RetryCount = d[47]>>3, d[47]&7
	r.PKey = be.Uint16(d[48:])
	r.PathMTU, r.RDCExists, r.RNRRetryCount = d[50]>>4, d[50]&0x08 != 0, d[50]&7
	r.MaxCMRetries, r.SRQ, r.ExtTransportType = d[51]>>4, d[51]&0x08 != 0, d[51]&7
	r.Primary.decode(d[52:96])
	r.Alternate.decode(d[96:140])
	copy(r.PrivateData[:], d[140:232])
	return r
}

// Encode writes the REQ into a CM MAD's data.
func (r *REQ) Encode(d *[CMDataLen]byte) {
	*d = [CMDataLen]byte{}
	be := binary.BigEndian
	be.PutUint32(d[0:], r.LocalCommID)
	be.PutUint64(d[8:], r.ServiceID)
	be.PutUint64(d[16:], r.LocalCAGUID)
	be.PutUint32(d[28:], r.LocalQKey)
	be.PutUint32(d[32:], r.LocalQPN<<8|uint32(r.ResponderResources))
	be.PutUint32(d[36:], r.LocalEECN<<8|uint32(r.InitiatorDepth))
	be.PutUint32(d[40:], r.RemoteEECN<<8)
	d[43] = r.RemoteCMResponseTimeout<<3 | r.TransportType&3<<1
	if r.EndToEndFlowControl {
		d[43] |= 1
	}
	be.PutUint32(d[44:], r.StartingPSN<<8|uint32(r.LocalCMResponseTimeout<<3|r.RetryCount&7))
	be.PutUint16(d[48:], r.PKey)
	d[50] = r.PathMTU<<4 | r.RNRRetryCount&7
	if r.RDCExists {
		d[50] |= 0x08
	}
	d[51] = r.MaxCMRetries<<4 | r.ExtTransportType&7
	if r.SRQ {
		d[51] |= 0x08
	}
	r.Primary.put(d[52:96])
	r.Alternate.put(d[96:140])
	copy(d[140:232], r.PrivateData[:])
}

// REP is a connection reply.
type REP struct {
	LocalCommID, RemoteCommID uint32
	LocalQKey                 uint32
	LocalQPN                  uint32 // 24 bits
	LocalEECN                 uint32
	StartingPSN               uint32 // 24 bits
	ResponderResources        uint8
	InitiatorDepth            uint8
	TargetACKDelay            uint8 // 5 bits
	FailoverAccepted          uint8 // 2 bits
	EndToEndFlowControl       bool
	RNRRetryCount             uint8 // 3 bits
	SRQ                       bool
	LocalCAGUID               uint64
	PrivateData               [196]byte
}

// DecodeREP reads a REP from a CM MAD's data.
func DecodeREP(d *[CMDataLen]byte) REP {
	var r REP
	be := binary.BigEndian
	r.LocalCommID, r.RemoteCommID = be.Uint32(d[0:]), be.Uint32(d[4:])
	r.LocalQKey = be.Uint32(d[8:])
	r.LocalQPN = be.Uint32(d[12:]) >> 8
	r.LocalEECN = be.Uint32(d[16:]) >> 8
	r.StartingPSN = be.Uint32(d[20:]) >> 8
	r.ResponderResources, r.InitiatorDepth = d[24], d[25]
	r.TargetACKDelay, r.FailoverAccepted, r.EndToEndFlowControl = d[26]>>3, d[26]>>1&3, d[26]&1 != 0
	r.RNRRetryCount, r.SRQ = d[27]>>5, d[27]&0x10 != 0
	r.LocalCAGUID = be.Uint64(d[28:])
	copy(r.PrivateData[:], d[36:232])
	return r
}

// Encode writes the REP into a CM MAD's data.
func (r *REP) Encode(d *[CMDataLen]byte) {
	*d = [CMDataLen]byte{}
	be := binary.BigEndian
	be.PutUint32(d[0:], r.LocalCommID)
	be.PutUint32(d[4:], r.RemoteCommID)
	be.PutUint32(d[8:], r.LocalQKey)
	be.PutUint32(d[12:], r.LocalQPN<<8)
	be.PutUint32(d[16:], r.LocalEECN<<8)
	be.PutUint32(d[20:], r.StartingPSN<<8)
	d[24], d[25] = r.ResponderResources, r.InitiatorDepth
	d[26] = r.TargetACKDelay<<3 | r.FailoverAccepted&3<<1
	if r.EndToEndFlowControl {
		d[26] |= 1
	}
	d[27] = r.RNRRetryCount << 5
	if r.SRQ {
		d[27] |= 0x10
	}
	be.PutUint64(d[28:], r.LocalCAGUID)
	copy(d[36:232], r.PrivateData[:])
}

// REJ reasons the seeds name (vol. 1 table "REJ Reason").
const (
	RejNoQP              = 1 // the SRP InfiniBand annex: the channel limit is reached
	RejTimeout           = 2
	RejInvalidServiceID  = 8 // the iSER-on-InfiniBand draft §II: no iSER service here
	RejStaleConnection   = 10
	RejConsumerReject    = 28 // the iSER-on-InfiniBand draft §II: the private data is not acceptable; ARI says why
	RejPrivateDataLength = 148
	RejARILength         = 72
	REQPrivateDataLength = 92
)

// Which message a REJ or MRA answers.
const (
	MsgREQ   = 0
	MsgREP   = 1
	MsgOther = 2
)

// REJ is a connection reject.
type REJ struct {
	LocalCommID, RemoteCommID uint32
	MessageRejected           uint8 // 2 bits: MsgREQ, MsgREP, MsgOther
	ARILength                 uint8 // 7 bits
	Reason                    uint16
	ARI                       [RejARILength]byte
	PrivateData               [RejPrivateDataLength]byte
}

// DecodeREJ reads a REJ from a CM MAD's data.
func DecodeREJ(d *[CMDataLen]byte) REJ {
	var r REJ
	be := binary.BigEndian
	r.LocalCommID, r.RemoteCommID = be.Uint32(d[0:]), be.Uint32(d[4:])
	r.MessageRejected, r.ARILength = d[8]>>6, d[9]>>1
	r.Reason = be.Uint16(d[10:])
	copy(r.ARI[:], d[12:84])
	copy(r.PrivateData[:], d[84:232])
	return r
}

// Encode writes the REJ into a CM MAD's data.
func (r *REJ) Encode(d *[CMDataLen]byte) {
	*d = [CMDataLen]byte{}
	be := binary.BigEndian
	be.PutUint32(d[0:], r.LocalCommID)
	be.PutUint32(d[4:], r.RemoteCommID)
	d[8], d[9] = r.MessageRejected<<6, r.ARILength<<1
	be.PutUint16(d[10:], r.Reason)
	copy(d[12:84], r.ARI[:])
	copy(d[84:232], r.PrivateData[:])
}

// CommIDs is the pair of communication IDs every CM message but REQ
// starts with; RTU and DREP carry nothing else but private data.
type CommIDs struct{ Local, Remote uint32 }

// DecodeCommIDs reads the two IDs at the start of a CM message.
func DecodeCommIDs(d *[CMDataLen]byte) CommIDs {
	return CommIDs{binary.BigEndian.Uint32(d[0:]), binary.BigEndian.Uint32(d[4:])}
}

// RTU, DREQ and DREP: RTU and DREP have private data from byte 8, DREQ
// has the remote QPN first.

// DREQ is a disconnect request.
type DREQ struct {
	CommIDs
	RemoteQPN   uint32 // 24 bits
	PrivateData [220]byte
}

// DecodeDREQ reads a DREQ.
func DecodeDREQ(d *[CMDataLen]byte) DREQ {
	var r DREQ
	r.CommIDs = DecodeCommIDs(d)
	r.RemoteQPN = binary.BigEndian.Uint32(d[8:]) >> 8
	copy(r.PrivateData[:], d[12:232])
	return r
}

// Encode writes the DREQ.
func (r *DREQ) Encode(d *[CMDataLen]byte) {
	*d = [CMDataLen]byte{}
	binary.BigEndian.PutUint32(d[0:], r.Local)
	binary.BigEndian.PutUint32(d[4:], r.Remote)
	binary.BigEndian.PutUint32(d[8:], r.RemoteQPN<<8)
	copy(d[12:232], r.PrivateData[:])
}

// PutCommIDs writes an RTU or DREP (or the start of any message with the
// two IDs) with private data pd (at most 224 bytes).
func PutCommIDs(d *[CMDataLen]byte, ids CommIDs, pd []byte) {
	*d = [CMDataLen]byte{}
	binary.BigEndian.PutUint32(d[0:], ids.Local)
	binary.BigEndian.PutUint32(d[4:], ids.Remote)
	copy(d[8:232], pd)
}

// MRA is a message receipt acknowledgement: the sender needs more time.
type MRA struct {
	CommIDs
	MessageMRAed   uint8 // 2 bits
	ServiceTimeout uint8 // 5 bits
	PrivateData    [222]byte
}

// DecodeMRA reads an MRA.
func DecodeMRA(d *[CMDataLen]byte) MRA {
	var r MRA
	r.CommIDs = DecodeCommIDs(d)
	r.MessageMRAed, r.ServiceTimeout = d[8]>>6, d[9]>>3
	copy(r.PrivateData[:], d[10:232])
	return r
}

// Encode writes the MRA.
func (r *MRA) Encode(d *[CMDataLen]byte) {
	*d = [CMDataLen]byte{}
	binary.BigEndian.PutUint32(d[0:], r.Local)
	binary.BigEndian.PutUint32(d[4:], r.Remote)
	d[8], d[9] = r.MessageMRAed<<6, r.ServiceTimeout<<3
	copy(d[10:232], r.PrivateData[:])
}

// iSER's service ID on InfiniBand is a base plus the iSCSI TCP port in
// the low 16 bits (the iSER-on-InfiniBand draft §II): the seed's interim base
// 0x0000000000020000, or — as Linux's RDMA/CM puts every TCP-port-space
// service — 0x0000000001060000 (the capture's REQ: 0x0000000001060cbc for
// port 3260).
const (
	ServiceIDBaseSeed  = 0x0000000000020000
	ServiceIDBaseRDMCM = 0x0000000001060000
)

// ServiceID is base plus port.
func ServiceID(base uint64, port uint16) uint64 { return base&^0xffff | uint64(port) }

// ServicePort splits a service ID into its base and port when the base is
// one of the two above.
func ServicePort(id uint64) (base uint64, port uint16, ok bool) {
	base, port = id&^0xffff, uint16(id)
	return base, port, base == ServiceIDBaseSeed || base == ServiceIDBaseRDMCM
}
