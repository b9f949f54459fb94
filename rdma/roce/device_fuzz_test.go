package roce

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/ib"
)

// FuzzDeviceDatagram: whatever a host on the network sends to a device's
// UDP port — connection management MADs in any order and state, packets
// for queue pairs that exist or not, datagrams cut at any segment size —
// the device neither panics nor keeps more connection requests than its
// bound. The input is up to 4 packets, each behind a 2-byte length, and
// a segment size; each gets a valid ICRC (the harness computes it, so the
// fuzzer does not spend itself on the check that drops the rest) and goes
// to the device's receive path as from 127.0.0.3.
func FuzzDeviceDatagram(f *testing.F) {
	// A port of its own: each fuzzing process opens a device.
	pc, err := net.ListenPacket("udp4", "127.0.0.2:0")
	if err != nil {
		f.Fatal(err)
	}
	port := pc.LocalAddr().(*net.UDPAddr).Port
	pc.Close()
	d, err := Open("127.0.0.2", Options{Port: port, MaxConnRequests: 8, MaxConnRequestsPerSource: 4})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { d.Close() })
	ln, err := d.Listen("127.0.0.2:3260")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { ln.Close() })
	// Requests are accepted (the last 16 queue pairs kept), so that
	// RTUs, disconnects and RC packets meet queue pairs in every state.
	ctx, cancel := context.WithCancel(context.Background())
	f.Cleanup(cancel)
	go func() {
		e := newEnd(d)
		var qps []rdma.QP
		for {
			r, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			q, err := r.Accept(e.params(nil, rdma.RecvWR{ID: 1, Buf: make([]byte, 256)}))
			if err != nil {
				continue
			}
			if qps = append(qps, q); len(qps) > 16 {
				qps[0].Close()
				qps = qps[1:]
			}
		}
	}()

	mad := func(attr uint16, data [ib.CMDataLen]byte) []byte {
		m := ib.MAD{BaseVersion: 1, MgmtClass: ib.MgmtClassCM, ClassVersion: ib.CMClassVersion, Method: ib.MethodSend, TID: 9, AttrID: attr, Data: data}
		b, err := (&ib.Packet{BTH: ib.BTH{Opcode: ib.UDSendOnly, PKey: 0xffff, DestQP: 1}, DETH: ib.DETH{QKey: ib.GSIQKey, SrcQP: 1}, Payload: m.Append(nil)}).Append(nil)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	input := func(gso uint16, pkts ...[]byte) []byte {
		b := binary.BigEndian.AppendUint16(nil, gso)
		for _, p := range pkts {
			b = append(binary.BigEndian.AppendUint16(b, uint16(len(p))), p...)
		}
		return b
	}
	var req [ib.CMDataLen]byte
	(&ib.REQ{LocalCommID: 77, ServiceID: ib.ServiceID(ib.ServiceIDBaseRDMCM, 3260), LocalQPN: 0x33, StartingPSN: 5,
		PathMTU: 3, TransportType: 0, ResponderResources: 4, InitiatorDepth: 4}).Encode(&req)
	var rtu, dreq [ib.CMDataLen]byte
	ib.PutCommIDs(&rtu, ib.CommIDs{Local: 77, Remote: 1}, nil)
	ib.PutCommIDs(&dreq, ib.CommIDs{Local: 77, Remote: 1}, nil)
	f.Add(input(0, mad(ib.AttrREQ, req)))
	f.Add(input(0, mad(ib.AttrREQ, req), mad(ib.AttrRTU, rtu)))
	f.Add(input(0, mad(ib.AttrREQ, req), mad(ib.AttrRTU, rtu), mad(ib.AttrDREQ, dreq)))
	f.Add(input(0, mad(ib.AttrREP, req), mad(ib.AttrREJ, req), mad(ib.AttrMRA, req)))
	rc, _ := (&ib.Packet{BTH: ib.BTH{Opcode: ib.RCSendOnly, PKey: 0xffff, DestQP: 0x12, PSN: 5}, Payload: []byte("abcd")}).Append(nil)
	f.Add(input(0, rc))
	f.Add(input(300, append(append([]byte(nil), rc...), rc...)))

	src := netip.MustParseAddr("127.0.0.3")
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 2 {
			return
		}
		gso := int(binary.BigEndian.Uint16(in))
		in = in[2:]
		var h held
		for range 4 {
			if len(in) < 2 {
				break
			}
			n := int(binary.BigEndian.Uint16(in))
			in = in[2:]
			if n > len(in) {
				n = len(in)
			}
			body := in[:n]
			in = in[n:]
			ulen := 8 + len(body) + ib.ICRCLen
			ip := ipHeader(src, d.ip, ulen)
			udp := udpHeader(port, port, ulen)
			pkt := append([]byte(nil), body...)
			if len(body) >= ib.BTHLen {
				pkt = ib.AppendICRC(ip.bytes(), udp[:], pkt)
			}
			d.datagram(src, &ip, udp[:], pkt, gso, &h)
			h.flush()
		}
		d.mu.Lock()
		held := len(d.seen)
		d.mu.Unlock()
		if held > 8 {
			t.Fatalf("%d connection requests kept (the bound is 8)", held)
		}
	})
}
