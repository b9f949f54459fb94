// Package persource holds what every per-peer bound of blockwire shares:
// the source a connection counts against (its address, or an IPv6 peer's
// network: Sources) and a count of what each source holds.
//
// The bounds it serves: logins in progress and sessions per address
// (iscsi/iscsitarget), SRP channels (srp/srptarget), MPA handshakes (rdma/siw),
// connection requests (rdma/roce), and the connections of a control
// surface (internal/httpguard).
package persource

import (
	"net"
	"net/netip"
	"sync/atomic"
)

// Sources says which peers count as one source. An IPv4 address is one
// source; an IPv6 peer is its address (V6Bits 0 or 128) or the network of
// its address's first V6Bits bits. A peer given a whole network (a routed
// /64, /56 or /48) takes any of its addresses at will, so where such
// peers reach a portal, a bound per address bounds none of them: 64 or
// less counts the network once. On a storage LAN, where one /64 holds
// every host of the segment, each address alone keeps the hosts apart —
// hence the default. A link-local address keeps its zone (two links are
// two sources); an IPv4 address written as IPv6 (::ffff:a.b.c.d) is IPv4;
// ::1 is alone. The zero value is ready.
type Sources struct {
	V6Bits int
}

// DefaultV6Bits is how much of an IPv6 address names its source when
// Sources.V6Bits is 0: all of it.
const DefaultV6Bits = 128

func (s Sources) bits() int {
	if s.V6Bits <= 0 || s.V6Bits > 128 {
		return DefaultV6Bits
	}
	return s.V6Bits
}

// Of is the source a's peer counts against, written as a string: an IPv4
// address, an IPv6 address, or an IPv6 network ("2001:db8:1:2::/64") —
// whatever carries it (a TCP address, a RoCE device's UDP address, an
// InfiniBand CM's). An address that is not IP (a Unix socket's) is its
// own source, without a port; nil is "".
func (s Sources) Of(a net.Addr) string {
	if a == nil {
		return ""
	}
	var ip netip.Addr
	switch a := a.(type) {
	case interface{ AddrPort() netip.AddrPort }: // *net.TCPAddr, *net.UDPAddr
		ip = a.AddrPort().Addr()
	default:
		str := a.String()
		host, _, err := net.SplitHostPort(str)
		if err != nil {
			host = str
		}
		if ip, err = netip.ParseAddr(host); err != nil {
			return host
		}
	}
	if !ip.IsValid() {
		return a.String()
	}
	return s.format(s.OfIP(ip))
}

// OfIP is the source ip counts against: ip itself (IPv4, or IPv6 with
// V6Bits 128), or the first address of its IPv6 network, zone kept.
func (s Sources) OfIP(ip netip.Addr) netip.Addr {
	ip = ip.Unmap()
	if !ip.Is6() || ip.IsLoopback() {
		return ip // ::1 is alone in its network
	}
	p, err := ip.WithZone("").Prefix(s.bits())
	if err != nil {
		return ip
	}
	return p.Addr().WithZone(ip.Zone())
}

// format writes a source from OfIP: an IPv6 network with its length.
func (s Sources) format(ip netip.Addr) string {
	if !ip.Is6() || ip.IsLoopback() || s.bits() == 128 {
		return ip.String()
	}
	str := netip.PrefixFrom(ip.WithZone(""), s.bits()).String()
	if z := ip.Zone(); z != "" {
		str += "%" + z
	}
	return str
}

// Counts counts what each source holds. It has no lock of its own: the
// caller guards it with the lock that guards what it counts, so a check
// of several bounds (one source's, everyone's) and the count move
// together. The zero value is ready.
type Counts[K comparable] struct {
	m map[K]int
}

// Take counts one more for src unless it holds limit already; it reports
// whether it did.
func (c *Counts[K]) Take(src K, limit int) bool {
	if c.m[src] >= limit {
		return false
	}
	c.Add(src)
	return true
}

// Add counts one more for src whatever it holds (a bound checked
// earlier, with Of).
func (c *Counts[K]) Add(src K) {
	if c.m == nil {
		c.m = map[K]int{}
	}
	c.m[src]++
}

// Give counts one fewer for src (a source that holds nothing is
// forgotten).
func (c *Counts[K]) Give(src K) {
	if c.m[src]--; c.m[src] <= 0 {
		delete(c.m, src)
	}
}

// Of is how many src holds.
func (c *Counts[K]) Of(src K) int { return c.m[src] }

// Sources is how many sources hold something.
func (c *Counts[K]) Sources() int { return len(c.m) }

// Refusals counts what a pair of bounds refused: the bound on everyone's
// (all) and the one on each source's — for the metrics
// (blockwire_bounds_hit_total). The zero value is ready.
type Refusals struct {
	all, source atomic.Uint64
}

// Refused counts one refusal, by the bound on everyone's when all, else
// by the source's.
func (r *Refusals) Refused(all bool) {
	if all {
		r.all.Add(1)
	} else {
		r.source.Add(1)
	}
}

// Hits are the counts under their bounds' names: allName's, sourceName's.
func (r *Refusals) Hits(allName, sourceName string) map[string]uint64 {
	return map[string]uint64{allName: r.all.Load(), sourceName: r.source.Load()}
}
