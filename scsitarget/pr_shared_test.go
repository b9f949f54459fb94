package scsitarget

import (
	"sync"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/scsi"
)

// record is shared storage's state record as backend/rbd keeps it in a
// RADOS object: a version that every store must name, and watchers told
// before the store returns. Several sharedMem values point at one record,
// as several gateways open one image.
type record struct {
	mu       sync.Mutex
	b        []byte
	version  uint64
	watchers []func(uint64)
	stores   int
}

type sharedMem struct {
	*mem.Disk
	rec *record
}

func (s sharedMem) LoadState() ([]byte, uint64, error) {
	s.rec.mu.Lock()
	defer s.rec.mu.Unlock()
	return append([]byte(nil), s.rec.b...), s.rec.version, nil
}

func (s sharedMem) StoreState(b []byte, ver uint64) (uint64, error) {
	s.rec.mu.Lock()
	if ver != s.rec.version {
		s.rec.mu.Unlock()
		return 0, backend.ErrStale
	}
	s.rec.b = append([]byte(nil), b...)
	s.rec.version++
	s.rec.stores++
	v, ws := s.rec.version, s.rec.watchers
	s.rec.mu.Unlock()
	for _, w := range ws {
		w(v)
	}
	return v, nil
}

func (s sharedMem) WatchState(f func(uint64)) error {
	s.rec.mu.Lock()
	defer s.rec.mu.Unlock()
	s.rec.watchers = append(s.rec.watchers, f)
	return nil
}

// gateways builds n devices with one LU each on one shared record: the
// same LU served by n gateways.
func gateways(t *testing.T, n int) ([]*Device, *record) {
	t.Helper()
	rec := &record{version: 1}
	disk, _ := mem.New(16 << 20)
	var ds []*Device
	for range n {
		d := NewDevice("iqn.2026-11.org.blockwire:shared", nil)
		lu, err := NewLU(d.Name(), LUConfig{Backend: sharedMem{disk, rec}})
		if err != nil {
			t.Fatal(err)
		}
		d.AddLU(lu)
		ds = append(ds, d)
	}
	return ds, rec
}

func nexus(d *Device, ip, tp string) *Nexus {
	n := &Nexus{InitiatorPort: ip, TargetPort: tp}
	d.AddNexus(n)
	run(d, n, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil) // power-on UA
	return n
}

// A reservation taken through gateway A is enforced by gateway B, B
// reports it, and its release through B frees A's other initiator.
func TestSharedReservationAcrossGateways(t *testing.T) {
	gw, rec := gateways(t, 2)
	a := nexus(gw[0], "iqn.a,i,0x1", "iqn.t,t,0x1")
	b := nexus(gw[1], "iqn.b,i,0x1", "iqn.t,t,0x2")
	write := []byte{scsi.OpWrite10, 0, 0, 0, 0, 0, 0, 0, 1, 0}

	cdb, p := prOut(0, 0, 0, 0xaaa, 0) // REGISTER through A
	good(t, run(gw[0], a, cdb, p))
	cdb, p = prOut(0, 0, 0, 0xbbb, 0) // REGISTER through B
	good(t, run(gw[1], b, cdb, p))
	if keys := readKeys(t, gw[0], a); len(keys) != 2 {
		t.Fatalf("A sees keys %x, want both registrations", keys)
	}
	cdb, p = prOut(1, prWE, 0xaaa, 0, 0) // RESERVE Write Exclusive through A
	good(t, run(gw[0], a, cdb, p))
	if c := run(gw[1], b, write, make([]byte, 512)); c.Status != scsi.StatusReservationConflict {
		t.Fatalf("write through B under A's reservation: status %#x", c.Status)
	}
	good(t, run(gw[0], a, write, make([]byte, 512)))
	// B sees the reservation with PR IN READ RESERVATION.
	buf := make([]byte, 64)
	good(t, run(gw[1], b, []byte{scsi.OpPersistentReserveIn, 1, 0, 0, 0, 0, 0, 0, 64, 0}, buf))
	if buf[7] != 16 || buf[21]&0x0f != prWE {
		t.Fatalf("READ RESERVATION through B: % x", buf[:24])
	}
	// B preempts A's reservation and takes it; now A's writes conflict.
	cdb, p = prOut(4, prWE, 0xbbb, 0xaaa, 0) // PREEMPT
	good(t, run(gw[1], b, cdb, p))
	if c := run(gw[0], a, write, make([]byte, 512)); c.Status != scsi.StatusReservationConflict {
		t.Fatalf("write through A after B preempted: status %#x", c.Status)
	}
	if keys := readKeys(t, gw[0], a); len(keys) != 1 || keys[0] != 0xbbb {
		t.Fatalf("keys through A after the preempt: %x", keys)
	}
	if rec.stores != 4 {
		t.Fatalf("%d stores of the shared record, want 4 (one per change)", rec.stores)
	}
}

// Registrations made at once through several gateways all land: a store
// that loses the race runs again on the newest record.
func TestSharedReservationRace(t *testing.T) {
	gw, _ := gateways(t, 4)
	var ns []*Nexus
	for i, d := range gw {
		ns = append(ns, nexus(d, "iqn.i"+string(rune('a'+i))+",i,0x1", "iqn.t,t,0x"+string(rune('1'+i))))
	}
	var wg sync.WaitGroup
	for i, d := range gw {
		wg.Go(func() {
			for k := range 25 {
				key := uint64(i*100 + k + 1)
				var cdb, p []byte
				if k == 0 {
					cdb, p = prOut(0, 0, 0, key, 0)
				} else {
					cdb, p = prOut(0, 0, key-1, key, 0)
				}
				if c := run(d, ns[i], cdb, p); c.Status != scsi.StatusGood {
					t.Errorf("gateway %d register %d: status %#x", i, k, c.Status)
					return
				}
			}
		})
	}
	wg.Wait()
	keys := readKeys(t, gw[0], ns[0])
	want := map[uint64]bool{25: true, 125: true, 225: true, 325: true}
	if len(keys) != 4 {
		t.Fatalf("keys %v, want the last key of each gateway's initiator", keys)
	}
	for _, k := range keys {
		if !want[k] {
			t.Fatalf("keys %v, want %v", keys, want)
		}
	}
}

// A logical unit reset through one gateway is a unit attention on the
// others' nexuses too (libiscsi's MultipathIO.Reset).
func TestSharedLUResetAcrossGateways(t *testing.T) {
	gw, _ := gateways(t, 2)
	a := nexus(gw[0], "iqn.a,i,0x1", "iqn.t,t,0x1")
	b := nexus(gw[1], "iqn.a,i,0x1", "iqn.t,t,0x2")
	tur := []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}
	good(t, run(gw[1], b, tur, nil))
	if r := gw[0].ResetLU(a, 0); r != TMFComplete {
		t.Fatalf("reset: %v", r)
	}
	for i, x := range []struct {
		d *Device
		n *Nexus
	}{{gw[0], a}, {gw[1], b}} {
		if s := sense(t, run(x.d, x.n, tur, nil)); s.Key != scsi.SenseUnitAttention || s.ASC != 0x29 || s.ASCQ != 0x03 {
			t.Fatalf("gateway %d after the reset: sense %x/%02x/%02x", i, s.Key, s.ASC, s.ASCQ)
		}
		good(t, run(x.d, x.n, tur, nil))
	}
}

// slowShared is a gateway's view of the shared image whose writes wait,
// once started, until release is closed: a write in flight in the
// storage.
type slowShared struct {
	sharedMem
	started chan struct{}
	release chan struct{}
}

func (s slowShared) WriteAt(p []byte, off int64) (int, error) {
	s.started <- struct{}{}
	<-s.release
	return s.sharedMem.WriteAt(p, off)
}

// PREEMPT AND ABORT through gateway A ends the preempted nexus's tasks on
// every gateway before it completes (SPC-4 §5.13.11.2.5): a write of the
// victim that gateway B had already checked and handed to the storage
// must have landed before the preemption is answered — B acknowledges
// A's change only once its writes checked against the old state are done
// — so no write of the preempted initiator lands after it.
func TestPreemptAndAbortWaitsForTheOtherGatewaysWrites(t *testing.T) {
	rec := &record{version: 1}
	disk, _ := mem.New(16 << 20)
	slow := slowShared{sharedMem{disk, rec}, make(chan struct{}, 1), make(chan struct{})}
	var gw []*Device
	for _, be := range []backend.Backend{sharedMem{disk, rec}, slow} {
		d := NewDevice("iqn.2026-11.org.blockwire:shared", nil)
		lu, err := NewLU(d.Name(), LUConfig{Backend: be})
		if err != nil {
			t.Fatal(err)
		}
		d.AddLU(lu)
		gw = append(gw, d)
	}
	a := nexus(gw[0], "iqn.a,i,0x1", "iqn.t,t,0x1")
	v := nexus(gw[1], "iqn.v,i,0x1", "iqn.t,t,0x2")
	cdb, p := prOut(0, 0, 0, 0xaaa, 0) // REGISTER through A
	good(t, run(gw[0], a, cdb, p))
	cdb, p = prOut(0, 0, 0, 0xbbb, 0) // REGISTER through B
	good(t, run(gw[1], v, cdb, p))
	cdb, p = prOut(1, prWERO, 0xaaa, 0, 0) // RESERVE Write Exclusive – Registrants Only
	good(t, run(gw[0], a, cdb, p))

	written := make(chan *Command, 1)
	go func() {
		written <- run(gw[1], v, []byte{scsi.OpWrite10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, make([]byte, 512))
	}()
	<-slow.started // checked, registered: in the storage
	preempted := make(chan *Command, 1)
	go func() {
		cdb, p := prOut(5, prWERO, 0xaaa, 0xbbb, 0) // PREEMPT AND ABORT of the victim's key
		preempted <- run(gw[0], a, cdb, p)
	}()
	select {
	case c := <-preempted:
		close(slow.release)
		t.Fatalf("PREEMPT AND ABORT answered (status %#x) while the victim's write was still in flight on the other gateway", c.Status)
	case <-time.After(300 * time.Millisecond):
	}
	close(slow.release)
	good(t, <-preempted)
	<-written
	// The victim's next write is refused through B.
	if c := run(gw[1], v, []byte{scsi.OpWrite10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, make([]byte, 512)); c.Status != scsi.StatusReservationConflict {
		t.Fatalf("the victim's write after the preemption: status %#x", c.Status)
	}
}
