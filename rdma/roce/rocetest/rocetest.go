// Package rocetest sends hand-made InfiniBand CM messages over RoCEv2 (UDP
// port 4791 by default) and reads the answers: connection requests
// carrying whatever a peer may write into them — an RDMA/CM header that
// claims another address, a request whose handshake is never completed.
// It is for tests and the guest lab's hostile peers, not for connecting:
// it has no queue pairs. IPv4 only.
package rocetest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/blockwire/blockwire/rdma/ib"
)

// Peer is one UDP socket on a local address that talks the CM to one
// RoCEv2 device.
type Peer struct {
	c    *net.UDPConn
	from netip.AddrPort
	to   netip.AddrPort
}

// Dial opens a peer on local address from towards the device at to, on
// to's port: a RoCEv2 device answers to that port, whatever the source
// port was. Its datagrams leave with DF set, so Linux writes
// identification 0 in their IP header, as the invariant CRC computed here
// assumes.
func Dial(from netip.Addr, to netip.AddrPort) (*Peer, error) {
	if !from.Is4() || !to.Addr().Is4() {
		return nil, errors.New("rocetest: IPv4 addresses only")
	}
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(from, to.Port())))
	if err != nil {
		return nil, err
	}
	raw, err := c.SyscallConn()
	if err == nil {
		raw.Control(func(fd uintptr) {
			err = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_MTU_DISCOVER, syscall.IP_PMTUDISC_DO)
		})
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return &Peer{c: c, from: c.LocalAddr().(*net.UDPAddr).AddrPort(), to: to}, nil
}

// Close closes the socket.
func (p *Peer) Close() error { return p.c.Close() }

// Addr is the peer's own address and port.
func (p *Peer) Addr() netip.AddrPort { return p.from }

// REQ is a connection request to RDMA/CM port port (the TCP port space's
// service ID) at the device's address, from this peer: its path names the
// peer's real address, and its RDMA/CM header claims claim as the source
// (the peer's own address when it tells the truth), followed by private.
func (p *Peer) REQ(port uint16, claim netip.Addr, private []byte) (ib.REQ, error) {
	if !claim.Is4() {
		return ib.REQ{}, errors.New("rocetest: the claimed address must be IPv4")
	}
	if len(private) > ib.REQPrivateDataLength-cmaHeaderLen {
		return ib.REQ{}, fmt.Errorf("rocetest: %d bytes of private data, the REQ holds %d after the RDMA/CM header", len(private), ib.REQPrivateDataLength-cmaHeaderLen)
	}
	dst := p.to.Addr()
	req := ib.REQ{LocalCommID: rand.Uint32(), ServiceID: ib.ServiceID(ib.ServiceIDBaseRDMCM, port), LocalQPN: rand.Uint32() & 0xffffff,
		ResponderResources: 16, InitiatorDepth: 16, RemoteCMResponseTimeout: 20, StartingPSN: rand.Uint32() & 0xffffff,
		LocalCMResponseTimeout: 20, RetryCount: 7, PKey: 0xffff, PathMTU: 3, RNRRetryCount: 7, MaxCMRetries: 15}
	req.Primary = ib.Path{LocalLID: 0xffff, RemoteLID: 0xffff, LocalGID: netip.AddrFrom16(p.from.Addr().As16()).As16(),
		RemoteGID: netip.AddrFrom16(dst.As16()).As16(), HopLimit: 64, LocalACKTimeout: 14}
	// The RDMA/CM header: version 0, IP version 4 in the high nibble, the
	// source port, the source and destination addresses.
	h := req.PrivateData[:cmaHeaderLen]
	h[1] = 0x40
	binary.BigEndian.PutUint16(h[2:], p.from.Port())
	s4, d4 := claim.As4(), dst.As4()
	copy(h[16:20], s4[:])
	copy(h[32:36], d4[:])
	copy(req.PrivateData[cmaHeaderLen:], private)
	return req, nil
}

// cmaHeaderLen is the RDMA/CM header Linux puts before a REQ's private
// data in the TCP port space.
const cmaHeaderLen = 36

// Send sends one CM message (a MAD to QP 1) with transaction ID tid.
func (p *Peer) Send(attr uint16, tid uint64, data *[ib.CMDataLen]byte) error {
	m := ib.MAD{BaseVersion: 1, MgmtClass: ib.MgmtClassCM, ClassVersion: ib.CMClassVersion, Method: ib.MethodSend,
		TID: tid, AttrID: attr, Data: *data}
	pkt := ib.Packet{BTH: ib.BTH{Opcode: ib.UDSendOnly, PKey: 0xffff, DestQP: 1},
		DETH: ib.DETH{QKey: ib.GSIQKey, SrcQP: 1}, Payload: m.Append(nil)}
	b, err := pkt.Append(nil)
	if err != nil {
		return err
	}
	ulen := 8 + len(b) + ib.ICRCLen
	var ip [20]byte // what the invariant CRC covers of the IPv4 header
	ip[0], ip[6], ip[9] = 0x45, 0x40, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(20+ulen))
	s4, d4 := p.from.Addr().As4(), p.to.Addr().As4()
	copy(ip[12:], s4[:])
	copy(ip[16:], d4[:])
	var udp [8]byte
	binary.BigEndian.PutUint16(udp[0:], p.from.Port())
	binary.BigEndian.PutUint16(udp[2:], p.to.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(ulen))
	_, err = p.c.WriteToUDPAddrPort(ib.AppendICRC(ip[:], udp[:], b), p.to)
	return err
}

// SendREQ sends req, its local communication ID as the transaction ID.
func (p *Peer) SendREQ(req ib.REQ) error {
	var data [ib.CMDataLen]byte
	req.Encode(&data)
	return p.Send(ib.AttrREQ, uint64(req.LocalCommID), &data)
}

// Recv returns the next CM message that comes within timeout.
func (p *Peer) Recv(timeout time.Duration) (ib.MAD, error) {
	buf := make([]byte, 4096)
	deadline := time.Now().Add(timeout)
	for {
		p.c.SetReadDeadline(deadline)
		n, err := p.c.Read(buf)
		if err != nil {
			return ib.MAD{}, err
		}
		pkt, err := ib.Decode(buf[:n])
		if err != nil || pkt.BTH.DestQP != 1 {
			continue
		}
		if m, err := ib.DecodeMAD(pkt.Payload); err == nil && m.MgmtClass == ib.MgmtClassCM {
			return m, nil
		}
	}
}
