package nvmetarget

import (
	"net"
	"testing"

	"github.com/blockwire/blockwire/nvme"
)

// TestControllersPerSource: one address holds at most
// ControllersPerSource controllers; its next admin Connect is refused
// Connect Busy (counted), while another address still gets one, and a
// controller ended gives its address's place back.
func TestControllersPerSource(t *testing.T) {
	const sub = "nqn.2026-11.io.blockwire:a"
	tg := New(Options{Controllers: 8, ControllersPerSource: 2})
	if _, err := tg.AddSubsystem(SubsystemConfig{NQN: sub}); err != nil {
		t.Fatal(err)
	}
	from := func(ip string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000} }
	connect := func(remote net.Addr) (*Queue, nvme.Completion) {
		k := nvme.Connect{QID: 0, SQSize: 31, Data: nvme.ConnectData{CNTLID: 0xffff, SubNQN: sub, HostNQN: "nqn.2026-11.io.blockwire:h"}}
		return tg.Connect(k, remote, &nullConn{})
	}
	var held []*Queue
	for range 2 {
		q, cqe := connect(from("10.0.0.1"))
		if q == nil {
			t.Fatalf("Connect: %v", cqe.Status)
		}
		held = append(held, q)
	}
	if q, cqe := connect(from("10.0.0.1")); q != nil || cqe.Status != nvme.StatusConnectBusy {
		t.Fatalf("a third controller from one address: %v, want Connect Busy", cqe.Status)
	}
	if n := tg.Refusals()["controller limit of the source"]; n != 1 {
		t.Fatalf("refusals %v; want one for the source's controllers", tg.Refusals())
	}
	if q, cqe := connect(from("10.0.0.2")); q == nil {
		t.Fatalf("another address: %v, want a controller", cqe.Status)
	}
	held[0].c.destroy()
	if q, cqe := connect(from("10.0.0.1")); q == nil {
		t.Fatalf("after one of its controllers ended: %v, want a controller", cqe.Status)
	}
}
