package persource

import (
	"net"
	"net/netip"
	"testing"
)

// TestSources: an IPv4 address counts alone; an IPv6 one alone by
// default, or by its /64 with V6Bits 64 (two addresses of one network are
// one source, the next network another); IPv4 written as IPv6 is IPv4; a
// link-local network keeps its zone; what is not IP is itself.
func TestSources(t *testing.T) {
	tcp := func(s string) net.Addr {
		ap := netip.MustParseAddrPort(s)
		return &net.TCPAddr{IP: ap.Addr().AsSlice(), Port: int(ap.Port()), Zone: ap.Addr().Zone()}
	}
	udp := func(s string) net.Addr { return net.UDPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	for _, c := range []struct {
		bits int
		a    net.Addr
		want string
	}{
		{0, nil, ""},
		{0, &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 3260}, "192.0.2.1"},
		{128, &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 3260}, "192.0.2.1"},
		{64, tcp("[::ffff:192.0.2.7]:3260"), "192.0.2.7"},
		{64, tcp("[2001:db8:1:2::1]:3260"), "2001:db8:1:2::/64"},
		{0, tcp("[2001:db8:1:2::1]:3260"), "2001:db8:1:2::1"},
		{64, tcp("[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:51000"), "2001:db8:1:2::/64"},
		{64, tcp("[2001:db8:1:3::1]:3260"), "2001:db8:1:3::/64"},
		{64, udp("[2001:db8::1]:4791"), "2001:db8::/64"},
		{128, udp("[2001:db8::1]:4791"), "2001:db8::1"},
		{48, tcp("[2001:db8:1:2::1]:3260"), "2001:db8:1::/48"},
		{64, tcp("[fe80::1%eth0]:3260"), "fe80::/64%eth0"},
		{64, tcp("[fe80::2%eth1]:3260"), "fe80::/64%eth1"},
		{0, tcp("[fe80::2%eth1]:3260"), "fe80::2%eth1"},
		{128, tcp("[fe80::2%eth1]:3260"), "fe80::2%eth1"},
		{64, tcp("[::1]:3260"), "::1"},
		{128, tcp("[::1]:3260"), "::1"},
		{0, &net.UnixAddr{Name: "/run/blockwire/admin.sock", Net: "unix"}, "/run/blockwire/admin.sock"},
		{64, &net.IPAddr{IP: net.ParseIP("2001:db8:5::9")}, "2001:db8:5::/64"},
	} {
		if got := (Sources{V6Bits: c.bits}).Of(c.a); got != c.want {
			t.Errorf("Sources{%d}.Of(%v) = %q, want %q", c.bits, c.a, got, c.want)
		}
	}
	// OfIP, the key the RoCE device counts by: the network's first address.
	if got := (Sources{V6Bits: 64}).OfIP(netip.MustParseAddr("2001:db8:1:2::99")); got != netip.MustParseAddr("2001:db8:1:2::") {
		t.Errorf("OfIP = %v", got)
	}
	if got := (Sources{}).OfIP(netip.MustParseAddr("::ffff:10.0.0.1")); got != netip.MustParseAddr("10.0.0.1") {
		t.Errorf("OfIP of a mapped IPv4 address = %v", got)
	}
}

// A source holds at most its limit; what it gives back it may take again;
// one source's count does not touch another's; a source that holds
// nothing is forgotten (the map does not grow with every peer ever seen).
func TestCounts(t *testing.T) {
	var c Counts[string]
	for i := range 3 {
		if !c.Take("a", 3) {
			t.Fatalf("take %d of 3 refused", i+1)
		}
	}
	if c.Take("a", 3) {
		t.Fatal("a fourth taken past a limit of 3")
	}
	if !c.Take("b", 3) || c.Of("b") != 1 || c.Of("a") != 3 {
		t.Fatalf("counts a=%d b=%d", c.Of("a"), c.Of("b"))
	}
	c.Give("a")
	if !c.Take("a", 3) {
		t.Fatal("a place given back could not be taken again")
	}
	for range 3 {
		c.Give("a")
	}
	c.Give("b")
	if c.Sources() != 0 {
		t.Fatalf("%d sources remembered after all gave back", c.Sources())
	}
	if c.Take("z", 0) {
		t.Fatal("taken past a limit of 0")
	}
}

// Refusals keeps the two bounds' counts apart, under the names given.
func TestRefusals(t *testing.T) {
	var r Refusals
	r.Refused(true)
	r.Refused(false)
	r.Refused(false)
	if h := r.Hits("all", "per_source"); len(h) != 2 || h["all"] != 1 || h["per_source"] != 2 {
		t.Fatalf("hits %v, want all 1, per_source 2", h)
	}
}
