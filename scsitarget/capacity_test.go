package scsitarget

import (
	"testing"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/scsi"
)

// growing is storage resized from outside (another client of an RBD
// image): it calls the LU back after the change.
type growing struct {
	*mem.Disk
	size    int64
	changed func()
}

func (g *growing) Size() int64            { return g.size }
func (g *growing) WatchCapacity(f func()) { g.changed = f }
func (g *growing) grow(n int64)           { g.size = n; g.changed() }

// A size change made elsewhere becomes the LU's capacity, with CAPACITY
// DATA HAS CHANGED for every nexus.
func TestCapacityChangedElsewhere(t *testing.T) {
	disk, _ := mem.New(8 << 20)
	g := &growing{Disk: disk, size: 4 << 20}
	d := NewDevice("iqn.2026-11.org.blockwire:grow", nil)
	lu, err := NewLU(d.Name(), LUConfig{Backend: g})
	if err != nil {
		t.Fatal(err)
	}
	d.AddLU(lu)
	n := nexus(d, "iqn.i,i,0x1", "iqn.t,t,0x1")
	if lu.Blocks() != 8192 {
		t.Fatalf("blocks %d", lu.Blocks())
	}
	g.grow(8 << 20)
	if lu.Blocks() != 16384 {
		t.Fatalf("blocks after the change %d", lu.Blocks())
	}
	s := sense(t, run(d, n, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil))
	if s.Key != scsi.SenseUnitAttention || s.ASC != 0x2a || s.ASCQ != 0x09 {
		t.Fatalf("after the change: sense %x/%02x/%02x", s.Key, s.ASC, s.ASCQ)
	}
	good(t, run(d, n, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil))
	g.grow(8 << 20) // no change: no new unit attention
	good(t, run(d, n, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil))
}
