package pcaptest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
)

// Datagram is one UDP datagram with the headers under it, as RoCEv2's
// invariant CRC covers them.
type Datagram struct {
	Frame   int
	IP      []byte // the IPv4 or IPv6 header
	UDP     []byte // 8 bytes
	Payload []byte
}

// Datagrams returns every UDP datagram of a capture, in order.
func Datagrams(path string) ([]Datagram, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) < 24 {
		return nil, errors.New("pcaptest: short file")
	}
	var bo binary.ByteOrder = binary.BigEndian
	if m := binary.LittleEndian.Uint32(b); m == 0xa1b2c3d4 || m == 0xa1b23c4d {
		bo = binary.LittleEndian
	}
	if lt := bo.Uint32(b[20:]); lt != 1 {
		return nil, fmt.Errorf("pcaptest: link type %d, want Ethernet", lt)
	}
	var out []Datagram
	off := 24
	for frame := 1; off+16 <= len(b); frame++ {
		incl := int(bo.Uint32(b[off+8:]))
		off += 16
		if off+incl > len(b) {
			return nil, fmt.Errorf("pcaptest: frame %d truncated", frame)
		}
		pkt := b[off : off+incl]
		off += incl
		if len(pkt) < 14 {
			continue
		}
		ip := pkt[14:]
		var hdr, l4 []byte
		switch binary.BigEndian.Uint16(pkt[12:]) {
		case 0x0800:
			if len(ip) < 20 || ip[9] != 17 {
				continue
			}
			ihl := int(ip[0]&0x0f) * 4
			total := int(binary.BigEndian.Uint16(ip[2:]))
			if total > len(ip) || ihl > total {
				continue
			}
			hdr, l4 = ip[:ihl], ip[ihl:total]
		case 0x86dd:
			if len(ip) < 40 || ip[6] != 17 {
				continue
			}
			plen := int(binary.BigEndian.Uint16(ip[4:]))
			if 40+plen > len(ip) {
				continue
			}
			hdr, l4 = ip[:40], ip[40:40+plen]
		default:
			continue
		}
		if len(l4) < 8 {
			continue
		}
		out = append(out, Datagram{Frame: frame, IP: hdr, UDP: l4[:8], Payload: l4[8:]})
	}
	return out, nil
}
