package nvme

import (
	"bytes"
	"strings"
	"testing"
)

// TestConnectByteLiterals: a Connect for the admin queue of the dynamic
// controller model, 32 entries, a 15 s keep alive timeout, against the
// layouts of NVMe over Fabrics 1.1 (“Connect Command”, “Connect Command
// Data”) written out by hand.
func TestConnectByteLiterals(t *testing.T) {
	k := Connect{QID: 0, SQSize: 31, KATO: 15000, Data: ConnectData{
		HostID: [16]byte{0xaa, 0xbb, 15: 0xcc}, CNTLID: 0xffff,
		SubNQN: "nqn.2014-08.org.nvmexpress.discovery", HostNQN: "nqn.2014-08.org.nvmexpress:uuid:1"}}
	c := Command{CID: 0x0a, PSDT: 1, DPTR: SGL{Length: ConnectDataLen, ID: SGLDataBlockOffset}}
	data := make([]byte, ConnectDataLen)
	k.Encode(&c, data)
	var sqe [SQELen]byte
	c.Encode(&sqe)
	want := unhex(t, "7f400a00 01000000 00000000 00000000 00000000 00000000 00000000 00000000 00040000 00000001 00000000 1f000000 983a0000 00000000 00000000 00000000")
	if !bytes.Equal(sqe[:], want) {
		t.Errorf("Connect SQE:\n got %x\nwant %x", sqe, want)
	}
	if !bytes.Equal(data[:18], unhex(t, "aabb0000 00000000 00000000 000000cc ffff")) ||
		string(data[256:256+36]) != "nqn.2014-08.org.nvmexpress.discovery" || data[256+36] != 0 ||
		!strings.HasPrefix(string(data[512:]), "nqn.2014-08.org.nvmexpress:uuid:1\x00") {
		t.Errorf("Connect data: %x … %q … %q", data[:18], data[256:300], data[512:560])
	}
	var back Command
	back.Decode(&sqe)
	got, err := DecodeConnect(&back, data)
	if err != nil || got != k {
		t.Errorf("Connect decodes as %+v, %v", got, err)
	}
	// Refusals: an NQN without its NUL, data cut short.
	bad := bytes.Clone(data)
	for i := 512; i < 768; i++ {
		bad[i] = 'x'
	}
	if _, err := DecodeConnect(&back, bad); err == nil {
		t.Error("a HOSTNQN without NUL decoded")
	}
	if _, err := DecodeConnect(&back, data[:512]); err == nil {
		t.Error("Connect data of 512 bytes decoded")
	}
	// An empty HOSTNQN is a host without a name (SPDK's perf sends one);
	// an empty SUBNQN names no subsystem.
	noName := bytes.Clone(data)
	clear(noName[512:768])
	if got, err := DecodeConnect(&back, noName); err != nil || got.Data.HostNQN != "" {
		t.Errorf("Connect with an empty HOSTNQN: %+v, %v", got.Data, err)
	}
	noSub := bytes.Clone(data)
	clear(noSub[256:512])
	if _, err := DecodeConnect(&back, noSub); err == nil {
		t.Error("Connect with an empty SUBNQN decoded")
	}
}

// TestPropertyByteLiterals: Property Set of CC (enable) and Property Get
// of CAP (8 bytes).
func TestPropertyByteLiterals(t *testing.T) {
	for _, c := range []struct {
		p    Property
		want string
	}{
		{Property{Set: true, Size: 4, Offset: PropCC, Value: CCEnable | 6<<16 | 4<<20},
			"7f000100 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 14000000 01004600 00000000 00000000 00000000"},
		{Property{Size: 8, Offset: PropCAP},
			"7f000100 04000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 01000000 00000000 00000000 00000000 00000000 00000000"},
	} {
		cmd := Command{CID: 1}
		c.p.Encode(&cmd)
		var b [SQELen]byte
		cmd.Encode(&b)
		if want := unhex(t, c.want); !bytes.Equal(b[:], want) {
			t.Errorf("%+v:\n got %x\nwant %x", c.p, b, want)
		}
		got, err := DecodeProperty(&cmd)
		if err != nil || got != c.p {
			t.Errorf("%+v decodes as %+v, %v", c.p, got, err)
		}
	}
	cmd := Command{Opcode: AdminFabrics, NSID: FabricsPropertyGet, CDW: [6]uint32{2}}
	if _, err := DecodeProperty(&cmd); err == nil {
		t.Error("property size code 2 decoded")
	}
	if cap := CAP(127, 30); cap&0xffff != 127 || cap>>24&0xff != 30 || cap>>37&1 != 1 || cap>>16&1 != 1 {
		t.Errorf("CAP %#x", cap)
	}
	if Version(1, 4) != 0x00010400 {
		t.Errorf("VS %#x", Version(1, 4))
	}
}
