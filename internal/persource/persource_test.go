package persource

import (
	"net"
	"testing"
)

func TestHost(t *testing.T) {
	for _, c := range []struct {
		a    net.Addr
		want string
	}{
		{nil, ""},
		{&net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 3260}, "192.0.2.1"},
		{&net.UDPAddr{IP: net.ParseIP("2001:db8::1"), Port: 4791}, "2001:db8::1"},
		{&net.UnixAddr{Name: "/run/blockwire/admin.sock", Net: "unix"}, "/run/blockwire/admin.sock"},
	} {
		if got := Host(c.a); got != c.want {
			t.Errorf("Host(%v) = %q, want %q", c.a, got, c.want)
		}
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
