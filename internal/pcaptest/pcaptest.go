// Package pcaptest reads the golden packet captures (testdata/captures, copies of shared/captures) for
// tests: it parses classic pcap files with Ethernet/IPv4-or-IPv6/TCP frames
// and rebuilds each direction of each TCP connection as one byte stream.
// It is a test helper; nothing in the product imports it.
package pcaptest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// Dir returns the golden captures: testdata/captures at the repository
// root (copies of shared/captures, so the codec tests run in any clone).
func Dir(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			p := filepath.Join(d, "testdata", "captures")
			if _, err := os.Stat(p); err != nil {
				t.Fatalf("golden captures missing: %v", err)
			}
			return p
		}
		if filepath.Dir(d) == d {
			t.Fatal("repository root (go.mod) not found")
		}
	}
}

// Segment is one TCP payload.
type Segment struct {
	Frame   int // 1-based frame number, as tshark numbers them
	SrcPort uint16
	DstPort uint16
	Seq     uint32
	Payload []byte
}

// Segments returns every TCP segment with a payload, in capture order.
func Segments(path string) ([]Segment, error) {
	var out []Segment
	err := ipFrames(path, 6, func(frame int, _, l4 []byte) {
		if len(l4) < 20 {
			return
		}
		doff := int(l4[12]>>4) * 4
		if doff > len(l4) || doff == len(l4) {
			return
		}
		out = append(out, Segment{
			Frame:   frame,
			SrcPort: binary.BigEndian.Uint16(l4[0:]),
			DstPort: binary.BigEndian.Uint16(l4[2:]),
			Seq:     binary.BigEndian.Uint32(l4[4:]),
			Payload: l4[doff:],
		})
	})
	return out, err
}

// ipFrames calls fn for every Ethernet frame of a classic pcap file that
// carries IPv4 or IPv6 with transport protocol proto, with the IP header
// and the transport bytes (up to the IP length).
func ipFrames(path string, proto byte, fn func(frame int, ipHdr, l4 []byte)) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if len(b) < 24 {
		return errors.New("pcaptest: short file")
	}
	var bo binary.ByteOrder = binary.BigEndian
	if m := binary.LittleEndian.Uint32(b); m == 0xa1b2c3d4 || m == 0xa1b23c4d {
		bo = binary.LittleEndian
	}
	if lt := bo.Uint32(b[20:]); lt != 1 {
		return fmt.Errorf("pcaptest: link type %d, want Ethernet", lt)
	}
	off := 24
	for frame := 1; off+16 <= len(b); frame++ {
		incl := int(bo.Uint32(b[off+8:]))
		off += 16
		if off+incl > len(b) {
			return fmt.Errorf("pcaptest: frame %d truncated", frame)
		}
		pkt := b[off : off+incl]
		off += incl
		if len(pkt) < 14 {
			continue
		}
		ip := pkt[14:]
		switch binary.BigEndian.Uint16(pkt[12:]) {
		case 0x0800:
			if len(ip) < 20 || ip[9] != proto {
				continue
			}
			ihl := int(ip[0]&0x0f) * 4
			total := int(binary.BigEndian.Uint16(ip[2:]))
			if total > len(ip) || ihl > total {
				continue
			}
			fn(frame, ip[:ihl], ip[ihl:total])
		case 0x86dd:
			if len(ip) < 40 || ip[6] != proto {
				continue
			}
			plen := int(binary.BigEndian.Uint16(ip[4:]))
			if 40+plen > len(ip) {
				continue
			}
			fn(frame, ip[:40], ip[40:40+plen])
		}
	}
	return nil
}

// Stream is one direction of one TCP connection.
type Stream struct {
	SrcPort, DstPort uint16
	Data             []byte
	// Frames maps a byte offset in Data to the frame that carried it
	// (offset of the first byte of each segment).
	Frames map[int]int
}

// Streams rebuilds every direction of every connection in a capture,
// ordering segments by sequence number and dropping retransmitted bytes.
func Streams(path string) ([]*Stream, error) {
	segs, err := Segments(path)
	if err != nil {
		return nil, err
	}
	type key struct{ s, d uint16 }
	by := map[key][]Segment{}
	var order []key
	for _, s := range segs {
		k := key{s.SrcPort, s.DstPort}
		if _, ok := by[k]; !ok {
			order = append(order, k)
		}
		by[k] = append(by[k], s)
	}
	var out []*Stream
	for _, k := range order {
		list := by[k]
		sort.SliceStable(list, func(i, j int) bool { return int32(list[i].Seq-list[0].Seq) < int32(list[j].Seq-list[0].Seq) })
		st := &Stream{SrcPort: k.s, DstPort: k.d, Frames: map[int]int{}}
		base := list[0].Seq
		for _, s := range list {
			rel := int(s.Seq - base)
			if rel+len(s.Payload) <= len(st.Data) {
				continue // retransmission
			}
			if rel < len(st.Data) {
				s.Payload = s.Payload[len(st.Data)-rel:]
				rel = len(st.Data)
			}
			if rel > len(st.Data) {
				return nil, fmt.Errorf("pcaptest: gap in stream %d->%d before frame %d", k.s, k.d, s.Frame)
			}
			st.Frames[len(st.Data)] = s.Frame
			st.Data = append(st.Data, s.Payload...)
		}
		out = append(out, st)
	}
	return out, nil
}
