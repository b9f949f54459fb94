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
	d, _ := mem.New(1 << 20)
	g := &gatedDisk{Disk: d, gate: make(chan struct{}), entered: make(chan struct{})}
	ts := startServer(t, Options{}, onLU(t, scsitarget.LUConfig{Backend: g, Removable: true}))
	old := dial(t, ts.addr)
	old.mustLogin(normalKeys(ini)...)
	old.command(tur(), false, 0, nil, 0) // the power-on unit attention
	if r := old.command([]byte{0x1e, 0, 0, 0, 1, 0}, false, 0, nil, 0); r.status != 0 {
		t.Fatalf("PREVENT MEDIUM REMOVAL: status %d", r.status)
	}
	// A read that the storage holds.
	sendCDB(old, 99, read10(0, 1), false, 512)
	<-g.entered

	const held = 300 * time.Millisecond
	go func() { time.Sleep(held); close(g.gate) }()
	start := time.Now()
	fresh := dial(t, ts.addr) // the same ISID, TSIH 0: reinstatement
	fresh.mustLogin(normalKeys(ini)...)
	if waited := time.Since(start); waited < held-50*time.Millisecond {
		t.Errorf("the new session answered after %v, while the old one still had a read in the storage", waited)
	}
	fresh.command(tur(), false, 0, nil, 0) // the new nexus's unit attention
	if r := fresh.command([]byte{0x1b, 0, 0, 0, 0x02, 0}, false, 0, nil, 0); r.status != 0 {
		t.Fatalf("eject from the new session: status %d sense %x (the old nexus's prevention outlived it)", r.status, r.sense)
	}
}
