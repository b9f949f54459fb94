// Package persource holds what every per-peer bound of blockwire shares:
// the source a connection counts against (its address without the port)
// and a count of what each source holds.
//
// The bounds it serves: logins in progress and sessions per address
// (iscsi/target), SRP channels (srp/target), MPA handshakes (rdma/siw),
// connection requests (rdma/roce), and the connections of a control
// surface (internal/httpguard).
package persource

import (
	"net"
	"sync/atomic"
)

// Host is a's address without its port — the host one peer is, whatever
// carries it (a TCP address, a RoCE device's UDP address, an InfiniBand
// CM's). An address with no port (a Unix socket's) is itself; nil is "".
func Host(a net.Addr) string {
	if a == nil {
		return ""
	}
	return HostOf(a.String())
}

// HostOf is Host for an address written as a string.
func HostOf(addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
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
