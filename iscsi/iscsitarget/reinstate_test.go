package iscsitarget

import (
	"sync"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/scsitarget"
)

// gatedDisk holds reads while the gate is shut.
type gatedDisk struct {
	*mem.Disk
	gate    chan struct{}
	entered chan struct{}
	once    sync.Once
}

func (g *gatedDisk) ReadAt(p []byte, off int64) (int, error) {
	g.once.Do(func() { close(g.entered) })
	<-g.gate
	return g.Disk.ReadAt(p, off)
}

// sendCDB sends a command, tagged itt, of edtl bytes to read (or, with
// write, to write, none of them sent), and does not wait for its answer.
func sendCDB(c *tclient, itt uint32, cdb []byte, write bool, edtl uint32) {
	sendCommand(c, itt, cdb, !write, write, edtl)
}

// sendCommand is sendCDB with both direction bits given (neither: a
// command without data, such as TEST UNIT READY).
func sendCommand(c *tclient, itt uint32, cdb []byte, read, write bool, edtl uint32) {
	cmd := pdu.SCSICommand{Final: true, Read: read, Write: write, Attr: pdu.AttrSimple, ITT: itt, EDTL: edtl, CmdSN: c.cmdSN, ExpStatSN: c.expStatSN}
	c.cmdSN++
	copy(cmd.CDB[:], cdb)
	var h pdu.BHS
	cmd.Encode(&h)
	c.sendRaw(&h, nil, nil)
}

// TestReinstatementEndsTheOldNexusFirst: a session that prevents medium
// removal is reinstated (same initiator and ISID) while one of its reads
// is stuck in the storage. The new session's login answers only once the
// old session has ended, and with it its I_T nexus and its prevention:
// the new session's first command, an eject, succeeds (RFC 7143 §6.3.5;
// libiscsi's PreventAllow.ITNexusLoss found the race).
func TestReinstatementEndsTheOldNexusFirst(t *testing.T) {
	ts, _ := preventingWithAStuckRead(t)
	loginAndEject(t, ts, func(*tclient) {}) // the same ISID, TSIH 0: reinstatement
}

// held is how long the storage holds the old session's read.
const held = 300 * time.Millisecond

// preventingWithAStuckRead starts a target with a removable LU, and a
// session that prevents medium removal and has a read held in the
// storage; the storage lets it go held after this returns.
func preventingWithAStuckRead(t *testing.T) (*testServer, *tclient) {
	d, _ := mem.New(1 << 20)
	g := &gatedDisk{Disk: d, gate: make(chan struct{}), entered: make(chan struct{})}
	ts := startServer(t, Options{}, onLU(t, scsitarget.LUConfig{Backend: g, Removable: true}))
	old := dial(t, ts.addr)
	old.mustLogin(normalKeys(ini)...)
	old.command(tur(), false, 0, nil, 0) // the power-on unit attention
	if r := old.command([]byte{0x1e, 0, 0, 0, 1, 0}, false, 0, nil, 0); r.status != 0 {
		t.Fatalf("PREVENT MEDIUM REMOVAL: status %d", r.status)
	}
	sendCDB(old, 99, read10(0, 1), false, 512)
	<-g.entered
	go func() { time.Sleep(held); close(g.gate) }()
	return ts, old
}

// loginAndEject logs the initiator in again (its client set up by
// prepare) and checks that the login answered only once the old session
// had ended, and that an eject then succeeds: the old nexus's prevention
// ended with it.
func loginAndEject(t *testing.T, ts *testServer, prepare func(*tclient)) {
	t.Helper()
	start := time.Now()
	fresh := dial(t, ts.addr)
	prepare(fresh)
	fresh.mustLogin(normalKeys(ini)...)
	if waited := time.Since(start); waited < held-50*time.Millisecond {
		t.Errorf("the new session answered after %v, while the old one still had a read in the storage", waited)
	}
	fresh.command(tur(), false, 0, nil, 0) // the new nexus's unit attention
	if r := fresh.command([]byte{0x1b, 0, 0, 0, 0x02, 0}, false, 0, nil, 0); r.status != 0 {
		t.Fatalf("eject from the new session: status %d sense %x (the old nexus's prevention outlived it)", r.status, r.sense)
	}
}

// TestClosedSessionEndsBeforeTheInitiatorsNextOne: the initiator closes
// the connection of a session that prevents medium removal (no Logout)
// while one of its reads is stuck in the storage, and logs in again at
// once with another ISID — a new I_T nexus, not a reinstatement, as
// libiscsi does when its reconnect draws another random ISID. The
// transport already knows of the old nexus's loss, so the new session's
// login answers only once the old session has ended, and the eject that
// follows succeeds (libiscsi's PreventAllow.ITNexusLoss failed in CI
// when the new session's eject overtook the old session's end).
func TestClosedSessionEndsBeforeTheInitiatorsNextOne(t *testing.T) {
	ts, old := preventingWithAStuckRead(t)
	old.nc.Close()                                               // the I_T nexus is lost; its read is still in the storage
	loginAndEject(t, ts, func(c *tclient) { c.isid[5] ^= 0x5a }) // another ISID: a new nexus
}

// TestLiveSessionOfTheInitiatorDoesNotHoldItsNextOne: a second session of
// the same initiator (another ISID: another port, as open-iscsi's
// interfaces log in) while the first is alive and busy logs in at once.
func TestLiveSessionOfTheInitiatorDoesNotHoldItsNextOne(t *testing.T) {
	d, _ := mem.New(1 << 20)
	g := &gatedDisk{Disk: d, gate: make(chan struct{}), entered: make(chan struct{})}
	ts := startServer(t, Options{}, onLU(t, scsitarget.LUConfig{Backend: g}))
	first := dial(t, ts.addr)
	first.mustLogin(normalKeys(ini)...)
	first.command(tur(), false, 0, nil, 0)
	sendCDB(first, 99, read10(0, 1), false, 512)
	<-g.entered
	defer close(g.gate)
	start := time.Now()
	second := dial(t, ts.addr)
	second.isid[5] ^= 0x5a
	second.mustLogin(normalKeys(ini)...)
	if waited := time.Since(start); waited > 2*time.Second {
		t.Errorf("a second session of a live initiator waited %v to log in", waited)
	}
}
