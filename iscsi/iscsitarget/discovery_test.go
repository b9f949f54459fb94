package iscsitarget

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"
	"testing/synctest"
	"time"

	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/internal/waitfor"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/scsi"
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
	other := dialAt(t, ts.addr, net.IPv4(127, 0, 0, 2))
	other.mustLogin(discoveryKeys(ini)...)
}

// TestIdleDiscoverySessionsEnd: a discovery session that asks for nothing
// within DiscoveryIdle ends, even while it answers every NOP-In ping — it
// holds a place others need; one that asks goes on.
func TestIdleDiscoverySessionsEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const idleFor = 600 * time.Millisecond
		ts := startBubbleServer(t, Options{NopInterval: 100 * time.Millisecond, NopTimeout: time.Second, DiscoveryIdle: idleFor})
		idle := ts.sessions(t, 1, discoveryKeys(ini))[0]
		start := time.Now()
		// Answer every ping until the target ends the session.
		pings := 0
		for {
			h, _, ok := idle.recv(5 * time.Second)
			if !ok {
				break
			}
			pings++
			idle.pong(h)
		}
		if d := time.Since(start); d < idleFor || d > idleFor+200*time.Millisecond {
			t.Fatalf("an idle discovery session answering its %d pings ended after %v, want %v (and a tick)", pings, d, idleFor)
		}
		if pings < 4 {
			t.Fatalf("%d pings answered in %v with a 100 ms interval", pings, idleFor)
		}
		ts.hit(t, "discovery_idle", 1)
	})
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

// TestSetupsGiveWayToNewConnections: connections still in their
// fabric's set-up — RDMA connection requests from spoofed sources whose
// RTU never comes, here set-ups that never end — cannot keep a genuine
// peer out once they fill every place for logins in progress: the oldest
// set-up gives its place to the newer connection (and ends at once), so
// the genuine peer, whose set-up completes at once, logs in, and the
// evictions are counted.
func TestSetupsGiveWayToNewConnections(t *testing.T) {
	ts := startServerOn(t, Options{MaxLogins: 6, MaxLoginsPerSource: 2, LoginTimeout: 20 * time.Second}, nil, os.Stderr,
		func(l net.Listener) stallingSetups { return stallingSetups{fabric.TCP(l)} })
	const flood = 20
	var stalled []net.Conn
	for i := range flood {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 3, byte(i+1))}}
		nc, err := d.Dial("tcp", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		stalled = append(stalled, nc)
	}
	waitfor.Within(5*time.Second, func() bool { return ts.srv.BoundsHit()["logins_setup_evicted"] >= flood-6 })
	ts.hit(t, "logins_setup_evicted", flood-6)
	// The evicted set-ups ended: their connections are closed.
	for i, nc := range stalled[:flood-6] {
		nc.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := nc.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Fatalf("set-up %d, evicted: %v, want its connection closed", i, err)
		}
	}
	c := dialAt(t, ts.addr, net.IPv4(127, 0, 2, 1))
	c.mustLogin(normalKeys(ini)...)
	ts.hit(t, "logins_setup_evicted", flood-6+1)
	ts.hit(t, "logins", 0)
}

// stallingSetups is a TCP acceptor whose connections from 127.0.3.0/24
// never finish their set-up (Establish returns only when its context
// ends), as RDMA connection requests whose RTU never comes.
type stallingSetups struct{ datamover.Acceptor }

func (a stallingSetups) Accept(ctx context.Context) (datamover.Incoming, error) {
	in, err := a.Acceptor.Accept(ctx)
	if err != nil {
		return nil, err
	}
	if ip := in.RemoteAddr().(*net.TCPAddr).IP.To4(); ip[2] == 3 {
		return stalledSetup{in}, nil
	}
	return in, nil
}

type stalledSetup struct{ datamover.Incoming }

func (in stalledSetup) Establish(ctx context.Context, p datamover.AcceptParams) (*datamover.Established, error) {
	<-ctx.Done()
	in.Close()
	return nil, context.Cause(ctx)
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestOneHostCannotStarveTheOthers: one address's sessions together hold
// half the I/O budget at most. A host with nine sessions, each holding an
// 8 MiB WRITE whose data never comes, used to take the whole 64 MiB budget
// and leave every other initiator TASK SET FULL; now another host's READ
// is answered at once, and the refusals are counted at the source bound.
func TestOneHostCannotStarveTheOthers(t *testing.T) {
	budget := blockcore.NewIOBudget(64<<20, 8<<20)
	ts := startServer(t, Options{Budget: budget}, nil)
	admitted, full := 0, 0
	for i := range 9 {
		c := dial(t, ts.addr)
		c.isid[5] = byte(i + 1)
		c.mustLogin(normalKeys(fmt.Sprintf("%s-%d", ini, i))...)
		c.sendCmd(write10(0, 8<<20/512), false, 8<<20, false, nil) // no data will follow
		h, _, ok := c.recv(5 * time.Second)
		switch {
		case !ok:
			t.Fatalf("session %d: no answer to its WRITE", i)
		case h.Opcode() == pdu.OpR2T:
			admitted++
		case h.Opcode() == pdu.OpSCSIResponse && h[3] == scsi.StatusTaskSetFull:
			full++
		default:
			t.Fatalf("session %d: %s status %#x", i, h.Opcode(), h[3])
		}
	}
	if held := int64(admitted) * 8 << 20; held > budget.SourceLimit() || full == 0 {
		t.Fatalf("one host's WRITEs: %d admitted (%d MiB), %d TASK SET FULL; its part is %d MiB", admitted, held>>20, full, budget.SourceLimit()>>20)
	}
	other := dialAt(t, ts.addr, net.IPv4(127, 0, 0, 2))
	other.mustLogin(normalKeys(ini + "-other")...)
	other.command(tur(), false, 0, nil, 0) // the power-on unit attention
	if r := other.command(read10(0, 128), true, 64<<10, nil, 0); r.status != 0 {
		t.Fatalf("another host's 64 KiB READ: status %#x (TASK SET FULL is %#x)", r.status, scsi.StatusTaskSetFull)
	}
	if r := budget.Refusals(); r["source_io_budget"] != uint64(full) {
		t.Errorf("refusals %v, want %d at the source bound", r, full)
	}
}
