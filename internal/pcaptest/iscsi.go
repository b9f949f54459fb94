package pcaptest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// RawPDU is one iSCSI PDU cut from a capture.
type RawPDU struct {
	Frame     int    // frame that carried its first byte
	FromPort  uint16 // source TCP port
	BHS       []byte // 48 bytes
	AHS       []byte
	Data      []byte // without padding
	HeaderCRC *bool  // nil when no header digest was present
	DataCRC   *bool  // nil when no data digest was present
	// HD and DD are the digests as they were on the wire.
	HD, DD []byte
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ISCSIPDUs cuts every iSCSI/TCP connection of a capture (server port
// port) into PDUs. Digests are expected after the final Login Response when
// the target accepted HeaderDigest=CRC32C or DataDigest=CRC32C, and are
// checked (RFC 7143 §13.1: CRC32C, least significant byte first).
func ISCSIPDUs(path string, port uint16) ([]RawPDU, error) {
	streams, err := Streams(path)
	if err != nil {
		return nil, err
	}
	type conn struct{ hd, dd bool }
	conns := map[uint16]*conn{} // by initiator port
	var out []RawPDU
	// Target streams first: they say what was negotiated.
	for pass := 0; pass < 2; pass++ {
		for _, st := range streams {
			fromTarget := st.SrcPort == port
			if (pass == 0) != fromTarget || (st.SrcPort != port && st.DstPort != port) {
				continue
			}
			ip := st.DstPort
			if !fromTarget {
				ip = st.SrcPort
			}
			if conns[ip] == nil {
				conns[ip] = &conn{}
			}
			c := conns[ip]
			pdus, err := cut(st, fromTarget, c.hd, c.dd, func(hd, dd bool) { c.hd, c.dd = hd, dd })
			if err != nil {
				return nil, fmt.Errorf("stream %d->%d: %w", st.SrcPort, st.DstPort, err)
			}
			out = append(out, pdus...)
		}
	}
	return out, nil
}

func cut(st *Stream, fromTarget bool, hd, dd bool, learn func(hd, dd bool)) ([]RawPDU, error) {
	var out []RawPDU
	data := st.Data
	inLogin := true
	useHD, useDD := false, false
	frameAt := func(off int) int {
		best, f := -1, 0
		for o, fr := range st.Frames {
			if o <= off && o > best {
				best, f = o, fr
			}
		}
		return f
	}
	for off := 0; off < len(data); {
		if len(data)-off < 48 {
			return nil, fmt.Errorf("%d trailing bytes", len(data)-off)
		}
		p := RawPDU{Frame: frameAt(off), FromPort: st.SrcPort}
		bhs := data[off : off+48]
		p.BHS = bhs
		ahsLen := int(bhs[4]) * 4
		dsl := int(bhs[5])<<16 | int(bhs[6])<<8 | int(bhs[7])
		pos := off + 48
		if pos+ahsLen > len(data) {
			return nil, fmt.Errorf("truncated AHS at %d", off)
		}
		p.AHS = data[pos : pos+ahsLen]
		pos += ahsLen
		if useHD {
			ok := binary.LittleEndian.Uint32(data[pos:]) == crc32.Checksum(data[off:pos], castagnoli)
			p.HeaderCRC = &ok
			p.HD = data[pos : pos+4]
			pos += 4
		}
		pad := (4 - dsl&3) & 3
		if pos+dsl+pad > len(data) {
			return nil, fmt.Errorf("truncated data segment at %d", off)
		}
		p.Data = data[pos : pos+dsl]
		pos += dsl + pad
		if useDD && dsl > 0 {
			ok := binary.LittleEndian.Uint32(data[pos:]) == crc32.Checksum(data[pos-dsl-pad:pos], castagnoli)
			p.DataCRC = &ok
			p.DD = data[pos : pos+4]
			pos += 4
		}
		out = append(out, p)
		off = pos
		op := bhs[0] & 0x3f
		final := bhs[1]&0x80 != 0 && bhs[1]&0x03 == 3
		if fromTarget && op == 0x23 {
			if bytes.Contains(p.Data, []byte("HeaderDigest=CRC32C")) {
				hd = true
			}
			if bytes.Contains(p.Data, []byte("DataDigest=CRC32C")) {
				dd = true
			}
			learn(hd, dd)
		}
		if inLogin && final && (op == 0x23 || op == 0x03) {
			inLogin = false
			useHD, useDD = hd, dd
		}
	}
	return out, nil
}
