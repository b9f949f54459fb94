package tcptarget

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/nvme"
	"github.com/blockwire/blockwire/nvme/nvmetarget"
	"github.com/blockwire/blockwire/nvme/nvmetcp"
)

// connected is what a host sends to reach an enabled controller's admin
// queue: ICReq, Connect, Property Set CC.EN. The fuzzer's bytes follow.
func connected(hdgst bool) []byte {
	var ic [nvmetcp.ICLen]byte
	(&nvmetcp.ICReq{HeaderDigest: hdgst}).Encode(&ic)
	out := append([]byte(nil), ic[:]...)
	capsule := func(cmd nvme.Command, data []byte) {
		cmd.PSDT = 1
		if data != nil {
			cmd.DPTR = nvme.SGL{Length: uint32(len(data)), ID: nvme.SGLDataBlockOffset}
		}
		hl := nvmetcp.CapsuleCmdLen
		cc := nvmetcp.CapsuleCmd{}
		if hdgst {
			cc.Flags, hl = nvmetcp.FlagHDGST, hl+nvmetcp.DigestLen
		}
		if data != nil {
			cc.PDO = uint8(hl)
		}
		cc.PLen = uint32(hl + len(data))
		cmd.Encode(&cc.SQE)
		b := make([]byte, hl)
		cc.Encode(b)
		if hdgst {
			nvmetcp.PutDigest(b[nvmetcp.CapsuleCmdLen:], nvmetcp.Digest(b[:nvmetcp.CapsuleCmdLen]))
		}
		out = append(append(out, b...), data...)
	}
	k := nvme.Connect{SQSize: 7, Data: nvme.ConnectData{CNTLID: 0xffff, SubNQN: testNQN, HostNQN: "nqn.2026-11.io.blockwire:fuzz"}}
	var cmd nvme.Command
	data := make([]byte, nvme.ConnectDataLen)
	k.Encode(&cmd, data)
	capsule(cmd, data)
	var p nvme.Command
	(&nvme.Property{Set: true, Size: 4, Offset: nvme.PropCC, Value: nvme.CCEnable}).Encode(&p)
	p.CID = 1
	capsule(p, nil)
	return out
}

// FuzzConn feeds a connected admin queue whatever the fuzzer makes — PDUs
// of every type, capsules of every command, data that does or does not
// come — then hangs up: the target must not panic, and once the
// connection is gone nothing may be left: no connection, no controller,
// no budget held.
func FuzzConn(f *testing.F) {
	var c nvmetcp.CapsuleCmd
	c.PLen = nvmetcp.CapsuleCmdLen
	(&nvme.Command{Opcode: nvme.AdminIdentify, CID: 2, PSDT: 1, DPTR: nvme.SGL{Length: 4096, ID: nvme.SGLTransportDataBlock}, CDW: [6]uint32{1}}).Encode(&c.SQE)
	b := make([]byte, nvmetcp.CapsuleCmdLen)
	c.Encode(b)
	f.Add(false, b)
	f.Add(true, b)
	(&nvme.Command{Opcode: nvme.AdminSetFeatures, CID: 3, PSDT: 1, DPTR: nvme.SGL{Length: 4096, ID: nvme.SGLTransportDataBlock}, CDW: [6]uint32{0x81}}).Encode(&c.SQE)
	c.Encode(b)
	f.Add(false, b)
	var d [nvmetcp.DataLen]byte
	(&nvmetcp.Data{Type: nvmetcp.TypeH2CData, Flags: nvmetcp.FlagLastPDU, PDO: nvmetcp.DataLen, PLen: nvmetcp.DataLen + 16, CCCID: 3, Length: 16}).Encode(d[:])
	f.Add(false, append(append(b, d[:]...), make([]byte, 16)...))
	f.Fuzz(func(t *testing.T, hdgst bool, in []byte) {
		tg := nvmetarget.New(nvmetarget.Options{})
		sub, err := tg.AddSubsystem(nvmetarget.SubsystemConfig{NQN: testNQN})
		if err != nil {
			t.Fatal(err)
		}
		be, _ := mem.New(1 << 20)
		u, _ := blockcore.NewUnit(blockcore.UnitConfig{Backend: be})
		defer u.Close()
		sub.SetNamespace(1, u)
		budget := blockcore.NewIOBudget(64<<20, 64<<20)
		s := New(Options{Target: tg, Budget: budget, SetupTimeout: time.Second})
		host, target := net.Pipe()
		go io.Copy(io.Discard, host) // the target's answers
		s.accept(target)
		host.SetWriteDeadline(time.Now().Add(2 * time.Second))
		host.Write(connected(hdgst))
		host.Write(in)
		host.Close()
		s.Close() // waits for the connection to end
		if s.Conns() > 0 || tg.Controllers() > 0 || budget.Used() > 0 {
			t.Fatalf("left behind: %d connections, %d controllers, %d budget bytes", s.Conns(), tg.Controllers(), budget.Used())
		}
	})
}
