package iscsitarget

import (
	"runtime"
	"testing"
	"time"

	"github.com/blockwire/blockwire/iscsi/pdu"
)

// TestFaultsLeakNothing cuts connections at the awkward moments — during
// Data-Out, with a read in flight, between R2Ts, without logout — and logs
// in again with the same ISID (reinstatement). Afterwards the target's
// goroutines return to their baseline, no session is left, and a new
// session works.
func TestFaultsLeakNothing(t *testing.T) {
	ts := startServer(t, Options{NopInterval: -1}, nil)
	warm := dial(t, ts.addr)
	warm.mustLogin(normalKeys(ini)...)
	warm.command(tur(), false, 0, nil, 0)
	warm.command(read10(0, 8), true, 4096, nil, 0)
	warm.nc.Close()
	// The LU's workers start with its first command handed to them
	// (a lone command runs on the receiver instead): started here, they
	// are part of the baseline.
	ran := make(chan struct{})
	ts.dev.LU(0).Submit(runFunc(func() { close(ran) }))
	<-ran
	settle := func() int {
		for range 100 {
			if len(ts.srv.Sessions()) == 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond)
		return runtime.NumGoroutine()
	}
	base := settle()

	data := make([]byte, 256<<10)
	var h pdu.BHS
	for round := range 3 {
		// 1. Cut during Data-Out: command, R2T, half the burst, cut.
		c := dial(t, ts.addr)
		c.mustLogin(normalKeys(ini, kv("InitialR2T", "Yes"))...)
		c.command(tur(), false, 0, nil, 0)
		cmd := pdu.SCSICommand{Final: true, Write: true, ITT: 100, EDTL: uint32(len(data)), CmdSN: c.cmdSN}
		copy(cmd.CDB[:], write10(0, 512))
		cmd.Encode(&h)
		c.sendRaw(&h, nil, nil)
		rh, _ := c.must(2 * time.Second)
		var r pdu.R2T
		r.Decode(&rh)
		do := pdu.DataOut{ITT: 100, TTT: r.TTT, Offset: 0}
		do.Encode(&h)
		c.sendRaw(&h, nil, data[:8192])
		c.nc.Close()

		// 2. Cut with reads in flight (several commands queued).
		c = dial(t, ts.addr)
		c.isid[5] = 2
		c.mustLogin(normalKeys(ini)...)
		for i := range 16 {
			rc := pdu.SCSICommand{Final: true, Read: true, ITT: uint32(200 + i), EDTL: 65536, CmdSN: c.cmdSN}
			c.cmdSN++
			copy(rc.CDB[:], read10(uint32(i*128), 128))
			rc.Encode(&h)
			c.sendRaw(&h, nil, nil)
		}
		c.nc.Close()

		// 3. Between R2Ts: the first burst complete, then vanish.
		c = dial(t, ts.addr)
		c.isid[5] = 3
		c.mustLogin(normalKeys(ini, kv("InitialR2T", "Yes"), kv("MaxBurstLength", "65536"))...)
		c.command(tur(), false, 0, nil, 0)
		cmd = pdu.SCSICommand{Final: true, Write: true, ITT: 300, EDTL: uint32(len(data)), CmdSN: c.cmdSN}
		copy(cmd.CDB[:], write10(0, 512))
		cmd.Encode(&h)
		c.sendRaw(&h, nil, nil)
		rh, _ = c.must(2 * time.Second)
		r.Decode(&rh)
		do = pdu.DataOut{Final: true, ITT: 300, TTT: r.TTT, Offset: 0}
		do.Encode(&h)
		c.sendRaw(&h, nil, data[:r.Desired])
		c.must(2 * time.Second) // the next R2T
		c.nc.Close()

		// 4. Reinstatement: same ISID as an open session, then vanish.
		a := dial(t, ts.addr)
		a.isid[5] = 4
		a.mustLogin(normalKeys(ini)...)
		b := dial(t, ts.addr)
		b.isid[5] = 4
		b.mustLogin(normalKeys(ini)...)
		if _, _, ok := a.recv(2 * time.Second); ok {
			t.Fatalf("round %d: reinstated session's old connection still open", round)
		}
		b.nc.Close()
	}
	n := settle()
	t.Logf("goroutines: %d before the faults, %d after", base, n)
	if n > base+2 {
		buf := make([]byte, 1<<16)
		t.Fatalf("goroutines: %d after the faults, %d before\n%s", n, base, buf[:runtime.Stack(buf, true)])
	}
	if n < base-2 {
		t.Fatalf("goroutines fell from %d to %d: the baseline was not settled", base, n)
	}
	if n := len(ts.srv.Sessions()); n != 0 {
		t.Fatalf("%d sessions left", n)
	}
	c := dial(t, ts.addr)
	c.mustLogin(normalKeys(ini)...)
	c.command(tur(), false, 0, nil, 0)
	if res := c.command(tur(), false, 0, nil, 0); res.status != 0 {
		t.Fatalf("new session after the faults: %d", res.status)
	}
}

// runFunc is a blockcore.Work.
type runFunc func()

func (f runFunc) Run() { f() }
