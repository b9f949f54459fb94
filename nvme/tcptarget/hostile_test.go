package tcptarget

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/internal/waitfor"
	"github.com/blockwire/blockwire/nvme"
	"github.com/blockwire/blockwire/nvme/nvmetcp"
	"github.com/blockwire/blockwire/nvme/tcphost"
)

// raw is a host that writes PDUs by hand: what a broken or hostile host
// sends.
type raw struct {
	t  *testing.T
	nc net.Conn
}

func dialRaw(t *testing.T, addr string, hdgst bool) *raw {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	var b [nvmetcp.ICLen]byte
	(&nvmetcp.ICReq{HeaderDigest: hdgst}).Encode(&b)
	if _, err := nc.Write(b[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(nc, b[:]); err != nil {
		t.Fatal(err)
	}
	var resp nvmetcp.ICResp
	if err := resp.Decode(&b); err != nil || resp.HeaderDigest != hdgst {
		t.Fatalf("ICResp %+v, %v", resp, err)
	}
	return &raw{t: t, nc: nc}
}

// capsule sends a command, its data in the capsule when data is set.
func (r *raw) capsule(cmd nvme.Command, data []byte) {
	r.t.Helper()
	cmd.PSDT = 1
	if data != nil {
		cmd.DPTR = nvme.SGL{Length: uint32(len(data)), ID: nvme.SGLDataBlockOffset}
	}
	cc := nvmetcp.CapsuleCmd{PLen: uint32(nvmetcp.CapsuleCmdLen + len(data))}
	if data != nil {
		cc.PDO = nvmetcp.CapsuleCmdLen
	}
	cmd.Encode(&cc.SQE)
	b := make([]byte, nvmetcp.CapsuleCmdLen, int(cc.PLen))
	cc.Encode(b)
	if _, err := r.nc.Write(append(b, data...)); err != nil {
		r.t.Fatal(err)
	}
}

// next reads one PDU's header (and drops its data).
func (r *raw) next() (nvmetcp.Common, []byte, error) {
	b := make([]byte, nvmetcp.MaxTermPLen)
	if _, err := io.ReadFull(r.nc, b[:nvmetcp.CommonLen]); err != nil {
		return nvmetcp.Common{}, nil, err
	}
	var h nvmetcp.Common
	if err := h.Decode(b); err != nil {
		return h, nil, err
	}
	rest := make([]byte, int(h.PLen)-nvmetcp.CommonLen)
	if _, err := io.ReadFull(r.nc, rest); err != nil {
		return h, nil, err
	}
	return h, append(b[:nvmetcp.CommonLen], rest...), nil
}

// response reads PDUs up to the next response capsule.
func (r *raw) response() nvme.Completion {
	r.t.Helper()
	for {
		h, b, err := r.next()
		if err != nil {
			r.t.Fatal(err)
		}
		if h.Type == nvmetcp.TypeCapsuleResp {
			var cr nvmetcp.CapsuleResp
			cr.Decode(b)
			var c nvme.Completion
			c.Decode(&cr.CQE)
			return c
		}
	}
}

// connectAdmin sends an admin queue Connect (size entries) and enables
// the controller.
func (r *raw) connectAdmin(size int) {
	r.t.Helper()
	k := nvme.Connect{SQSize: uint16(size - 1), Data: nvme.ConnectData{CNTLID: 0xffff, SubNQN: testNQN, HostNQN: "nqn.2026-11.io.blockwire:hostile"}}
	var cmd nvme.Command
	data := make([]byte, nvme.ConnectDataLen)
	k.Encode(&cmd, data)
	r.capsule(cmd, data)
	if c := r.response(); c.Status != 0 {
		r.t.Fatalf("Connect: %v", c.Status)
	}
	var p nvme.Command
	(&nvme.Property{Set: true, Size: 4, Offset: nvme.PropCC, Value: nvme.CCEnable}).Encode(&p)
	p.CID = 1
	r.capsule(p, nil)
	if c := r.response(); c.Status != 0 {
		r.t.Fatalf("Property Set CC: %v", c.Status)
	}
}

// terminated reads to the end of the connection and returns the
// termination request's FES, failing if there is none.
func (r *raw) terminated() uint16 {
	r.t.Helper()
	for {
		h, b, err := r.next()
		if err != nil {
			r.t.Fatalf("the connection ended without a termination request: %v", err)
		}
		if h.Type == nvmetcp.TypeC2HTermReq {
			var term nvmetcp.Term
			if err := term.Decode(b); err != nil {
				r.t.Fatal(err)
			}
			// Closed: an end of file, or a reset when the host's last
			// bytes were left unread.
			if _, err := r.nc.Read(make([]byte, 1)); err == nil || os.IsTimeout(err) {
				r.t.Fatalf("the connection stayed open after the termination request: %v", err)
			}
			return term.FES
		}
	}
}

// TestSetupBounds: a connection that sends no ICReq (or no Connect) is
// closed after the set-up timeout; beyond Setups connections in set-up,
// a new one is closed at once; nothing is left behind.
func TestSetupBounds(t *testing.T) {
	f := start(t, Options{SetupTimeout: 300 * time.Millisecond, Setups: 2}, nil)
	var idle []net.Conn
	for range 2 {
		nc, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		idle = append(idle, nc)
	}
	waitfor.True(t, 5*time.Second, func() bool { return f.srv.Setups() == 2 }, func() string { return fmt.Sprint(f.srv.Setups(), " set-ups") })
	nc, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := nc.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("a connection beyond the set-up bound: %v, want it closed", err)
	}
	if got := f.srv.Stats().Refused.Load(); got != 1 {
		t.Fatalf("%d refused, want 1", got)
	}
	start := time.Now()
	for _, c := range idle {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("an idle connection: %v, want it closed by the set-up timeout", err)
		}
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("idle connections closed after %v, the timeout is 300 ms", d)
	}
	waitfor.True(t, 5*time.Second, func() bool { return f.srv.Conns() == 0 && f.srv.Setups() == 0 },
		func() string { return fmt.Sprintf("%d connections, %d set-ups", f.srv.Conns(), f.srv.Setups()) })
}

// TestMoreCommandsThanTheQueue: a host that sends more commands than its
// queue holds has its connection terminated (sequence error), and its
// controller and buffers are released.
func TestMoreCommandsThanTheQueue(t *testing.T) {
	budget := blockcore.NewIOBudget(1<<30, 1<<30)
	f := start(t, Options{Budget: budget}, nil)
	r := dialRaw(t, f.addr, false)
	r.connectAdmin(4)
	// Set Features with 4 KiB of data to come through R2T: each holds a
	// slot and a buffer while its data does not come.
	for i := range 5 {
		cmd := nvme.Command{Opcode: nvme.AdminSetFeatures, CID: uint16(10 + i), PSDT: 1, DPTR: nvme.SGL{Length: 4096, ID: nvme.SGLTransportDataBlock}, CDW: [6]uint32{0x81}}
		r.capsule(cmd, nil)
	}
	if fes := r.terminated(); fes != nvmetcp.FESSequenceError {
		t.Fatalf("FES %#x, want a sequence error", fes)
	}
	waitfor.True(t, 5*time.Second, func() bool { return f.srv.Conns() == 0 && f.tgt.Controllers() == 0 && budget.Used() == 0 },
		func() string {
			return fmt.Sprintf("%d connections, %d controllers, %d budget bytes", f.srv.Conns(), f.tgt.Controllers(), budget.Used())
		})
}

// TestBadHeaderDigest: a header whose digest does not match ends the
// connection with a header digest error.
func TestBadHeaderDigest(t *testing.T) {
	f := start(t, Options{}, nil)
	r := dialRaw(t, f.addr, true)
	var cc nvmetcp.CapsuleCmd
	cc.Flags, cc.PLen = nvmetcp.FlagHDGST, nvmetcp.CapsuleCmdLen+nvmetcp.DigestLen
	b := make([]byte, nvmetcp.CapsuleCmdLen+nvmetcp.DigestLen)
	cc.Encode(b)
	nvmetcp.PutDigest(b[nvmetcp.CapsuleCmdLen:], nvmetcp.Digest(b[:nvmetcp.CapsuleCmdLen])^1)
	r.nc.Write(b)
	if fes := r.terminated(); fes != nvmetcp.FESHeaderDigest {
		t.Fatalf("FES %#x, want a header digest error", fes)
	}
}

// TestNothingLargeBeforeConnect: a first capsule that is a Connect with
// a megabyte of data to come, or more than a Connect's data in it, gets
// nothing allocated: a refusal or a terminated connection.
func TestNothingLargeBeforeConnect(t *testing.T) {
	f := start(t, Options{}, nil)
	r := dialRaw(t, f.addr, false)
	var k nvme.Connect
	k.Data = nvme.ConnectData{CNTLID: 0xffff, SubNQN: testNQN, HostNQN: "nqn.2026-11.io.blockwire:hostile"}
	var cmd nvme.Command
	k.Encode(&cmd, make([]byte, nvme.ConnectDataLen))
	cmd.PSDT, cmd.DPTR = 1, nvme.SGL{Length: 1 << 20, ID: nvme.SGLTransportDataBlock}
	cc := nvmetcp.CapsuleCmd{PLen: nvmetcp.CapsuleCmdLen}
	cmd.Encode(&cc.SQE)
	b := make([]byte, nvmetcp.CapsuleCmdLen)
	cc.Encode(b)
	r.nc.Write(b)
	if c := r.response(); c.Status != nvme.StatusConnectInvalidParam {
		t.Fatalf("a Connect asking to send 1 MiB: %v, want invalid parameter", c.Status)
	}
	r = dialRaw(t, f.addr, false)
	r.capsule(cmd, make([]byte, 4096))
	if fes := r.terminated(); fes != nvmetcp.FESDataLimitExceeded {
		t.Fatalf("4 KiB in the first capsule: FES %#x, want data limit exceeded", fes)
	}
}

// TestBudgetRefusal: a write the I/O budget has no room for is answered
// with a status the host retries (Namespace Not Ready), not held.
func TestBudgetRefusal(t *testing.T) {
	budget := blockcore.NewIOBudget(64<<10, 64<<10)
	f := start(t, Options{Budget: budget}, nil)
	r := dialRaw(t, f.addr, false)
	r.connectAdmin(4)
	cmd := nvme.Command{Opcode: nvme.AdminIdentify, CID: 7, PSDT: 1, DPTR: nvme.SGL{Length: 4096, ID: nvme.SGLTransportDataBlock}, CDW: [6]uint32{1}}
	r.capsule(cmd, nil)
	if c := r.response(); c.Status != 0 || c.CID != 7 {
		t.Fatalf("Identify within the budget: %+v", c)
	}
	// A 1 MiB Get Log Page: over the 64 KiB budget.
	cmd = nvme.Command{Opcode: nvme.AdminGetLogPage, CID: 8, PSDT: 1, DPTR: nvme.SGL{Length: 1 << 20, ID: nvme.SGLTransportDataBlock}, CDW: [6]uint32{0x02 | 0xffff<<16, 3}}
	r.capsule(cmd, nil)
	if c := r.response(); c.Status != nvme.StatusNamespaceNotReady || c.Status.DNR() {
		t.Fatalf("a command over the budget: %v, want namespace not ready (retried)", c.Status)
	}
	if budget.Used() != 0 || f.srv.Stats().BudgetRefusals.Load() != 1 {
		t.Fatalf("budget used %d, refusals %d", budget.Used(), f.srv.Stats().BudgetRefusals.Load())
	}
}

// TestSetupBoundPerSource: one address that opens connections and never
// sets them up holds at most SetupsPerSource set-up places; its next
// connection is closed at once (counted as setups_per_source), while
// another address still connects and gets a controller.
func TestSetupBoundPerSource(t *testing.T) {
	f := start(t, Options{SetupTimeout: 10 * time.Second, Setups: 8, SetupsPerSource: 2}, nil)
	dialFrom := func(ip string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		nc, err := d.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		return nc
	}
	for range 2 {
		dialFrom("127.0.0.7")
	}
	waitfor.True(t, 5*time.Second, func() bool { return f.srv.Setups() == 2 }, func() string { return fmt.Sprint(f.srv.Setups(), " set-ups") })
	nc := dialFrom("127.0.0.7")
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := nc.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("a third idle connection from one address: %v, want it closed", err)
	}
	if got := f.srv.BoundsHit()["setups_per_source"]; got != 1 {
		t.Fatalf("setups_per_source hit %d times, want 1 (%v)", got, f.srv.BoundsHit())
	}
	c := f.connect(tcphost.Options{IOQueues: 1, QueueSize: 8})
	defer c.Close()
	if err := c.Read(ctx(t), 1, 512, 0, make([]byte, 512)); err != nil {
		t.Fatalf("another address's host: %v", err)
	}
}
