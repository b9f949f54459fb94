package roce

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/blockwire/blockwire/internal/persource"
	"github.com/blockwire/blockwire/internal/servetest"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/ib"
)

func devices(t *testing.T) (a, b *Device) {
	t.Helper()
	// Two devices on two loopback addresses, on a port of their own so a
	// kernel rxe (which owns 4791) cannot interfere.
	return devicesWith(t, Options{Port: 14791}, Options{Port: 14791})
}

// devicesWith opens a on 127.0.0.1 and b on 127.0.0.2 with these options.
func devicesWith(t *testing.T, oa, ob Options) (a, b *Device) {
	t.Helper()
	var err error
	if a, err = Open("127.0.0.1", oa); err != nil {
		t.Fatal(err)
	}
	if b, err = Open("127.0.0.2", ob); err != nil {
		a.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

type end struct {
	pd       *rdma.PD
	scq, rcq *rdma.CQ
}

func newEnd(d *Device) *end {
	return &end{pd: d.RDMA().AllocPD(), scq: rdma.NewCQ(64), rcq: rdma.NewCQ(64)}
}

func (e *end) params(pd []byte, recvs ...rdma.RecvWR) rdma.ConnParams {
	return rdma.ConnParams{PD: e.pd, QP: rdma.QPConfig{SendCQ: e.scq, RecvCQ: e.rcq, IRD: 4, ORD: 4}, PrivateData: pd, Recvs: recvs}
}

// Two devices over UDP: the CM exchange (REQ with the RDMA/CM header and
// our private data, REP with the listener's, RTU), then Sends both ways,
// an RDMA Write and an RDMA Read, then a disconnect the peer sees.
func TestDeviceConnectAndTransfer(t *testing.T) {
	a, b := devices(t)
	ea, eb := newEnd(a), newEnd(b)
	ln, err := b.Listen("127.0.0.2:3260")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	region := make([]byte, 64<<10)
	for i := range region {
		region[i] = byte(i)
	}
	mr, _ := eb.pd.Register(region, 0x7000, rdma.RemoteRead|rdma.RemoteWrite)
	bufB := make([]byte, 4096)
	accepted := make(chan rdma.QP, 1)
	go func() {
		r, err := ln.Accept(ctx)
		if err != nil {
			t.Error(err)
			close(accepted)
			return
		}
		if string(r.PrivateData()[:5]) != "hello" || r.PeerIRD() != 4 || r.PeerORD() != 4 {
			t.Errorf("REQ private data %q, IRD %d ORD %d", r.PrivateData()[:8], r.PeerIRD(), r.PeerORD())
		}
		q, err := r.Accept(eb.params([]byte("welcome"), rdma.RecvWR{ID: 7, Buf: bufB}))
		if err != nil {
			t.Error(err)
			close(accepted)
			return
		}
		accepted <- q
	}()
	qa, reply, err := a.Dial(ctx, "127.0.0.2:3260", ea.params([]byte("hello")))
	if err != nil {
		t.Fatal(err)
	}
	if string(reply[:7]) != "welcome" {
		t.Fatalf("REP private data %q", reply[:8])
	}
	qb := <-accepted
	if qb == nil {
		t.FailNow()
	}
	msg := bytes.Repeat([]byte("abc"), 1000) // three MTUs
	if err := qa.PostSend(&rdma.SendWR{ID: 1, Op: rdma.OpSend, SG: [][]byte{msg}}); err != nil {
		t.Fatal(err)
	}
	if c := waitN(t, eb.rcq, 1)[0]; c.ID != 7 || !bytes.Equal(bufB[:c.Len], msg) {
		t.Fatalf("received %+v", c)
	}
	data := bytes.Repeat([]byte{0x5a}, 5000)
	qa.PostSend(&rdma.SendWR{ID: 2, Op: rdma.OpWrite, SG: [][]byte{data}, RemoteSTag: mr.STag(), RemoteTO: 0x7000 + 100})
	sinkBuf := make([]byte, 20000)
	sink, _ := ea.pd.Register(sinkBuf, 0, rdma.LocalWrite)
	qa.PostSend(&rdma.SendWR{ID: 3, Op: rdma.OpRead, Sink: sink, Length: 20000, RemoteSTag: mr.STag(), RemoteTO: 0x7000})
	for i, c := range waitN(t, ea.scq, 3) {
		if c.Status != rdma.Success || c.ID != uint64(i+1) {
			t.Fatalf("completion %d: %+v", i, c)
		}
	}
	// B looks at its memory after a Send that followed the Write: its
	// receive completion is ordered after the placement.
	bufB2 := make([]byte, 16)
	qb.PostRecv(rdma.RecvWR{ID: 8, Buf: bufB2})
	qa.PostSend(&rdma.SendWR{ID: 4, Op: rdma.OpSend, SG: [][]byte{[]byte("done")}})
	waitN(t, eb.rcq, 1)
	waitN(t, ea.scq, 1)
	if !bytes.Equal(region[100:5100], data) {
		t.Fatal("the Write did not land")
	}
	if !bytes.Equal(sinkBuf, region[:20000]) {
		t.Fatal("the Read brought the wrong bytes (the Write before it must be seen)")
	}
	qa.Close()
	select {
	case <-qb.Done():
		if !errors.Is(qb.Err(), rdma.ErrDisconnected) {
			t.Fatalf("peer's QP ended with %v", qb.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the peer did not see the disconnect")
	}
}

// A REQ for a port nobody listens on is rejected with reason 8 (the iSER-on-InfiniBand draft
// §II: invalid service ID); a listener's Reject is reason 28 with its
// private data.
func TestDeviceRejects(t *testing.T) {
	a, b := devices(t)
	ea, eb := newEnd(a), newEnd(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _, err := a.Dial(ctx, "127.0.0.2:3261", ea.params(nil))
	var rj *rdma.RejectError
	if !errors.As(err, &rj) || rj.Reason != ib.RejInvalidServiceID {
		t.Fatalf("no listener: %v", err)
	}
	ln, _ := b.Listen("127.0.0.2:3262")
	defer ln.Close()
	go func() {
		r, err := ln.Accept(ctx)
		if err == nil {
			r.Reject([]byte("not a gateway"))
		}
	}()
	_ = eb
	_, _, err = a.Dial(ctx, "127.0.0.2:3262", ea.params(nil))
	if !errors.As(err, &rj) || rj.Reason != ib.RejConsumerReject || string(rj.PrivateData[:13]) != "not a gateway" {
		t.Fatalf("rejected by the consumer: %v", err)
	}
}

// A datagram whose IPv4 identification is not 0 — as a kernel rxe sends
// them — passes the ICRC check when its real header is what the CRC was
// computed over (the raw-socket receive path; root only), and fails it
// when one byte of the covered header differs.
func TestDeviceICRCOverRealIPHeader(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs a raw socket (root) to send a datagram with a chosen IP identification")
	}
	_, b := devices(t)
	ln, err := b.Listen("127.0.0.2:3270")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	send := func(id uint16, corrupt bool, localComm uint32) {
		req := ib.REQ{LocalCommID: localComm, ServiceID: ib.ServiceID(ib.ServiceIDBaseRDMCM, 3270), LocalQPN: 0x99, StartingPSN: 5,
			ResponderResources: 1, InitiatorDepth: 1, PathMTU: 3, PKey: 0xffff}
		var data [ib.CMDataLen]byte
		req.Encode(&data)
		m := ib.MAD{BaseVersion: 1, MgmtClass: ib.MgmtClassCM, ClassVersion: ib.CMClassVersion, Method: ib.MethodSend, TID: 1, AttrID: ib.AttrREQ, Data: data}
		p := ib.Packet{BTH: ib.BTH{Opcode: ib.UDSendOnly, PKey: 0xffff, DestQP: 1}, DETH: ib.DETH{QKey: ib.GSIQKey, SrcQP: 1}, Payload: m.Append(nil)}
		pkt, _ := p.Append(nil)
		ulen := 8 + len(pkt) + ib.ICRCLen
		ip := ipHeader(netip.MustParseAddr("127.0.0.9"), netip.MustParseAddr("127.0.0.2"), ulen)
		binary.BigEndian.PutUint16(ip.b[4:], id)
		ip.b[8] = 64
		udp := udpHeader(50000, 14791, ulen)
		pkt = ib.AppendICRC(ip.bytes(), udp[:], pkt)
		if corrupt {
			// Sent with another identification than the CRC covered.
			binary.BigEndian.PutUint16(ip.b[4:], id+1)
		}
		dgram := append(append(ip.bytes(), udp[:]...), pkt...)
		var to syscall.SockaddrInet4
		to.Addr = [4]byte{127, 0, 0, 2}
		if err := syscall.Sendto(fd, dgram, 0, &to); err != nil {
			t.Fatal(err)
		}
	}
	send(0x4242, true, 1) // identification changed after the CRC: dropped
	send(0x4242, false, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := ln.Accept(ctx)
	if err != nil {
		t.Fatalf("a REQ with IP identification 0x4242 and its right ICRC was not accepted: %v", err)
	}
	if cr := r.(*connRequest); cr.req.LocalCommID != 2 {
		t.Fatalf("the REQ whose header no longer matched its ICRC got through (comm ID %d)", cr.req.LocalCommID)
	}
}

// fakePeer speaks raw RoCEv2 from a UDP socket on 127.0.0.3, to check our
// device against what Linux's CM and rxe do rather than against itself.
type fakePeer struct {
	t    *testing.T
	c    *net.UDPConn
	from netip.Addr // its address
	to   netip.Addr // the device it talks to
}

func newFakePeer(t *testing.T) *fakePeer { return newFakePeerAt(t, netip.MustParseAddr("127.0.0.3")) }

// newFakePeerAt is a fakePeer on the loopback address from.
func newFakePeerAt(t *testing.T, from netip.Addr) *fakePeer {
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(from, 14791)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	raw, _ := c.SyscallConn()
	raw.Control(func(fd uintptr) { // DF: identification 0, as ipHeader assumes
		syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_MTU_DISCOVER, syscall.IP_PMTUDISC_DO)
	})
	return &fakePeer{t: t, c: c, from: from}
}

func (f *fakePeer) send(p ib.Packet) {
	f.t.Helper()
	pkt, err := p.Append(nil)
	if err != nil {
		f.t.Fatal(err)
	}
	ulen := 8 + len(pkt) + ib.ICRCLen
	ip := ipHeader(f.from, f.to, ulen)
	udp := udpHeader(14791, 14791, ulen)
	f.c.WriteToUDPAddrPort(ib.AppendICRC(ip.bytes(), udp[:], pkt), netip.AddrPortFrom(f.to, 14791))
}

func (f *fakePeer) sendMAD(attr uint16, tid uint64, data [ib.CMDataLen]byte) {
	m := ib.MAD{BaseVersion: 1, MgmtClass: ib.MgmtClassCM, ClassVersion: ib.CMClassVersion, Method: ib.MethodSend, TID: tid, AttrID: attr, Data: data}
	f.send(ib.Packet{BTH: ib.BTH{Opcode: ib.UDSendOnly, PKey: 0xffff, DestQP: 1}, DETH: ib.DETH{QKey: ib.GSIQKey, SrcQP: 1}, Payload: m.Append(nil)})
}

// recv returns the next packet the device sent, skipping what skip
// matches.
func (f *fakePeer) recv(skip func(ib.Packet) bool) ib.Packet {
	f.t.Helper()
	buf := make([]byte, 4096)
	for {
		f.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := f.c.Read(buf)
		if err != nil {
			f.t.Fatal(err)
		}
		p, err := ib.Decode(buf[:n])
		if err != nil {
			f.t.Fatal(err)
		}
		if skip == nil || !skip(p) {
			return p
		}
	}
}

func (f *fakePeer) recvMAD(attr uint16) ib.MAD {
	f.t.Helper()
	for {
		p := f.recv(nil)
		if p.BTH.DestQP != 1 {
			continue
		}
		m, err := ib.DecodeMAD(p.Payload)
		if err != nil {
			f.t.Fatal(err)
		}
		if m.AttrID == attr {
			return m
		}
	}
}

// isMAD skips CM traffic while waiting for RC packets.
func isMAD(p ib.Packet) bool { return p.BTH.DestQP == 1 }

// Each CM message's Starting PSN is the PSN its sender expects to receive,
// as Linux's ib_cm uses it (the active side's receive PSN and the passive
// side's send PSN come from the REQ; shared/captures/iser-rxe.pcap frames
// 1, 2, 4 and 6: the target's first Send carries the REQ's PSN). Our
// device in both roles against a peer written from that rule.
func TestDeviceStartingPSNsAsLinux(t *testing.T) {
	a, b := devices(t)
	f := newFakePeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ackOf := func(psn uint32) func(ib.Packet) {
		return func(p ib.Packet) {
			if p.BTH.Opcode != ib.RCAcknowledge || p.AETH.Syndrome&0x60 != ib.SyndromeACK || p.BTH.PSN != psn {
				t.Fatalf("want an ACK of PSN %#x, got %v PSN %#x syndrome %#x", psn, p.BTH.Opcode, p.BTH.PSN, p.AETH.Syndrome)
			}
		}
	}

	// Passive: the fake peer's REQ says it expects 0x123456.
	f.to = netip.MustParseAddr("127.0.0.2")
	eb := newEnd(b)
	ln, err := b.Listen("127.0.0.2:3280")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan rdma.QP, 1)
	go func() {
		r, err := ln.Accept(ctx)
		if err == nil {
			var q rdma.QP
			if q, err = r.Accept(eb.params([]byte("rep"), rdma.RecvWR{ID: 1, Buf: make([]byte, 64)})); err == nil {
				accepted <- q
				return
			}
		}
		t.Error(err)
		close(accepted)
	}()
	req := ib.REQ{LocalCommID: 9, ServiceID: ib.ServiceID(ib.ServiceIDBaseRDMCM, 3280), LocalQPN: 0x55, StartingPSN: 0x123456,
		ResponderResources: 1, InitiatorDepth: 1, PathMTU: 3, PKey: 0xffff, RetryCount: 7, RNRRetryCount: 7}
	var data [ib.CMDataLen]byte
	req.Encode(&data)
	f.sendMAD(ib.AttrREQ, 1, data)
	m := f.recvMAD(ib.AttrREP)
	rep := ib.DecodeREP(&m.Data)
	var rtu [ib.CMDataLen]byte
	ib.PutCommIDs(&rtu, ib.CommIDs{Local: 9, Remote: rep.LocalCommID}, nil)
	f.sendMAD(ib.AttrRTU, 1, rtu)
	qb := <-accepted
	if qb == nil {
		t.FailNow()
	}
	qb.PostSend(&rdma.SendWR{ID: 2, Op: rdma.OpSend, SG: [][]byte{[]byte("from the passive side")}})
	if p := f.recv(isMAD); p.BTH.Opcode != ib.RCSendOnly || p.BTH.PSN != 0x123456 || p.BTH.DestQP != 0x55 {
		t.Fatalf("passive side's first Send: %v PSN %#x to QP %#x; want PSN 0x123456 (the REQ's) to QP 0x55", p.BTH.Opcode, p.BTH.PSN, p.BTH.DestQP)
	}
	f.send(ib.Packet{BTH: ib.BTH{Opcode: ib.RCSendOnly, PKey: 0xffff, DestQP: rep.LocalQPN, AckReq: true, PSN: rep.StartingPSN}, Payload: []byte("to the passive side")})
	ackOf(rep.StartingPSN)(f.recv(isMAD))
	if c := waitN(t, eb.rcq, 1)[0]; c.Status != rdma.Success || c.Len != len("to the passive side") {
		t.Fatalf("passive side's receive: %+v", c)
	}

	// Active: our REQ's PSN is what we expect; the fake peer's REP says
	// it expects 0x654321.
	f.to = netip.MustParseAddr("127.0.0.1")
	ea := newEnd(a)
	dialed := make(chan rdma.QP, 1)
	go func() {
		q, _, err := a.Dial(ctx, "127.0.0.3:3281", ea.params(nil, rdma.RecvWR{ID: 1, Buf: make([]byte, 64)}))
		if err != nil {
			t.Error(err)
			close(dialed)
			return
		}
		dialed <- q
	}()
	m = f.recvMAD(ib.AttrREQ)
	req = ib.DecodeREQ(&m.Data)
	rep = ib.REP{LocalCommID: 77, RemoteCommID: req.LocalCommID, LocalQPN: 0x66, StartingPSN: 0x654321, ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7}
	rep.Encode(&data)
	f.sendMAD(ib.AttrREP, m.TID, data)
	f.recvMAD(ib.AttrRTU)
	qa := <-dialed
	if qa == nil {
		t.FailNow()
	}
	qa.PostSend(&rdma.SendWR{ID: 3, Op: rdma.OpSend, SG: [][]byte{[]byte("from the active side")}})
	if p := f.recv(isMAD); p.BTH.Opcode != ib.RCSendOnly || p.BTH.PSN != 0x654321 || p.BTH.DestQP != 0x66 {
		t.Fatalf("active side's first Send: %v PSN %#x to QP %#x; want PSN 0x654321 (the REP's) to QP 0x66", p.BTH.Opcode, p.BTH.PSN, p.BTH.DestQP)
	}
	f.send(ib.Packet{BTH: ib.BTH{Opcode: ib.RCSendOnly, PKey: 0xffff, DestQP: req.LocalQPN, AckReq: true, PSN: req.StartingPSN}, Payload: []byte("to the active side")})
	ackOf(req.StartingPSN)(f.recv(isMAD))
	if c := waitN(t, ea.rcq, 1)[0]; c.Status != rdma.Success || c.Len != len("to the active side") {
		t.Fatalf("active side's receive: %+v", c)
	}
}

// A Dial under the iSER-on-InfiniBand draft's iSER base puts base + port in the REQ and the
// consumer's private data alone (no RDMA/CM header); a listener takes REQs
// in both port spaces and hands over the private data accordingly; a
// REJ's reason, ARI and private data reach the dialer.
func TestDeviceSeedServiceIDAndREJ(t *testing.T) {
	a, b := devices(t)
	f := newFakePeer(t)
	f.to = netip.MustParseAddr("127.0.0.1")
	ea := newEnd(a)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		p := ea.params([]byte("seed form"))
		p.ServiceIDBase = ib.ServiceIDBaseSeed
		_, _, err := a.Dial(ctx, "127.0.0.3:3260", p)
		errc <- err
	}()
	m := f.recvMAD(ib.AttrREQ)
	req := ib.DecodeREQ(&m.Data)
	if req.ServiceID != 0x20000+3260 || string(req.PrivateData[:9]) != "seed form" {
		t.Fatalf("REQ service ID %#x, private data %q", req.ServiceID, req.PrivateData[:12])
	}
	rej := ib.REJ{LocalCommID: 5, RemoteCommID: req.LocalCommID, Reason: ib.RejConsumerReject, ARILength: 6}
	copy(rej.ARI[:], "no way")
	copy(rej.PrivateData[:], "pd")
	var data [ib.CMDataLen]byte
	rej.Encode(&data)
	f.sendMAD(ib.AttrREJ, m.TID, data)
	var rj *rdma.RejectError
	if err := <-errc; !errors.As(err, &rj) || rj.Reason != 28 || string(rj.ARI) != "no way" || string(rj.PrivateData[:2]) != "pd" {
		t.Fatalf("dial: %v", err)
	}

	// Our listener: a seed-base REQ's private data is all the consumer's.
	f.to = netip.MustParseAddr("127.0.0.2")
	ln, _ := b.Listen("127.0.0.2:3262")
	defer ln.Close()
	for i, base := range []uint64{ib.ServiceIDBaseSeed, ib.ServiceIDBaseRDMCM} {
		req := ib.REQ{LocalCommID: uint32(20 + i), ServiceID: ib.ServiceID(base, 3262), LocalQPN: 0x77, PathMTU: 3, PKey: 0xffff}
		copy(req.PrivateData[:], "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGH")
		req.Encode(&data)
		f.sendMAD(ib.AttrREQ, uint64(20+i), data)
		r, err := ln.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := "0123456789"
		if base == ib.ServiceIDBaseRDMCM {
			want = "ABCDEFGH\x00\x00" // after the 36-byte RDMA/CM header
		}
		if got := string(r.PrivateData()[:10]); got != want {
			t.Fatalf("base %#x: private data starts %q, want %q", base, got, want)
		}
		r.Reject([]byte("busy"))
		m := f.recvMAD(ib.AttrREJ)
		if rej := ib.DecodeREJ(&m.Data); rej.Reason != 28 || string(rej.ARI[:rej.ARILength]) != "busy" {
			t.Fatalf("REJ reason %d ARI %q", rej.Reason, rej.ARI[:rej.ARILength])
		}
	}
}

// MRA both ways: a REQ repeated while our consumer has not yet answered
// gets an MRA (so the active side waits instead of giving up), and our
// Dial, told by an MRA that the passive side needs time, waits past its
// usual two seconds of retries for the REP.
func TestDeviceMRA(t *testing.T) {
	a, b := devices(t)
	f := newFakePeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	f.to = netip.MustParseAddr("127.0.0.2")
	ln, _ := b.Listen("127.0.0.2:3290")
	defer ln.Close()
	req := ib.REQ{LocalCommID: 31, ServiceID: ib.ServiceID(ib.ServiceIDBaseRDMCM, 3290), LocalQPN: 0x88, PathMTU: 3, PKey: 0xffff}
	var data [ib.CMDataLen]byte
	req.Encode(&data)
	f.sendMAD(ib.AttrREQ, 31, data)
	r, err := ln.Accept(ctx) // taken, not yet answered
	if err != nil {
		t.Fatal(err)
	}
	f.sendMAD(ib.AttrREQ, 31, data) // the active side's retry
	m := f.recvMAD(ib.AttrMRA)
	if mra := ib.DecodeMRA(&m.Data); mra.Remote != 31 || mra.MessageMRAed != ib.MsgREQ || serviceTime(mra.ServiceTimeout) < time.Second {
		t.Fatalf("MRA %+v", mra)
	}
	r.Reject(nil)
	m = f.recvMAD(ib.AttrREJ)
	if rej := ib.DecodeREJ(&m.Data); rej.RemoteCommID != 31 {
		t.Fatalf("REJ for comm ID %d", rej.RemoteCommID)
	}

	f.to = netip.MustParseAddr("127.0.0.1")
	ea := newEnd(a)
	errc := make(chan error, 1)
	go func() {
		q, _, err := a.Dial(ctx, "127.0.0.3:3291", ea.params(nil))
		if err == nil {
			q.Close()
		}
		errc <- err
	}()
	m = f.recvMAD(ib.AttrREQ)
	req = ib.DecodeREQ(&m.Data)
	mra := ib.MRA{CommIDs: ib.CommIDs{Local: 41, Remote: req.LocalCommID}, MessageMRAed: ib.MsgREQ, ServiceTimeout: 20} // ~4.3 s
	mra.Encode(&data)
	f.sendMAD(ib.AttrMRA, m.TID, data)
	time.Sleep(2500 * time.Millisecond) // past 10 retries of 200 ms
	rep := ib.REP{LocalCommID: 41, RemoteCommID: req.LocalCommID, LocalQPN: 0x99, StartingPSN: 1, ResponderResources: 1, InitiatorDepth: 1}
	rep.Encode(&data)
	f.sendMAD(ib.AttrREP, m.TID, data)
	if err := <-errc; err != nil {
		t.Fatalf("dial after an MRA: %v", err)
	}
}

// TestConnRequestStateIsBounded: spoofed REQs that are never completed do
// not grow the device's memory (100k of them: +52 MiB, kept
// forever): at most MaxConnRequests are remembered, the rest rejected
// with reason 1, and each is forgotten after ConnRequestTTL — a REQ that
// later reuses the same IDs is handled afresh, not answered with the old
// REJ.
func TestConnRequestStateIsBounded(t *testing.T) {
	b, err := Open("127.0.0.2", Options{Port: 14791, MaxConnRequests: 64, ConnRequestTTL: 400 * time.Millisecond})
	if err != nil {
		t.Fatalf("a device on 127.0.0.2: %v", err)
	}
	defer b.Close()
	f := newFakePeer(t)
	f.to = netip.MustParseAddr("127.0.0.2")
	ln, _ := b.Listen("127.0.0.2:3300") // nobody accepts: the backlog (64) fills
	defer ln.Close()
	send := func(id uint32) {
		req := ib.REQ{LocalCommID: id, ServiceID: ib.ServiceID(ib.ServiceIDBaseRDMCM, 3300), LocalQPN: 0x100 + id, PathMTU: 3, PKey: 0xffff}
		var data [ib.CMDataLen]byte
		req.Encode(&data)
		f.sendMAD(ib.AttrREQ, uint64(id), data)
	}
	const n = 2000
	for i := range uint32(n) {
		send(1000 + i)
		if i%64 == 63 {
			time.Sleep(2 * time.Millisecond) // let the device read
		}
	}
	time.Sleep(200 * time.Millisecond)
	b.mu.Lock()
	held := len(b.seen)
	b.mu.Unlock()
	if held > 64 {
		t.Fatalf("%d connection requests remembered, bound 64", held)
	}
	time.Sleep(500 * time.Millisecond) // past the TTL
	send(5000)                         // sweeps
	time.Sleep(100 * time.Millisecond)
	b.mu.Lock()
	held = len(b.seen)
	b.mu.Unlock()
	if held > 1 {
		t.Fatalf("%d connection requests remembered past their TTL", held)
	}
	t.Logf("%d spoofed REQs: at most 64 remembered, all forgotten after the TTL", n)
}

// TestConnRequestsPerSource: one address may have only so many
// connection requests remembered, so a peer that sends REQs it never
// completes cannot take them all and keep every other host from
// connecting; another address's REQ is still taken.
func TestConnRequestsPerSource(t *testing.T) {
	b, err := Open("127.0.0.2", Options{Port: 14791, MaxConnRequests: 64, MaxConnRequestsPerSource: 8, ConnRequestTTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("a device on 127.0.0.2: %v", err)
	}
	defer b.Close()
	ln, _ := b.Listen("127.0.0.2:3301") // nobody accepts
	defer ln.Close()
	send := func(f *fakePeer, id uint32) {
		req := ib.REQ{LocalCommID: id, ServiceID: ib.ServiceID(ib.ServiceIDBaseRDMCM, 3301), LocalQPN: 0x100 + id, PathMTU: 3, PKey: 0xffff}
		var data [ib.CMDataLen]byte
		req.Encode(&data)
		f.sendMAD(ib.AttrREQ, uint64(id), data)
	}
	held := func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.seen)
	}
	flood := newFakePeer(t)
	flood.to = netip.MustParseAddr("127.0.0.2")
	for i := range uint32(40) {
		send(flood, 1000+i)
	}
	time.Sleep(200 * time.Millisecond)
	if n := held(); n != 8 {
		t.Fatalf("%d connection requests from one address remembered, want its bound 8", n)
	}
	for deadline := time.Now().Add(5 * time.Second); b.BoundsHit()["conn_requests_per_source"] < 32; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			break
		}
	}
	if h := b.BoundsHit(); h["conn_requests_per_source"] != 32 || h["conn_requests"] != 0 {
		t.Fatalf("bounds hit %v, want the 32 requests past the address's 8 rejected for conn_requests_per_source", h)
	}
	other := newFakePeerAt(t, netip.MustParseAddr("127.0.0.4"))
	other.to = netip.MustParseAddr("127.0.0.2")
	send(other, 7)
	time.Sleep(200 * time.Millisecond)
	if n := held(); n != 9 {
		t.Fatalf("%d connection requests remembered after another address's, want 9", n)
	}
}

// TestConnRequestsPerSourceIPv6Network: with Sources.V6Bits 64 an IPv6
// peer's REQs count against its /64, so a host cannot pass the per-source
// bound by sending each REQ from another address of its network; another
// network is still taken; by default each address counts alone. The device is on the
// loopback of a network namespace; the REQs are handed to its CM as the
// receiver would, from addresses the namespace holds.
func TestConnRequestsPerSourceIPv6Network(t *testing.T) {
	ns := servetest.Netns(t, "fd00:b::100", "fd00:b::1", "fd00:b::2", "fd00:b::3", "fd00:b::4", "fd00:b::5", "fd00:b::6", "fd00:c::1")
	for i, c := range []struct {
		bits int
		held int // of the 6 REQs from fd00:b::/64
	}{{64, 4}, {0, 6}} {
		b := openInWith(t, ns, "fd00:b::100", Options{Port: 14793 + i, MaxConnRequests: 64, MaxConnRequestsPerSource: 4, ConnRequestTTL: 10 * time.Second,
			Sources: persource.Sources{V6Bits: c.bits}})
		ln, err := b.Listen("[fd00:b::100]:3302") // nobody accepts
		if err != nil {
			t.Fatal(err)
		}
		req := func(peer string, id uint32) {
			r := ib.REQ{LocalCommID: id, ServiceID: ib.ServiceID(ib.ServiceIDBaseRDMCM, 3302), LocalQPN: 0x100 + id, PathMTU: 3, PKey: 0xffff}
			m := ib.MAD{BaseVersion: 1, MgmtClass: ib.MgmtClassCM, ClassVersion: ib.CMClassVersion, Method: ib.MethodSend, TID: uint64(id), AttrID: ib.AttrREQ}
			r.Encode(&m.Data)
			b.gotREQ(netip.MustParseAddr(peer), &m)
		}
		held := func() int {
			b.mu.Lock()
			defer b.mu.Unlock()
			return len(b.seen)
		}
		for i := range uint32(6) {
			req(fmt.Sprintf("fd00:b::%d", i+1), 2000+i)
		}
		if n := held(); n != c.held {
			t.Errorf("V6Bits %d: %d of 6 REQs from six addresses of one /64 remembered, want %d", c.bits, n, c.held)
		}
		if got, want := b.BoundsHit()["conn_requests_per_source"], uint64(6-c.held); got != want {
			t.Errorf("V6Bits %d: conn_requests_per_source hit %d times, want %d", c.bits, got, want)
		}
		req("fd00:c::1", 3000)
		if n := held(); n != c.held+1 {
			t.Errorf("V6Bits %d: another network's REQ not taken (%d remembered)", c.bits, n)
		}
		ln.Close()
	}
}
