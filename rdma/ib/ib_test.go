package ib

import (
	"bytes"
	"encoding/binary"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/blockwire/blockwire/internal/pcaptest"
)

// Every RoCEv2 packet Linux's rdma_rxe sent in the iSER capture (ib_iser
// to LIO's isert) decodes, carries the ICRC we compute, and re-encodes to
// the same bytes.
func TestGoldenRXE(t *testing.T) {
	ds, err := pcaptest.Datagrams(filepath.Join(pcaptest.Dir(t), "iser-rxe.pcap"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[Opcode]int{}
	n := 0
	icrc := new(ICRCBuf)
	for _, d := range ds {
		if binary.BigEndian.Uint16(d.UDP[2:]) != UDPPort {
			continue
		}
		n++
		p, err := Decode(d.Payload)
		if err != nil {
			t.Fatalf("frame %d: %v", d.Frame, err)
		}
		seen[p.BTH.Opcode]++
		body := d.Payload[:len(d.Payload)-ICRCLen]
		if got := ICRC(d.IP, d.UDP, body); got != p.ICRC {
			t.Fatalf("frame %d (%s): ICRC %#08x on the wire, computed %#08x", d.Frame, p.BTH.Opcode, p.ICRC, got)
		}
		if got := icrc.Sum(d.IP, d.UDP, body); got != p.ICRC {
			t.Fatalf("frame %d (%s): ICRC %#08x on the wire, ICRCBuf.Sum %#08x", d.Frame, p.BTH.Opcode, p.ICRC, got)
		}
		// The same held in parts: headers, payload, pad.
		hl, _ := HeaderLen(p.BTH.Opcode)
		end := len(body) - int(p.BTH.Pad)
		if got := icrc.SumParts(d.IP, d.UDP, body[:hl], body[hl:end], body[end:]); got != p.ICRC {
			t.Fatalf("frame %d (%s): ICRC %#08x on the wire, ICRCBuf.SumParts %#08x", d.Frame, p.BTH.Opcode, p.ICRC, got)
		}
		again, err := p.Append(nil)
		if err != nil {
			t.Fatalf("frame %d: %v", d.Frame, err)
		}
		again = AppendICRC(d.IP, d.UDP, again)
		if !bytes.Equal(again, d.Payload) {
			t.Fatalf("frame %d (%s): re-encoded\n% x\nwire\n% x", d.Frame, p.BTH.Opcode, again[:min(64, len(again))], d.Payload[:min(64, len(d.Payload))])
		}
		// Connection management travels in UD SENDs to QP 1 (the GSI)
		// with the well-known Q_Key.
		if p.BTH.Opcode == UDSendOnly && (p.BTH.DestQP != 1 || p.DETH.QKey != 0x80010000) {
			t.Errorf("frame %d: UD SEND to QP %d, Q_Key %#x", d.Frame, p.BTH.DestQP, p.DETH.QKey)
		}
	}
	if n < 1000 {
		t.Fatalf("only %d RoCEv2 packets", n)
	}
	for _, op := range []Opcode{UDSendOnly, RCSendOnly, RCAcknowledge, RCWriteOnly, RCSendOnlyInvalidate, RCReadRequest} {
		if seen[op] == 0 {
			t.Errorf("no %s in the capture (seen %v)", op, seen)
		}
	}
	t.Logf("%d RoCEv2 packets: %v", n, seen)
	// A flipped payload bit is caught.
	for _, d := range ds {
		if binary.BigEndian.Uint16(d.UDP[2:]) != UDPPort {
			continue
		}
		bad := append([]byte(nil), d.Payload...)
		bad[BTHLen] ^= 1
		p, _ := Decode(bad)
		if ICRC(d.IP, d.UDP, bad[:len(bad)-ICRCLen]) == p.ICRC {
			t.Fatal("a corrupted packet has a good ICRC")
		}
		// The fields routers change do not count: TTL and the IPv4
		// checksum.
		ip := append([]byte(nil), d.IP...)
		ip[8]--
		ip[10] ^= 0xff
		if ICRC(ip, d.UDP, d.Payload[:len(d.Payload)-ICRCLen]) != p.ICRC {
			t.Fatal("TTL or IP checksum changed the ICRC")
		}
		break
	}
}

func TestDecodeErrors(t *testing.T) {
	var h [BTHLen]byte
	(&BTH{Opcode: RCAcknowledge, DestQP: 0x11, PSN: 5}).Put(h[:])
	ack := append(h[:], 0, 0, 0, 1, 0, 0, 0, 0) // AETH + ICRC
	if _, err := Decode(ack); err != nil {
		t.Fatal(err)
	}
	cases := map[string][]byte{
		"short":            ack[:10],
		"no room for AETH": ack[:BTHLen+2],
		"payload on ACK":   append(append([]byte(nil), ack[:BTHLen+4]...), 1, 2, 3, 4, 0, 0, 0, 0),
		"unknown opcode":   append([]byte{0x1f}, ack[1:]...),
		"transport ver":    append([]byte{byte(RCAcknowledge), 0x01}, ack[2:]...),
	}
	for name, b := range cases {
		if _, err := Decode(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Pad larger than what follows the headers.
	(&BTH{Opcode: RCSendOnly, Pad: 3}).Put(h[:])
	if _, err := Decode(append(h[:], 0, 0, 0, 0)); err == nil {
		t.Error("pad beyond the payload accepted")
	}
}

func FuzzDecode(f *testing.F) {
	var h [BTHLen]byte
	for _, op := range []Opcode{RCSendOnly, RCWriteOnly, RCReadRequest, RCAcknowledge, UDSendOnly, RCCompareSwap, RCSendOnlyInvalidate} {
		(&BTH{Opcode: op, DestQP: 7, PSN: 9}).Put(h[:])
		l, _ := HeaderLen(op)
		f.Add(append(append(h[:], make([]byte, l-BTHLen)...), 0, 0, 0, 0))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Decode(b)
		if err != nil {
			return
		}
		out, err := p.Append(nil)
		if err != nil {
			t.Fatalf("decoded but not encodable: %v", err)
		}
		// What was decoded is what is encoded: decoding the encoding
		// gives the same packet (reserved bits and pad contents are not
		// kept, by design).
		out = binary.LittleEndian.AppendUint32(out, p.ICRC)
		q, err := Decode(out)
		if err != nil {
			t.Fatalf("re-encoded packet does not decode: %v", err)
		}
		if !reflect.DeepEqual(p, q) {
			t.Fatalf("round trip\n%+v\n%+v", p, q)
		}
	})
}
