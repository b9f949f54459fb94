package scsitarget

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/scsi"
)

func prOut(sa, typ byte, resKey, saKey uint64, flags byte) ([]byte, []byte) {
	cdb := []byte{scsi.OpPersistentReserveOut, sa, typ, 0, 0, 0, 0, 0, 24, 0}
	p := make([]byte, 24)
	binary.BigEndian.PutUint64(p[0:], resKey)
	binary.BigEndian.PutUint64(p[8:], saKey)
	p[20] = flags
	return cdb, p
}

func readKeys(t *testing.T, d *Device, n *Nexus) []uint64 {
	t.Helper()
	buf := make([]byte, 256)
	c := run(d, n, []byte{scsi.OpPersistentReserveIn, 0, 0, 0, 0, 0, 0, 1, 0, 0}, buf)
	good(t, c)
	l := int(binary.BigEndian.Uint32(buf[4:]))
	var keys []uint64
	for i := 0; i < l; i += 8 {
		keys = append(keys, binary.BigEndian.Uint64(buf[8+i:]))
	}
	return keys
}

func luWithPRFile(t *testing.T, file string) *Device {
	t.Helper()
	d := NewDevice("iqn.2026-11.org.blockwire:test", nil)
	be, _ := mem.New(16 << 20)
	lu, err := NewLU(d.Name(), LUConfig{Backend: be, PRFile: file})
	if err != nil {
		t.Fatal(err)
	}
	d.AddLU(lu)
	return d
}

// TestAPTPLSurvivesRestart: a registration and reservation made with
// APTPL=1 are there again when the LU is built anew from its PR file
// (SPC-4 §5.13.4); APTPL=0 in a later registration removes the file.
func TestAPTPLSurvivesRestart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "lun0.img.pr")
	d := luWithPRFile(t, file)
	a := &Nexus{InitiatorPort: "iqn.a,i,0x1", TargetPort: "t,0x1"}
	d.AddNexus(a)
	run(d, a, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil) // power-on UA
	cdb, p := prOut(0, 0, 0, 0xabc, 0x01)
	good(t, run(d, a, cdb, p))
	cdb, p = prOut(1, prWE, 0xabc, 0, 0)
	good(t, run(d, a, cdb, p))
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("APTPL state not written: %v", err)
	}

	// "Restart": a new device and LU from the same file.
	d2 := luWithPRFile(t, file)
	b := &Nexus{InitiatorPort: "iqn.b,i,0x1", TargetPort: "t,0x1"}
	d2.AddNexus(b)
	run(d2, b, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil)
	if keys := readKeys(t, d2, b); len(keys) != 1 || keys[0] != 0xabc {
		t.Fatalf("keys after restart: %x", keys)
	}
	// b is not the holder of the Write Exclusive reservation: writes conflict.
	c := run(d2, b, []byte{scsi.OpWrite10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, make([]byte, 512))
	if c.Status != scsi.StatusReservationConflict {
		t.Fatalf("write by a non-holder after restart: status %#x", c.Status)
	}
	// The holder returns (same initiator port): it may write.
	a2 := &Nexus{InitiatorPort: "iqn.a,i,0x1", TargetPort: "t,0x1"}
	d2.AddNexus(a2)
	run(d2, a2, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil)
	good(t, run(d2, a2, []byte{scsi.OpWrite10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, make([]byte, 512)))
	// Registering again with APTPL=0 ends persistence.
	cdb, p = prOut(0, 0, 0xabc, 0xdef, 0)
	good(t, run(d2, a2, cdb, p))
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("APTPL=0 left the PR file: %v", err)
	}
	// Without a PR file, APTPL is refused.
	d3, _ := newDev(t, false)
	run(d3, a, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil) // power-on UA
	cdb, p = prOut(0, 0, 0, 1, 0x01)
	if s := sense(t, run(d3, a, cdb, p)); s.Key != scsi.SenseIllegalRequest {
		t.Fatalf("APTPL without a PR file: %v", s)
	}
}

// TestAllTargetPorts: a registration with ALL_TG_PT covers the initiator
// port through every target port.
func TestAllTargetPorts(t *testing.T) {
	d, _ := newDev(t, false)
	p1 := &Nexus{InitiatorPort: "iqn.a,i,0x1", TargetPort: "t,0x1"}
	p2 := &Nexus{InitiatorPort: "iqn.a,i,0x1", TargetPort: "t,0x2"}
	other := &Nexus{InitiatorPort: "iqn.b,i,0x1", TargetPort: "t,0x1"}
	for _, n := range []*Nexus{p1, p2, other} {
		d.AddNexus(n)
		run(d, n, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil)
	}
	cdb, p := prOut(0, 0, 0, 0x77, 0x04)
	good(t, run(d, p1, cdb, p))
	// Through the second target port the same key reserves.
	cdb, p = prOut(1, prEA, 0x77, 0, 0)
	good(t, run(d, p2, cdb, p))
	good(t, run(d, p1, []byte{scsi.OpRead10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, make([]byte, 512)))
	if c := run(d, other, []byte{scsi.OpRead10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, make([]byte, 512)); c.Status != scsi.StatusReservationConflict {
		t.Fatalf("another initiator under Exclusive Access: status %#x", c.Status)
	}
	if keys := readKeys(t, d, other); len(keys) != 1 {
		t.Fatalf("one ALL_TG_PT registration, READ KEYS lists %x", keys)
	}
}

// TestCompareAndWriteIsAtomic: goroutines increment a counter block only
// through COMPARE AND WRITE (read it, compare-and-swap old for old+1)
// while plain writes hammer the next block; every successful swap must
// count exactly once.
func TestCompareAndWriteIsAtomic(t *testing.T) {
	d, lu := newDev(t, false)
	n := &Nexus{}
	bs := lu.BlockSize()
	good(t, run(d, n, []byte{scsi.OpWrite10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, make([]byte, bs)))
	const workers, per = 4, 50
	done := make(chan int, workers+1)
	stop := make(chan struct{})
	go func() {
		buf := make([]byte, bs)
		for {
			select {
			case <-stop:
				done <- 0
				return
			default:
			}
			run(d, n, []byte{scsi.OpWrite10, 0, 0, 0, 0, 1, 0, 0, 1, 0}, buf)
		}
	}()
	for w := 0; w < workers; w++ {
		go func() {
			ok := 0
			cur := make([]byte, bs)
			for ok < per {
				run(d, n, []byte{scsi.OpRead10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, cur)
				v := binary.BigEndian.Uint64(cur)
				data := make([]byte, 2*bs)
				copy(data, cur)
				binary.BigEndian.PutUint64(data[bs:], v+1)
				c := run(d, n, []byte{scsi.OpCompareAndWrite, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0}, data)
				if c.Status == scsi.StatusGood {
					ok++
				}
			}
			done <- ok
		}()
	}
	total := 0
	for w := 0; w < workers; w++ {
		total += <-done
	}
	close(stop)
	<-done
	buf := make([]byte, bs)
	good(t, run(d, n, []byte{scsi.OpRead10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, buf))
	if got := binary.BigEndian.Uint64(buf); got != uint64(total) || total != workers*per {
		t.Fatalf("counter %d after %d successful COMPARE AND WRITEs", got, total)
	}
}

// TestRegisterAndMove: the holder hands its reservation to another I_T
// nexus named by TransportID and relative target port, unregistering
// itself (UNREG).
func TestRegisterAndMove(t *testing.T) {
	d, _ := newDev(t, false)
	a := &Nexus{InitiatorPort: "iqn.a,i,0x1", TargetPort: "t,0x1", RelativePort: 1}
	b := &Nexus{InitiatorPort: "iqn.b,i,0x2", TargetPort: "t,0x1", RelativePort: 1}
	for _, n := range []*Nexus{a, b} {
		d.AddNexus(n)
		run(d, n, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil)
	}
	cdb, p := prOut(0, 0, 0, 0x1111, 0)
	good(t, run(d, a, cdb, p))
	cdb, p = prOut(1, prWE, 0x1111, 0, 0)
	good(t, run(d, a, cdb, p))
	name := "iqn.b,i,0x2"
	tid := make([]byte, 4+((len(name)+1+3)&^3))
	tid[0] = 0x45
	binary.BigEndian.PutUint16(tid[2:], uint16(len(tid)-4))
	copy(tid[4:], name)
	prm := make([]byte, 24+len(tid))
	binary.BigEndian.PutUint64(prm[0:], 0x1111)
	binary.BigEndian.PutUint64(prm[8:], 0x2222)
	prm[17] = 0x02 // UNREG
	binary.BigEndian.PutUint16(prm[18:], 1)
	binary.BigEndian.PutUint32(prm[20:], uint32(len(tid)))
	copy(prm[24:], tid)
	mv := []byte{scsi.OpPersistentReserveOut, 7, prWE, 0, 0, 0, 0, 0, byte(len(prm)), 0}
	// Only the holder may move it.
	if c := run(d, b, mv, prm); c.Status != scsi.StatusReservationConflict {
		t.Fatalf("REGISTER AND MOVE by a non-holder: status %#x", c.Status)
	}
	good(t, run(d, a, mv, prm))
	if keys := readKeys(t, d, a); len(keys) != 1 || keys[0] != 0x2222 {
		t.Fatalf("keys after the move: %x", keys)
	}
	w := []byte{scsi.OpWrite10, 0, 0, 0, 0, 0, 0, 0, 1, 0}
	if c := run(d, a, w, make([]byte, 512)); c.Status != scsi.StatusReservationConflict {
		t.Fatalf("write by the former holder: status %#x", c.Status)
	}
	good(t, run(d, b, w, make([]byte, 512)))
}

// TestAPTPLFileIsPrivate: the reservation file holds the registrants'
// keys; it is 0600 whatever the umask, and no temporary file stays beside
// it (it was created 0666 minus the umask).
func TestAPTPLFileIsPrivate(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := t.TempDir()
	file := filepath.Join(dir, "lun0.img.pr")
	d := luWithPRFile(t, file)
	a := &Nexus{InitiatorPort: "iqn.a,i,0x1", TargetPort: "t,0x1"}
	d.AddNexus(a)
	run(d, a, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil)
	cdb, p := prOut(0, 0, 0, 0xabc, 0x01)
	good(t, run(d, a, cdb, p))
	st, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("PR file mode %v, want 0600", st.Mode().Perm())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("directory holds %d entries, want only the PR file", len(ents))
	}
}

// iscsiTID is an iSCSI TransportID (format 00b for a name, 01b for
// name,i,0xISID).
func iscsiTID(name string) []byte {
	tid := make([]byte, 4+((len(name)+1+3)&^3))
	tid[0] = 0x05
	if strings.Contains(name, ",i,0x") {
		tid[0] |= 0x40
	}
	binary.BigEndian.PutUint16(tid[2:], uint16(len(tid)-4))
	copy(tid[4:], name)
	return tid
}

// specIPT is REGISTER with SPEC_I_PT naming tids.
func specIPT(resKey, saKey uint64, flags byte, tids ...[]byte) ([]byte, []byte) {
	var list []byte
	for _, t := range tids {
		list = append(list, t...)
	}
	prm := make([]byte, 28, 28+len(list))
	binary.BigEndian.PutUint64(prm[0:], resKey)
	binary.BigEndian.PutUint64(prm[8:], saKey)
	prm[20] = 0x08 | flags
	binary.BigEndian.PutUint32(prm[24:], uint32(len(list)))
	prm = append(prm, list...)
	return []byte{scsi.OpPersistentReserveOut, 0, 0, 0, 0, 0, 0, 0, byte(len(prm)), 0}, prm
}

// TestSpecIPT: one REGISTER with SPEC_I_PT registers the sending nexus
// and the initiator ports its TransportIDs name (one by port, one by
// name), all or nothing, only from an unregistered nexus; REPORT
// CAPABILITIES says SIP_C.
func TestSpecIPT(t *testing.T) {
	d, _ := newDev(t, false)
	a := &Nexus{InitiatorPort: "iqn.a,i,0x1", TargetPort: "t,0x1", RelativePort: 1}
	b := &Nexus{InitiatorPort: "iqn.b,i,0x2", TargetPort: "t,0x1", RelativePort: 1}
	c3 := &Nexus{InitiatorPort: "iqn.c,i,0x3", TargetPort: "t,0x1", RelativePort: 1}
	other := &Nexus{InitiatorPort: "iqn.b,i,0x2", TargetPort: "t,0x2", RelativePort: 2}
	for _, n := range []*Nexus{a, b, c3, other} {
		d.AddNexus(n)
		run(d, n, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil)
	}
	caps := make([]byte, 8)
	good(t, run(d, a, []byte{scsi.OpPersistentReserveIn, 2, 0, 0, 0, 0, 0, 0, 8, 0}, caps))
	if caps[2]&0x08 == 0 {
		t.Fatalf("REPORT CAPABILITIES: SIP_C not set (% x)", caps)
	}
	// A malformed list (a TransportID cut short) registers nobody.
	cdb, prm := specIPT(0, 0x77, 0, iscsiTID("iqn.b,i,0x2"))
	prm = prm[:len(prm)-4]
	binary.BigEndian.PutUint32(prm[24:], uint32(len(prm)-28))
	cdb[8] = byte(len(prm))
	if c := run(d, a, cdb, prm); c.Status != scsi.StatusCheckCondition {
		t.Fatalf("a cut TransportID: status %#x", c.Status)
	}
	// A length that disagrees with the list.
	cdb, prm = specIPT(0, 0x77, 0, iscsiTID("iqn.b,i,0x2"))
	binary.BigEndian.PutUint32(prm[24:], 4)
	if c := run(d, a, cdb, prm); c.Status != scsi.StatusCheckCondition {
		t.Fatalf("a TransportID length that disagrees: status %#x", c.Status)
	}
	if keys := readKeys(t, d, a); len(keys) != 0 {
		t.Fatalf("keys after refused lists: %x", keys)
	}
	cdb, prm = specIPT(0, 0x77, 0, iscsiTID("iqn.b,i,0x2"), iscsiTID("iqn.c"))
	good(t, run(d, a, cdb, prm))
	if keys := readKeys(t, d, a); len(keys) != 3 {
		t.Fatalf("keys after SPEC_I_PT naming two: %x", keys)
	}
	// b and c are registered through the receiving target port, not
	// through another one.
	w := []byte{scsi.OpPersistentReserveOut, 1, prWE, 0, 0, 0, 0, 0, 24, 0}
	cdb, p := prOut(1, prWE, 0x77, 0, 0)
	good(t, run(d, b, cdb, p))
	if c := run(d, other, w, p); c.Status != scsi.StatusReservationConflict {
		t.Fatalf("the same initiator through another target port: status %#x", c.Status)
	}
	cdb, p = prOut(2, prWE, 0x77, 0, 0)
	good(t, run(d, b, cdb, p))
	cdb, p = prOut(1, prWE, 0x77, 0, 0)
	good(t, run(d, c3, cdb, p)) // registered by name: any of its ports
	// Only an unregistered nexus may name others; a registered one named
	// refuses the whole list.
	cdb, prm = specIPT(0x77, 0x88, 0, iscsiTID("iqn.d,i,0x4"))
	if c := run(d, a, cdb, prm); c.Status != scsi.StatusCheckCondition {
		t.Fatalf("SPEC_I_PT from a registered nexus: status %#x", c.Status)
	}
	cdb, prm = specIPT(0, 0x99, 0, iscsiTID("iqn.d,i,0x4"), iscsiTID("iqn.b,i,0x2"))
	if c := run(d, other, cdb, prm); c.Status != scsi.StatusGood {
		t.Fatalf("SPEC_I_PT through another target port: status %#x", c.Status)
	}
	cdb, prm = specIPT(0, 0x99, 0, iscsiTID("iqn.e,i,0x5"), iscsiTID("iqn.a,i,0x1"))
	e := &Nexus{InitiatorPort: "iqn.f,i,0x6", TargetPort: "t,0x1", RelativePort: 1}
	d.AddNexus(e)
	run(d, e, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil)
	if c := run(d, e, cdb, prm); c.Status != scsi.StatusCheckCondition {
		t.Fatalf("SPEC_I_PT naming a registered port: status %#x", c.Status)
	}
	if keys := readKeys(t, d, a); len(keys) != 5 {
		t.Fatalf("keys: %x (want a, b, c, and other with d)", keys)
	}
	// Only REGISTER takes SPEC_I_PT.
	cdb, prm = specIPT(0, 0x99, 0, iscsiTID("iqn.g,i,0x7"))
	cdb[1] = 6 // REGISTER AND IGNORE EXISTING KEY
	if c := run(d, e, cdb, prm); c.Status != scsi.StatusCheckCondition {
		t.Fatalf("SPEC_I_PT with REGISTER AND IGNORE EXISTING KEY: status %#x", c.Status)
	}
}

// TestPreemptAndAbortDoesNotDeadlock: a PREEMPT AND ABORT whose victim
// task is about to check the reservation completes, and so does the
// task. The preemption used to wait for its victims while holding the
// reservation state's lock, which the victim needs for its check: the LU
// stopped for good (found by test/torture).
func TestPreemptAndAbortDoesNotDeadlock(t *testing.T) {
	d, lu := newDev(t, false)
	admin := &Nexus{InitiatorPort: "iqn.admin,i,0x1", TargetPort: "t,0x1"}
	victim := &Nexus{InitiatorPort: "iqn.victim,i,0x1", TargetPort: "t,0x1"}
	for _, n := range []*Nexus{admin, victim} {
		d.AddNexus(n)
		clearUA(t, d, n)
	}
	cdb, p := prOut(0, 0, 0, 0xad, 0)
	good(t, run(d, admin, cdb, p))
	cdb, p = prOut(0, 0, 0, 0x77, 0)
	good(t, run(d, victim, cdb, p))
	cdb, p = prOut(1, prWERO, 0xad, 0, 0)
	good(t, run(d, admin, cdb, p))

	// The preemption takes the reservation state's lock while the
	// victim's write, past its abort check, waits for the same lock to
	// check the reservation. The test holds the lock until both wait
	// for it, the preemption first.
	lu.pr.mu.Lock()
	preempted := make(chan *Command)
	go func() {
		cdb, p := prOut(5, prWERO, 0xad, 0x77, 0)
		preempted <- run(d, admin, cdb, p)
	}()
	time.Sleep(50 * time.Millisecond)
	ran := make(chan *Command)
	go func() {
		ran <- run(d, victim, []byte{scsi.OpWrite10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, make([]byte, 512))
	}()
	time.Sleep(50 * time.Millisecond)
	lu.pr.mu.Unlock()
	select {
	case c := <-preempted:
		good(t, c)
	case <-time.After(5 * time.Second):
		t.Fatal("PREEMPT AND ABORT did not complete: it holds the reservation state while it waits for a task that needs it")
	}
	select {
	case c := <-ran:
		if c.Status == scsi.StatusGood && !c.Aborted() {
			t.Errorf("the preempted nexus's write succeeded after its preemption")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the victim's write never ended")
	}
	if keys := readKeys(t, d, admin); len(keys) != 1 || keys[0] != 0xad {
		t.Errorf("registered keys after the preemption: %x, want only ad", keys)
	}
}
