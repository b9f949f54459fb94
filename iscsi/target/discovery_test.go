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
