package pcaptest

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
	var out []Datagram
	err := ipFrames(path, 17, func(frame int, ip, l4 []byte) {
		if len(l4) >= 8 {
			out = append(out, Datagram{Frame: frame, IP: ip, UDP: l4[:8], Payload: l4[8:]})
		}
	})
	return out, err
}
