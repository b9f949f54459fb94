package initiator

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/datamover/iser"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/internal/servetest"
	"github.com/blockwire/blockwire/internal/waitfor"
	"github.com/blockwire/blockwire/iscsi/iscsitarget"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/siw"
	"github.com/blockwire/blockwire/scsitarget"
)

// startISERTarget serves tIQN on one TCP port for iSCSI/TCP and iSER
// (connections that open with an MPA Request go to the software iWARP
// device).
func startISERTarget(t testing.TB) string {
	t.Helper()
	return startTargetOpts(t, scsitarget.LUConfig{}, nil, iscsitarget.Options{}, fabric.ISERPortal{
		IWARP: siw.New(siw.Options{}),
		PD:    rdma.NewDevice("target").AllocPD(),
	})
}

// TestISERRFC5046Profile logs in on TCP in byte-stream mode with
// RDMAExtensions=Yes, then the same connection turns into an RDMA stream
// with the Hello exchange and 12-byte headers (RFC 5046 §5.1).
func TestISERRFC5046Profile(t *testing.T) {
	addr := startISERTarget(t)
	d, err := Open(context.Background(), fmt.Sprintf("iser://%s/%s/0", addr, tIQN), Options{Dialer: &fabric.Dialer{Profile: iser.ProfileRFC5046}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	up, ok := d.s.links[0].dm.(*fabric.Upgrade)
	if !ok || !up.ISER() {
		t.Fatalf("connection did not switch to iSER (%T)", d.s.links[0].dm)
	}
	for _, n := range []int{512, 8192, 65536, 1 << 20} {
		data := make([]byte, n)
		rand.Read(data)
		if _, err := d.WriteAt(data, 4096); err != nil {
			t.Fatalf("write %d: %v", n, err)
		}
		back := make([]byte, n)
		if _, err := d.ReadAt(back, 4096); err != nil {
			t.Fatalf("read %d: %v", n, err)
		}
		if !bytes.Equal(back, data) {
			t.Fatalf("%d bytes: read back differs", n)
		}
	}
	// Without RDMAExtensions the same kind of connection stays iSCSI/TCP.
	dt, err := Open(context.Background(), fmt.Sprintf("iscsi://%s/%s/0", addr, tIQN), Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	dt.Close()
}

// TestISERReadWrite runs the same SCSI workload as the TCP tests over
// iSER: login in RDMA Sends, reads by RDMA Write, writes with immediate
// data and the rest by RDMA Read, of many sizes and concurrently.
func TestISERReadWrite(t *testing.T) {
	addr := startISERTarget(t)
	ctx := context.Background()
	d, err := Open(ctx, fmt.Sprintf("iser://%s/%s/0", addr, tIQN), Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Size() != 64<<20 || d.BlockSize() != 512 {
		t.Fatalf("size %d block %d", d.Size(), d.BlockSize())
	}
	for _, n := range []int{512, 4096, 8192, 8704, 65536, 3 << 20} {
		data := make([]byte, n)
		rand.Read(data)
		off := int64(n) * 3
		if _, err := d.WriteAt(data, off); err != nil {
			t.Fatalf("write %d: %v", n, err)
		}
		back := make([]byte, n)
		if k, err := d.ReadAt(back, off); err != nil || k != n {
			t.Fatalf("read %d: %d %v", n, k, err)
		}
		if !bytes.Equal(back, data) {
			t.Fatalf("%d bytes: read back differs", n)
		}
	}
	// Many in flight at once.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			data := make([]byte, 16384+512*g)
			rand.Read(data)
			off := int64(g) << 20
			for i := 0; i < 20; i++ {
				if _, err := d.WriteAt(data, off); err != nil {
					errs <- err
					return
				}
				back := make([]byte, len(data))
				if _, err := d.ReadAt(back, off); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(back, data) {
					errs <- fmt.Errorf("goroutine %d: mismatch", g)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	// The same port serves iSCSI/TCP, which sees what iSER wrote.
	dt, err := Open(ctx, fmt.Sprintf("iscsi://%s/%s/0", addr, tIQN), Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer dt.Close()
	viaTCP, viaISER := make([]byte, 65536), make([]byte, 65536)
	dt.ReadAt(viaTCP, 0)
	d.ReadAt(viaISER, 0)
	if !bytes.Equal(viaTCP, viaISER) {
		t.Fatal("iSCSI/TCP and iSER see different data")
	}
	// A SCSI error's sense data arrives in the SCSI Response Send.
	_, err = d.Do(ctx, []byte{0xc7, 0, 0, 0, 0, 0}, nil, nil)
	var se *SCSIError
	if !asSCSI(err, &se) || se.Sense == nil || se.Sense.ASC != 0x20 {
		t.Fatalf("unknown opcode: %v", err)
	}
}

func asSCSI(err error, se **SCSIError) bool {
	e, ok := err.(*SCSIError)
	if ok {
		*se = e
	}
	return ok
}

// TestServeISER serves iSER from an RDMA listener of its own (fabric.ISER: the entry
// for fabrics without a TCP portal to share, such as RoCE later) and
// reads back a write through it; Shutdown closes that listener too.
func TestServeISER(t *testing.T) {
	srv := newTargetServer(t, scsitarget.LUConfig{}, nil, iscsitarget.Options{})
	l, err := siw.New(siw.Options{}).Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() {
		served <- srv.Serve(fabric.ISER(l, rdma.NewDevice("target").AllocPD(), iser.Options{}))
	}()
	d, err := Open(context.Background(), fmt.Sprintf("iser://%s/%s/0", l.Addr(), tIQN), Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 192<<10)
	rand.Read(data)
	if _, err := d.WriteAt(data, 8192); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(data))
	if _, err := d.ReadAt(back, 8192); err != nil || !bytes.Equal(back, data) {
		t.Fatalf("read back differs (%v)", err)
	}
	d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(ctx)
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after Shutdown")
	}
}

// TestISERUnexpectedPDULimit: the target declares MaxOutstandingUnexpectedPDUs
// = 2 (RFC 5046 §6.7). An idle session's immediate NOP-Out pings are
// unexpected PDUs that only a regulated PDU can retire (§8.1.1.3), so once
// two are outstanding the initiator must not send a third: it sends the
// ping without the immediate flag instead, whose answer retires them all.
// The target, counting what it receives, would drop a connection that
// went past 2; the session stays up and keeps its data path, in both
// profiles.
func TestISERUnexpectedPDULimit(t *testing.T) {
	addr := startTargetOpts(t, scsitarget.LUConfig{}, nil, iscsitarget.Options{}, fabric.ISERPortal{
		IWARP:   siw.New(siw.Options{}),
		PD:      rdma.NewDevice("target").AllocPD(),
		Options: iser.Options{Unexpected: 2},
	})
	for _, prof := range []iser.Profile{iser.ProfileLinux, iser.ProfileRFC5046} {
		t.Run(prof.String(), func(t *testing.T) {
			var logs servetest.LogBuffer
			log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			d, err := Open(context.Background(), fmt.Sprintf("iser://%s/%s/0", addr, tIQN),
				Options{Dialer: &fabric.Dialer{Profile: prof}, NopInterval: 20 * time.Millisecond, Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			first := d.s.links[0]
			const note = "MaxOutstandingUnexpectedPDUs is reached"
			waitfor.True(t, 10*time.Second, func() bool { return strings.Count(logs.String(), note) >= 3 }, func() string {
				return "no regulated ping after 2 outstanding unexpected ones; log:\n" + logs.String()
			})
			data := make([]byte, 64<<10)
			rand.Read(data)
			if _, err := d.WriteAt(data, 0); err != nil {
				t.Fatal(err)
			}
			back := make([]byte, len(data))
			if _, err := d.ReadAt(back, 0); err != nil || !bytes.Equal(back, data) {
				t.Fatalf("read back differs (%v)", err)
			}
			d.s.mu.Lock()
			same := len(d.s.links) == 1 && d.s.links[0] == first
			d.s.mu.Unlock()
			if !same || strings.Contains(logs.String(), "reconnect") {
				t.Fatalf("the connection was replaced; log:\n%s", logs.String())
			}
		})
	}
}

// TestPreferFallback: the iSER-on-InfiniBand draft part III from the initiator's side. With
// Prefer set, Open asks for the preferred kind of iSER node first (the
// flag in the connection request's private data), then the other kind,
// then falls back to iSCSI/TCP; a node that cannot meet a preference
// refuses the connection with a readable reason.
func TestPreferFallback(t *testing.T) {
	portal := func() fabric.ISERPortal {
		return fabric.ISERPortal{IWARP: siw.New(siw.Options{}), PD: rdma.NewDevice("target").AllocPD()}
	}
	endNode := startTargetOpts(t, scsitarget.LUConfig{}, nil, iscsitarget.Options{}, portal())
	gateway := startTargetOpts(t, scsitarget.LUConfig{}, nil, iscsitarget.Options{Gateway: true}, portal())
	tcpOnly := startTargetOpts(t, scsitarget.LUConfig{}, nil, iscsitarget.Options{})
	for _, tc := range []preferCase{
		{"direct to an end node", endNode, "direct", true, iser.PreferEndNode, ""},
		{"direct to a gateway", gateway, "direct", true, iser.PreferGateway, "a gateway; an end node only was asked"},
		{"gateway to an end node", endNode, "gateway", true, iser.PreferEndNode, "an end node; a gateway only was asked"},
		{"gateway to a gateway", gateway, "gateway", true, iser.PreferGateway, ""},
		{"any to a gateway", gateway, "any", true, iser.PreferEither, ""},
		{"direct without iSER", tcpOnly, "direct", false, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, nil, "iwarp") })
	}
}

// preferCase is one Open with Options.Prefer: how it must connect, and
// the refusal that must be logged first.
type preferCase struct {
	name, addr, prefer string
	iser               bool
	pref               iser.Preference
	refused            string // logged for a refused first try
}

// run opens the LUN at tc.addr over rdmaFabric (nil: the default software
// iWARP), checks how it connected (connection-first iSER on transport, or
// iSCSI/TCP) and the refusal logged, then writes and reads back.
func (tc preferCase) run(t *testing.T, rdmaFabric rdma.Fabric, transport string) {
	var logs servetest.LogBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	d, err := Open(context.Background(), fmt.Sprintf("iscsi://%s/%s/0", tc.addr, tIQN),
		Options{Dialer: &fabric.Dialer{RDMA: rdmaFabric}, Prefer: tc.prefer, Logger: log, DialTimeout: 3 * time.Second})
	if err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	defer d.Close()
	o := d.s.opts
	if o.ISER != tc.iser || tc.iser && o.pref != tc.pref {
		t.Fatalf("connected with iSER %v preference %v, want %v %v\n%s", o.ISER, o.pref, tc.iser, tc.pref, logs.String())
	}
	if tc.iser {
		c, ok := d.s.links[0].dm.(*iser.Conn)
		if !ok {
			t.Fatalf("a %T connection where connection-first iSER was asked", d.s.links[0].dm)
		}
		if tr := c.Transport(); tr != transport {
			t.Fatalf("transport %q, want %q", tr, transport)
		}
	}
	if tc.refused != "" && !strings.Contains(logs.String(), tc.refused) {
		t.Fatalf("the refusal (%q) is not in the log:\n%s", tc.refused, logs.String())
	}
	buf := make([]byte, 4096)
	rand.Read(buf)
	back := make([]byte, len(buf))
	if _, err := d.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ReadAt(back, 0); err != nil || !bytes.Equal(back, buf) {
		t.Fatalf("read back differs (%v)", err)
	}
}

// TestISERRingChargedToTheBudget: the receive ring and send slots an iSER
// connection grows to when its login completes are charged to the I/O
// budget of its source, given back when it ends — and a login the budget
// has no room for ends instead of holding them. (They were plain memory
// outside every budget: ~0.5 MiB a connection, the sessions' count the
// only bound.)
func TestISERRingChargedToTheBudget(t *testing.T) {
	budget := blockcore.NewIOBudget(64<<20, 32<<20)
	addr := startTargetOpts(t, scsitarget.LUConfig{}, nil, iscsitarget.Options{Budget: budget}, fabric.ISERPortal{
		IWARP: siw.New(siw.Options{}),
		PD:    rdma.NewDevice("target").AllocPD(),
	})
	url := fmt.Sprintf("iser://%s/%s/0", addr, tIQN)
	d, err := Open(context.Background(), url, Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	ring := budget.Used()
	if ring < 256<<10 {
		t.Fatalf("a logged-in iSER connection holds %d bytes of the budget, want its ring (~0.5 MiB)", ring)
	}
	d.Close()
	waitUsed(t, budget, 0)
	// A budget with room for less than a ring: the login ends, nothing
	// stays charged.
	small := blockcore.NewIOBudget(ring/2, ring/2)
	addr = startTargetOpts(t, scsitarget.LUConfig{}, nil, iscsitarget.Options{Budget: small}, fabric.ISERPortal{
		IWARP: siw.New(siw.Options{}),
		PD:    rdma.NewDevice("target").AllocPD(),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if d, err := Open(ctx, fmt.Sprintf("iser://%s/%s/0", addr, tIQN), Options{Dialer: &fabric.Dialer{}, RecoveryTimeout: -1}); err == nil {
		d.Close()
		t.Fatalf("an iSER login went through with %d bytes of budget for a %d-byte ring", ring/2, ring)
	}
	waitUsed(t, small, 0)
}

func waitUsed(t *testing.T, b *blockcore.IOBudget, want int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for b.Used() != want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if u := b.Used(); u != want {
		t.Fatalf("%d bytes of the budget held, want %d", u, want)
	}
}
