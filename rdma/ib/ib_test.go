package ib

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
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
	(&BTH{Opcode: RCAcknowledge, DestQP: 0x11, PSN: 5}).Encode(h[:])
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
	(&BTH{Opcode: RCSendOnly, Pad: 3}).Encode(h[:])
	if _, err := Decode(append(h[:], 0, 0, 0, 0)); err == nil {
		t.Error("pad beyond the payload accepted")
	}
}

func FuzzDecode(f *testing.F) {
	var h [BTHLen]byte
	for _, op := range []Opcode{RCSendOnly, RCWriteOnly, RCReadRequest, RCAcknowledge, UDSendOnly, RCCompareSwap, RCSendOnlyInvalidate} {
		(&BTH{Opcode: op, DestQP: 7, PSN: 9}).Encode(h[:])
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

// TestICRCHeaderLayouts holds Sum and SumParts to the ICRC's definition,
// written out plainly, for each IP header length mask lays out
// differently (IPv4, IPv4 with options, IPv6) and payloads on both sides
// of the fold's threshold.
func TestICRCHeaderLayouts(t *testing.T) {
	ipv4 := []byte{0x45, 0x02, 0, 0, 0x12, 0x34, 0x40, 0, 64, 17, 0xab, 0xcd, 10, 0, 0, 1, 10, 0, 0, 2}
	ipv4opt := append([]byte{0x4b}, ipv4[1:]...)
	ipv4opt = append(ipv4opt, bytes.Repeat([]byte{1}, 24)...) // NOPs: IHL 11
	ipv6 := []byte{0x6a, 0xbc, 0xde, 0xf1, 0, 0, 17, 63}
	ipv6 = append(ipv6, bytes.Repeat([]byte{0xfe, 0x80}, 16)...)
	udp := []byte{0xc0, 0x00, 0x12, 0xb7, 0, 0, 0x5a, 0x5a}
	ref := func(ip, pkt []byte) uint32 {
		m := bytes.Repeat([]byte{0xff}, 8)
		h := append([]byte(nil), ip...)
		if ip[0]>>4 == 4 {
			h[1], h[8], h[10], h[11] = 0xff, 0xff, 0xff, 0xff
		} else {
			h[0] |= 0x0f
			h[1], h[2], h[3], h[7] = 0xff, 0xff, 0xff, 0xff
		}
		m = append(m, h...)
		m = append(m, udp[:6]...)
		m = append(m, 0xff, 0xff)
		m = append(m, pkt[:4]...)
		m = append(m, 0xff)
		m = append(m, pkt[5:]...)
		return crc32.ChecksumIEEE(m)
	}
	var b ICRCBuf
	for _, ip := range [][]byte{ipv4, ipv4opt, ipv6} {
		for _, n := range []int{0, 4, 100, 511, 512, 1000, 4096 + 16} {
			pkt := make([]byte, BTHLen+n)
			for i := range pkt {
				pkt[i] = byte(i*7 + n)
			}
			want := ref(ip, pkt)
			if got := b.Sum(ip, udp, pkt); got != want {
				t.Errorf("IP header of %d bytes, %d after the BTH: Sum %#08x, want %#08x", len(ip), n, got, want)
			}
			hl := min(n, 16)
			pad := min(n-hl, 3)
			if got := b.SumParts(ip, udp, pkt[:BTHLen+hl], pkt[BTHLen+hl:len(pkt)-pad], pkt[len(pkt)-pad:]); got != want {
				t.Errorf("IP header of %d bytes, %d after the BTH: SumParts %#08x, want %#08x", len(ip), n, got, want)
			}
		}
	}
}

// BenchmarkICRC is the ICRC of a 4 KiB RDMA WRITE Middle packet over
// IPv4, the bulk of a 128 KiB iSER read (compare with BenchmarkCRC's
// hash/crc32 over the same bytes).
func BenchmarkICRC(b *testing.B) {
	ip := []byte{0x45, 0, 0x10, 0x3c, 0, 0, 0x40, 0, 64, 17, 0, 0, 127, 0, 0, 2, 127, 0, 0, 1}
	udp := []byte{0xc0, 0x00, 0x12, 0xb7, 0x10, 0x28, 0, 0}
	pkt := make([]byte, BTHLen+4096)
	pkt[0] = byte(RCWriteMiddle)
	var buf ICRCBuf
	b.SetBytes(int64(len(pkt)))
	for b.Loop() {
		buf.Sum(ip, udp, pkt)
	}
}
