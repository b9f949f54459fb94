package target

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// TestDiscoverySessionsPerSource: one address may hold only a handful of
// discovery sessions, so a host answering NOPs on idle discovery sessions
// cannot take every place and keep other hosts (iscsiadm -m discovery,
// our --prefer path choice) from the target list; another address still
// gets one.
func TestDiscoverySessionsPerSource(t *testing.T) {
	ts := startServer(t, Options{MaxDiscoverySessionsPerSource: 2}, nil)
	ts.sessions(t, 2, discoveryKeys(ini))
	ts.refused(t, 9, discoveryKeys(ini), "third discovery session from one address")
	ts.hit(t, "discovery_sessions_per_source", 1)
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	nc, err := d.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	other := &tclient{t: t, nc: nc, r: bufio.NewReader(nc), isid: [6]byte{0x80, 0, 0, 0, 0, 11}, keys: map[string]string{}}
	other.mustLogin(discoveryKeys(ini)...)
}

// TestIdleDiscoverySessionsEnd: a discovery session that asks for nothing
// within DiscoveryIdle ends, even while it answers every NOP-In ping — it
// holds a place others need; one that asks goes on.
func TestIdleDiscoverySessionsEnd(t *testing.T) {
	ts := startServer(t, Options{NopInterval: 100 * time.Millisecond, NopTimeout: time.Second, DiscoveryIdle: 600 * time.Millisecond}, nil)
	idle := ts.sessions(t, 1, discoveryKeys(ini))[0]
	// Answer every ping until the target ends the session.
	end := time.Now().Add(5 * time.Second)
	for {
		h, _, ok := idle.recv(time.Until(end))
		if !ok {
			break
		}
		idle.pong(h)
	}
	if time.Now().After(end) {
		t.Fatal("an idle discovery session answering its pings was not ended within 5 s")
	}
	ts.hit(t, "discovery_idle", 1)
}

// TestLoginsInProgressNodeWide: the connections still logging in are
// bounded for the whole server too (as sshd's MaxStartups), so a host with
// many addresses — a routed /64, each connection from a fresh one —
// cannot hold thousands of half-open logins; past the bound connections
// are closed at once, and counted.
func TestLoginsInProgressNodeWide(t *testing.T) {
	ts := startServer(t, Options{MaxLogins: 6, MaxLoginsPerSource: 2, LoginTimeout: 5 * time.Second}, nil)
	var held []net.Conn
	for i := range 6 {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(i+1))}}
		nc, err := d.Dial("tcp", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, nc)
	}
	defer func() {
		for _, nc := range held {
			nc.Close()
		}
	}()
	time.Sleep(100 * time.Millisecond) // accepted and counted
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 2, 1)}}
	nc, err := d.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := nc.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("a seventh login in progress, from a fresh address: %v, want it closed at once", err)
	}
	ts.hit(t, "logins", 1)
	// A finished login frees its place.
	held[0].Close()
	time.Sleep(100 * time.Millisecond)
	c := dial(t, ts.addr)
	c.mustLogin(normalKeys(ini)...)
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
