package tcptarget

import (
	"net"
	"sync/atomic"
	"testing"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/nvme"
	"github.com/blockwire/blockwire/nvme/nvmetarget"
	"github.com/blockwire/blockwire/nvme/tcphost"
)

// flushCounter is a memory disk that counts its flushes.
type flushCounter struct {
	*mem.Disk
	flushes atomic.Int64
}

func (f *flushCounter) Flush() error { f.flushes.Add(1); return nil }

// TestWritesDurableWhenAsked: a write is made durable (the backend
// flushed) when it carries FUA, when the host turned the volatile write
// cache off, and on Flush — and not otherwise.
func TestWritesDurableWhenAsked(t *testing.T) {
	d, _ := mem.New(1 << 20)
	be := &flushCounter{Disk: d}
	u, err := blockcore.NewUnit(blockcore.UnitConfig{Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	tg := nvmetarget.New(nvmetarget.Options{})
	sub, _ := tg.AddSubsystem(nvmetarget.SubsystemConfig{NQN: testNQN})
	sub.SetNamespace(1, u)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(Options{Target: tg})
	go s.Serve(l)
	defer s.Close()
	c, err := tcphost.Connect(ctx(t), l.Addr().String(), testNQN, tcphost.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := make([]byte, 4096)
	step := func(what string, do func() error, want int64) {
		t.Helper()
		before := be.flushes.Load()
		if err := do(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := be.flushes.Load() - before; got != want {
			t.Fatalf("%s: %d flushes, want %d", what, got, want)
		}
	}
	step("a write", func() error { return c.Write(ctx(t), 1, 512, 0, p, false) }, 0)
	step("a FUA write", func() error { return c.Write(ctx(t), 1, 512, 0, p, true) }, 1)
	step("Flush", func() error { return c.Flush(ctx(t), 1) }, 1)
	step("the write cache turned off", func() error {
		_, err := c.Admin(ctx(t), &nvme.Command{Opcode: nvme.AdminSetFeatures, CDW: [6]uint32{0x06, 0}}, nil, tcphost.NoData)
		return err
	}, 1)
	step("a write with the cache off", func() error { return c.Write(ctx(t), 1, 512, 0, p, false) }, 1)
	step("fused compare and write with the cache off", func() error { return c.CompareAndWrite(ctx(t), 1, 512, 0, p, p, false) }, 1)
}
