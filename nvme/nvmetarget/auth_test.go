package nvmetarget

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/blockwire/blockwire/nvme"
	"github.com/blockwire/blockwire/nvme/dhchap"
)

type nullConn struct{ closed atomic.Bool }

func (c *nullConn) Post(nvme.Completion) {}
func (c *nullConn) Close()               { c.closed.Store(true) }

// TestUnauthenticatedQueue: a queue whose host has a secret gets
// AUTHREQ.ATR at Connect and Authentication Required for anything but
// authentication — Property Get and Set (so no CC.EN), Identify, Keep
// Alive — and is closed once AuthTimeout passes without authentication;
// an AUTH_Negotiate offering no common hash ends in AUTH_Failure1 and the
// connection closed.
func TestUnauthenticatedQueue(t *testing.T) {
	key := dhchap.NewSecret(32, 0)
	tg := New(Options{AuthTimeout: 300 * time.Millisecond})
	if _, err := tg.AddSubsystem(SubsystemConfig{NQN: "nqn.2026-11.io.blockwire:a", Auth: func(string) AuthKeys { return AuthKeys{Host: &key} }}); err != nil {
		t.Fatal(err)
	}
	connect := func(conn Conn) (*Queue, nvme.Completion) {
		k := nvme.Connect{QID: 0, SQSize: 31, KATO: 0, Data: nvme.ConnectData{CNTLID: 0xffff, SubNQN: "nqn.2026-11.io.blockwire:a",
			HostNQN: "nqn.2026-11.io.blockwire:h"}}
		return tg.Connect(k, nil, conn)
	}
	conn := &nullConn{}
	q, cqe := connect(conn)
	if q == nil || cqe.Status != 0 || cqe.DW0&(1<<17) == 0 {
		t.Fatalf("Connect: %+v; want success with AUTHREQ.ATR", cqe)
	}
	for name, c := range map[string]nvme.Command{
		"Property Set CC.EN": {Opcode: nvme.AdminFabrics, NSID: nvme.FabricsPropertySet, CDW: [6]uint32{0, nvme.PropCC, 1}},
		"Property Get CAP":   {Opcode: nvme.AdminFabrics, NSID: nvme.FabricsPropertyGet, CDW: [6]uint32{1, nvme.PropCAP}},
		"Identify":           {Opcode: nvme.AdminIdentify, CDW: [6]uint32{1}},
		"Keep Alive":         {Opcode: nvme.AdminKeepAlive},
	} {
		if r := q.Exec(&c, make([]byte, 4096), nil); r.CQE.Status != statusAuthRequired {
			t.Errorf("%s before authentication: %v, want Authentication Required", name, r.CQE.Status)
		}
	}
	// A negotiation with no hash in common.
	neg := dhchap.Negotiate{TID: 7, Hashes: []dhchap.Hash{9}, Groups: []dhchap.Group{dhchap.Null}}
	msg := neg.Append(nil)
	send := nvme.Command{Opcode: nvme.AdminFabrics, NSID: nvme.FabricsAuthSend, CDW: [6]uint32{0xe9010100, uint32(len(msg))}}
	if r := q.Exec(&send, msg, nil); r.CQE.Status != 0 {
		t.Fatalf("AUTH_Negotiate: %v", r.CQE.Status)
	}
	recv := nvme.Command{Opcode: nvme.AdminFabrics, NSID: nvme.FabricsAuthReceive, CDW: [6]uint32{0xe9010100, 64}}
	buf := make([]byte, 64)
	r := q.Exec(&recv, buf, nil)
	if r.CQE.Status != 0 || r.N != 8 || buf[1] != dhchap.IDFailure1 || buf[7] != dhchap.ReasonHashUnusable {
		t.Fatalf("Receive after a negotiation without a common hash: %v, %x", r.CQE.Status, buf[:r.N])
	}
	for deadline := time.Now().Add(2 * time.Second); !conn.closed.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the connection of a failed authentication was not closed")
		}
	}
	// A queue that never authenticates is closed after AuthTimeout.
	conn2 := &nullConn{}
	if q, _ := connect(conn2); q == nil {
		t.Fatal("second Connect refused")
	}
	time.Sleep(500 * time.Millisecond)
	if !conn2.closed.Load() {
		t.Fatal("a queue silent for AuthTimeout is still open")
	}
}
