package scsitarget

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/scsi"
)

// FuzzPRFile: an APTPL file (the persistent reservations a file LU keeps
// across restarts) with any contents either fails the LU's creation with
// an error or gives a state every command handles: persistent reserve in
// and out, reads and writes from the holder and from another initiator,
// each with a clean status, and a reservation reported only with a type
// SPC-4 defines.
func FuzzPRFile(f *testing.F) {
	f.Add([]byte(`{"generation":2,"registrations":[{"initiator":"iqn.a,i,0x1","target":"t,0x1","key":2748}],"type":1,"holder":{"initiator":"iqn.a,i,0x1","target":"t,0x1"}}`))
	f.Add([]byte(`{"generation":1,"registrations":[{"initiator":"iqn.a,i,0x1","key":1},{"initiator":"iqn.b,i,0x1","key":2}],"type":7,"holder":{"initiator":"iqn.a,i,0x1"}}`))
	f.Add([]byte(`{"generation":4294967295,"registrations":[],"type":9,"holder":{"initiator":"iqn.z,i,0x1","target":"t,0x1"}}`))
	f.Add([]byte(`{"registrations":[{"initiator":"iqn.a,i,0x1","key":0},{"initiator":"iqn.a,i,0x1","key":5}],"type":3,"holder":{"initiator":""}}`))
	f.Add([]byte(`{"registrations":null,"alua":[{"group":1,"state":200}]}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, data []byte) {
		file := filepath.Join(t.TempDir(), "lun.pr")
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
		d := NewDevice("iqn.2026-11.org.blockwire:test", nil)
		be, _ := mem.New(1 << 20)
		lu, err := NewLU(d.Name(), LUConfig{Backend: be, PRFile: file})
		if err != nil {
			return
		}
		d.AddLU(lu)
		a := &Nexus{InitiatorPort: "iqn.a,i,0x1", TargetPort: "t,0x1"}
		b := &Nexus{InitiatorPort: "iqn.b,i,0x1", TargetPort: "t,0x1"}
		read := []byte{scsi.OpRead10, 0, 0, 0, 0, 0, 0, 0, 1, 0}
		write := []byte{scsi.OpWrite10, 0, 0, 0, 0, 0, 0, 0, 1, 0}
		for _, n := range []*Nexus{a, b} {
			d.AddNexus(n)
			run(d, n, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil) // power-on UA
			for sa := byte(0); sa < 4; sa++ {
				cdb := []byte{scsi.OpPersistentReserveIn, sa, 0, 0, 0, 0, 0, 0x10, 0, 0}
				buf := make([]byte, 4096)
				c := run(d, n, cdb, buf)
				checkOutcome(t, c, cdb)
				if sa == 1 && c.Status == scsi.StatusGood && binary.BigEndian.Uint32(buf[4:]) >= 16 {
					switch typ := buf[21] & 0x0f; typ {
					case prWE, prEA, prWERO, prEARO, prWEAR, prEAAR:
					default:
						t.Fatalf("READ RESERVATION reports type %d", typ)
					}
				}
			}
			checkOutcome(t, run(d, n, read, make([]byte, 512)), read)
			checkOutcome(t, run(d, n, write, make([]byte, 512)), write)
		}
		// b registers (ignoring any key), preempts whatever a holds, a
		// releases, b clears: each a clean status.
		for _, step := range []struct {
			n             *Nexus
			sa, typ       byte
			resKey, saKey uint64
		}{
			{b, 6, 0, 0, 0xb},
			{b, 4, prEA, 0xb, 2748},
			{a, 2, prWE, 2748, 0},
			{b, 3, 0, 0xb, 0},
		} {
			cdb, p := prOut(step.sa, step.typ, step.resKey, step.saKey, 0)
			checkOutcome(t, run(d, step.n, cdb, p), cdb)
		}
	})
}

// TestDamagedPRFileRefused: an APTPL file holding a reservation of a type
// SPC-4 does not define fails the LU's creation with an error naming the
// file, instead of serving a reservation no command can reason about.
func TestDamagedPRFileRefused(t *testing.T) {
	file := filepath.Join(t.TempDir(), "lun.pr")
	os.WriteFile(file, []byte(`{"generation":1,"registrations":[{"initiator":"iqn.a,i,0x1","key":1}],"type":9,"holder":{"initiator":"iqn.a,i,0x1"}}`), 0o600)
	be, _ := mem.New(1 << 20)
	_, err := NewLU("iqn.2026-11.org.blockwire:test", LUConfig{Backend: be, PRFile: file})
	if err == nil || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "type 9") {
		t.Fatalf("a PR file with reservation type 9: %v", err)
	}
}

// TestDamagedSharedRecordKeepsLastCopy: a shared reservation record that
// another writer damaged is not taken: the gateway goes on with the last
// good copy (and logs why).
func TestDamagedSharedRecordKeepsLastCopy(t *testing.T) {
	ds, rec := gateways(t, 2)
	a := nexus(ds[0], "iqn.a,i,0x1", "t,0x1")
	b := nexus(ds[1], "iqn.b,i,0x1", "t,0x2")
	run(ds[0], a, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil)
	run(ds[1], b, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil)
	cdb, p := prOut(0, 0, 0, 0xa, 0)
	good(t, run(ds[0], a, cdb, p))
	cdb, p = prOut(1, prWE, 0xa, 0, 0)
	good(t, run(ds[0], a, cdb, p))
	readRes := func() []byte {
		buf := make([]byte, 64)
		good(t, run(ds[1], b, []byte{scsi.OpPersistentReserveIn, 1, 0, 0, 0, 0, 0, 0, 64, 0}, buf))
		return buf
	}
	if buf := readRes(); buf[21]&0x0f != prWE {
		t.Fatalf("READ RESERVATION through the other gateway: % x", buf[:24])
	}
	// Another writer stores a damaged record.
	rec.mu.Lock()
	rec.b = []byte(`{"generation":9,"registrations":[{"initiator":"iqn.a,i,0x1","key":10}],"type":9,"holder":{"initiator":"iqn.a,i,0x1"}}`)
	rec.version++
	v, ws := rec.version, rec.watchers
	rec.mu.Unlock()
	for _, w := range ws {
		w(v)
	}
	if buf := readRes(); binary.BigEndian.Uint32(buf[4:]) < 16 || buf[21]&0x0f != prWE {
		t.Fatalf("READ RESERVATION after a damaged record: % x (want the last good copy: Write Exclusive)", buf[:24])
	}
	// The holder's writes still go through, another's still conflict.
	good(t, run(ds[0], a, []byte{scsi.OpWrite10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, make([]byte, 512)))
	if c := run(ds[1], b, []byte{scsi.OpWrite10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, make([]byte, 512)); c.Status != scsi.StatusReservationConflict {
		t.Fatalf("a write by a non-holder after a damaged record: status %#x", c.Status)
	}
}

// brokenShared is shared storage whose record cannot be read after the
// first load (a damaged record, or the cluster out of reach).
type brokenShared struct {
	sharedMem
	broken *atomic.Bool
	tries  *atomic.Int64 // loads while broken
}

func (s brokenShared) LoadState() ([]byte, uint64, error) {
	if s.broken.Load() {
		s.tries.Add(1)
		return nil, 0, errors.New("the record is out of reach")
	}
	return s.sharedMem.LoadState()
}

// countingHandler counts the records logged at Warn or above.
type countingHandler struct{ n *atomic.Int64 }

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.n.Add(1)
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// TestUnreadableSharedRecordDoesNotFloodTheLog: while the shared record
// cannot be reloaded, every command goes on with the last copy — and the
// log says so for the first 16 commands, then one in 1024 with the count,
// not once per command (100 000 lines a second at this LU's rate).
func TestUnreadableSharedRecordDoesNotFloodTheLog(t *testing.T) {
	var warns, tries atomic.Int64
	var broken atomic.Bool
	disk, _ := mem.New(16 << 20)
	rec := &record{version: 1}
	log := slog.New(countingHandler{&warns})
	d := NewDevice("iqn.2026-11.org.blockwire:shared", log)
	lu, err := NewLU(d.Name(), LUConfig{Backend: brokenShared{sharedMem{disk, rec}, &broken, &tries}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	d.AddLU(lu)
	n := nexus(d, "iqn.a,i,0x1", "t,0x1")
	run(d, n, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil)
	broken.Store(true)
	// Another gateway changed the record: this one must reload it.
	lu.pr.stale.Store(true)
	start := time.Now()
	for range 3000 {
		good(t, run(d, n, []byte{scsi.OpRead10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, make([]byte, 512)))
	}
	took := time.Since(start)
	// The storage is not asked at every command (it was twice per
	// command: 6000 tries, each under the reservation lock, which on a
	// cluster out of reach is a timeout each): after a failure the next
	// try waits reloadBackoffMin, doubling to reloadBackoffMax.
	if n, most := tries.Load(), 2+int64(took/reloadBackoffMin); n < 1 || n > most {
		t.Fatalf("%d tries to reload an unreadable shared record in %v (3000 commands); want 1 to %d", n, took, most)
	}
	t.Logf("%d tries in %v", tries.Load(), took)
	if w := warns.Load(); w < 1 || w > 16+6000/1024 {
		t.Fatalf("%d warnings for 3000 commands on an unreadable shared record; want 1 to %d", w, 16+6000/1024)
	}
	// Readable again: once the wait has passed, one line says so, and a
	// new failure is logged.
	broken.Store(false)
	time.Sleep(reloadBackoffMax)
	run(d, n, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil)
	broken.Store(true)
	lu.pr.stale.Store(true)
	before := warns.Load()
	run(d, n, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil)
	if warns.Load() == before {
		t.Fatal("a new failure after a reload was not logged")
	}
}
