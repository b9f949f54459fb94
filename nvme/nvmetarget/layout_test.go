package nvmetarget

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/nvme"
)

// These tests read the data structures at the byte offsets the
// specifications give (NVMe over Fabrics 1.1 "Discovery Log Page",
// NVMe Base 2.0 "Identify Controller/Namespace Data Structure"), not
// through this package's own writers: a field put at the wrong offset
// fails here even when a host of ours reads it back the same wrong way.

func TestDiscoveryLogLayout(t *testing.T) {
	tg := New(Options{Portals: func() []Portal {
		return []Portal{{ID: 7, Addr: netip.MustParseAddrPort("192.0.2.1:4420")}}
	}})
	if _, err := tg.AddSubsystem(SubsystemConfig{NQN: "nqn.2026-11.io.blockwire:x"}); err != nil {
		t.Fatal(err)
	}
	page := tg.discoveryLog()
	if n := binary.LittleEndian.Uint64(page[8:]); n != 2 || len(page) != 3*1024 {
		t.Fatalf("NUMREC %d, %d bytes; want 2 records after the 1024-byte header", n, len(page))
	}
	e := page[1024:2048]
	field := func(b []byte) string { return string(bytes.TrimRight(b, " \x00")) }
	checks := []struct {
		name      string
		got, want any
	}{
		{"TRTYPE (byte 0)", e[0], byte(3)},
		{"ADRFAM (byte 1)", e[1], byte(1)},
		{"SUBTYPE (byte 2)", e[2], byte(2)},
		{"PORTID (bytes 4-5)", binary.LittleEndian.Uint16(e[4:]), uint16(7)},
		{"CNTLID (bytes 6-7)", binary.LittleEndian.Uint16(e[6:]), uint16(0xffff)},
		{"TRSVCID (bytes 32-63)", field(e[32:64]), "4420"},
		{"SUBNQN (bytes 256-511)", field(e[256:512]), "nqn.2026-11.io.blockwire:x"},
		{"TRADDR (bytes 512-767)", field(e[512:768]), "192.0.2.1"},
		{"second entry SUBTYPE", page[2048+2], byte(3)},
		{"second entry SUBNQN", field(page[2048+256 : 2048+512]), DiscoveryNQN},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestIdentifyLayout(t *testing.T) {
	tg := New(Options{})
	s, err := tg.AddSubsystem(SubsystemConfig{NQN: "nqn.2026-11.io.blockwire:x", Serial: "SN1"})
	if err != nil {
		t.Fatal(err)
	}
	be, _ := mem.New(1 << 20)
	u, err := blockcore.NewUnit(blockcore.UnitConfig{Backend: be, BlockSize: 4096, Identity: "u"})
	if err != nil {
		t.Fatal(err)
	}
	s.SetNamespace(3, u)
	c := &Controller{s: s, id: 9, queues: map[uint16]*Queue{}}
	b := make([]byte, 4096)
	if r := c.identify(&nvme.Command{CDW: [6]uint32{identifyCtrl}}, b); r.CQE.Status != 0 {
		t.Fatal(r.CQE.Status)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"SN (bytes 4-23)", string(b[4:24]), "SN1" + string(bytes.Repeat([]byte{' '}, 17))},
		{"CNTLID (bytes 78-79)", binary.LittleEndian.Uint16(b[78:]), uint16(9)},
		{"VER (bytes 80-83)", binary.LittleEndian.Uint32(b[80:]), uint32(0x10300)},
		{"CNTRLTYPE (byte 111)", b[111], byte(1)},
		{"SQES (byte 512)", b[512], byte(0x66)},
		{"CQES (byte 513)", b[513], byte(0x44)},
		{"NN (bytes 516-519)", binary.LittleEndian.Uint32(b[516:]), uint32(0xfffffffe)},
		{"SUBNQN (bytes 768-1023)", string(bytes.TrimRight(b[768:1024], "\x00")), "nqn.2026-11.io.blockwire:x"},
		{"IOCCSZ (bytes 1792-1795)", binary.LittleEndian.Uint32(b[1792:]), uint32((64 + DefaultInCapsuleData) / 16)},
		{"IORCSZ (bytes 1796-1799)", binary.LittleEndian.Uint32(b[1796:]), uint32(1)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("Identify Controller %s: %v, want %v", c.name, c.got, c.want)
		}
	}
	if r := c.identify(&nvme.Command{NSID: 3, CDW: [6]uint32{identifyNS}}, b); r.CQE.Status != 0 {
		t.Fatal(r.CQE.Status)
	}
	id := u.ID()
	if nsze := binary.LittleEndian.Uint64(b[0:]); nsze != 256 {
		t.Errorf("NSZE (bytes 0-7) %d, want 256 blocks of 4 KiB", nsze)
	}
	if lbads := b[128+2]; lbads != 12 {
		t.Errorf("LBAF0 LBADS (byte 130) %d, want 12", lbads)
	}
	if !bytes.Equal(b[104:120], id[:]) {
		t.Errorf("NGUID (bytes 104-119) %x, want %x", b[104:120], id)
	}
	if r := c.identify(&nvme.Command{CDW: [6]uint32{identifyActiveNS}}, b); r.CQE.Status != 0 || binary.LittleEndian.Uint32(b) != 3 || binary.LittleEndian.Uint32(b[4:]) != 0 {
		t.Errorf("active namespace list %x, %v", b[:8], r.CQE.Status)
	}
}

// TestControllerStates: the properties a host enables and shuts a
// controller down with, and what a controller refuses before CC.EN.
func TestControllerStates(t *testing.T) {
	tg := New(Options{})
	s, _ := tg.AddSubsystem(SubsystemConfig{NQN: "nqn.2026-11.io.blockwire:x"})
	c := &Controller{s: s, queues: map[uint16]*Queue{}}
	q := &Queue{c: c}
	prop := func(p nvme.Property) Result {
		var cmd nvme.Command
		p.Encode(&cmd)
		return q.Exec(&cmd, nil, nil)
	}
	r := prop(nvme.Property{Size: 8, Offset: nvme.PropCAP})
	if cap := uint64(r.CQE.DW0) | uint64(r.CQE.DW1)<<32; cap&0xffff != DefaultQueueSize-1 || cap>>37&1 != 1 {
		t.Errorf("CAP %#x: MQES %d, CSS NVM %d", cap, cap&0xffff, cap>>37&1)
	}
	if r := q.Exec(&nvme.Command{Opcode: nvme.AdminIdentify, CDW: [6]uint32{1}}, make([]byte, 4096), nil); r.CQE.Status != nvme.StatusCommandSequence {
		t.Errorf("Identify before CC.EN: %v, want a command sequence error", r.CQE.Status)
	}
	prop(nvme.Property{Set: true, Size: 4, Offset: nvme.PropCC, Value: nvme.CCEnable})
	if r := prop(nvme.Property{Size: 4, Offset: nvme.PropCSTS}); r.CQE.DW0&nvme.CSTSReady == 0 {
		t.Errorf("CSTS %#x after CC.EN: not ready", r.CQE.DW0)
	}
	prop(nvme.Property{Set: true, Size: 4, Offset: nvme.PropCC, Value: nvme.CCEnable | 1<<14})
	if r := prop(nvme.Property{Size: 4, Offset: nvme.PropCSTS}); r.CQE.DW0>>2&3 != 2 {
		t.Errorf("CSTS %#x after a shutdown notification: SHST %d, want 2 (complete)", r.CQE.DW0, r.CQE.DW0>>2&3)
	}
}
