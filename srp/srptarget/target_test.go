package srptarget_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/blockdev"
	"github.com/blockwire/blockwire/internal/servetest"
	"github.com/blockwire/blockwire/internal/waitfor"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/siw"
	"github.com/blockwire/blockwire/scsi"
	"github.com/blockwire/blockwire/scsitarget"
	"github.com/blockwire/blockwire/srp"
	"github.com/blockwire/blockwire/srp/srpinitiator"
	"github.com/blockwire/blockwire/srp/srptarget"
)

const idExt = 0x0011223344556677

var tgtPort = srp.MakePortID(idExt, idExt)

// gated is a memory backend whose writes wait while the gate is closed.
type gated struct {
	*mem.Disk
	gate   atomic.Pointer[chan struct{}]
	inside chan struct{}
}

func (g *gated) WriteAt(p []byte, off int64) (int, error) {
	if ch := g.gate.Load(); ch != nil {
		select {
		case g.inside <- struct{}{}:
		default:
		}
		<-*ch
	}
	return g.Disk.WriteAt(p, off)
}

func start(t testing.TB, credits int) (string, *srptarget.Server, *gated) {
	t.Helper()
	return startBudget(t, credits, nil)
}

func startBudget(t testing.TB, credits int, budget *blockcore.IOBudget) (string, *srptarget.Server, *gated) {
	t.Helper()
	return startWith(t, srptarget.Options{Credits: credits, Budget: budget})
}

// startWith starts a target port with opts (its device and port filled
// in, and its logger unless it has one) on a software iWARP listener.
func startWith(t testing.TB, opts srptarget.Options) (string, *srptarget.Server, *gated) {
	t.Helper()
	return startServing(t, opts, nil)
}

// startServing is startWith serving the listener that wrap makes of the
// software iWARP one (nil: that one itself).
func startServing(t testing.TB, opts srptarget.Options, wrap func(rdma.Listener) rdma.Listener) (string, *srptarget.Server, *gated) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	dev := scsitarget.NewDevice("iqn.2026-11.org.blockwire:srpt", log)
	m, _ := mem.New(16 << 20)
	g := &gated{Disk: m, inside: make(chan struct{}, 1)}
	lu, err := scsitarget.NewLU(dev.Name(), scsitarget.LUConfig{Backend: g})
	if err != nil {
		t.Fatal(err)
	}
	dev.AddLU(lu)
	if opts.Logger != nil {
		log = opts.Logger
	}
	opts.PD, opts.Device, opts.IDExt, opts.IOCGUID, opts.Logger = rdma.NewDevice("t").AllocPD(), dev, idExt, idExt, log
	srv := srptarget.New(opts)
	ln, err := siw.New(siw.Options{}).Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var served rdma.Listener = ln
	if wrap != nil {
		served = wrap(ln)
	}
	go srv.Serve(served)
	t.Cleanup(func() {
		if ch := g.gate.Swap(nil); ch != nil {
			close(*ch)
		}
		srv.Close()
	})
	return ln.Addr().String(), srv, g
}

// raw is a hand-driven channel: it sends whatever IUs a test builds.
type raw struct {
	qp  rdma.QP
	pd  *rdma.PD
	cq  *rdma.CQ
	buf [8][512]byte
	rsp srp.LoginRsp
}

func dialRaw(t testing.TB, addr string) *raw {
	t.Helper()
	r, err := dialRawFrom(t, "", addr)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// dialRawFrom logs a raw channel in from the local address from ("": any).
func dialRawFrom(t testing.TB, from, addr string) (*raw, error) {
	t.Helper()
	r := &raw{pd: rdma.NewDevice("raw").AllocPD(), cq: rdma.NewCQ(64)}
	var recvs []rdma.RecvWR
	for i := range r.buf {
		recvs = append(recvs, rdma.RecvWR{ID: uint64(i), Buf: r.buf[i][:]})
	}
	lr := srp.LoginReq{MaxITIULen: 8260, BufFormats: srp.BufDirect | srp.BufIndirect, Immediate: true, ImmDataOffset: 68,
		Initiator: srp.MakePortID(1, uint64(time.Now().UnixNano())), Target: tgtPort}
	d := net.Dialer{}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	qp, pd, err := siw.New(siw.Options{}).Connect(context.Background(), nc, rdma.ConnParams{PD: r.pd,
		QP: rdma.QPConfig{SendCQ: r.cq, RecvCQ: r.cq}, PrivateData: lr.AppendCM(nil), Recvs: recvs})
	if err != nil {
		nc.Close()
		return nil, err
	}
	if err := r.rsp.Decode(pd); err != nil {
		t.Fatal(err)
	}
	r.qp = qp
	t.Cleanup(func() { qp.Close() })
	return r, nil
}

func (r *raw) send(t testing.TB, iu []byte) {
	t.Helper()
	if err := r.qp.PostSend(&rdma.SendWR{Op: rdma.OpSend, SG: [][]byte{iu}, Unsignaled: true}); err != nil {
		t.Fatal(err)
	}
}

// next returns the next IU the target sends (nil when the channel ends).
func (r *raw) next(t testing.TB) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var c [1]rdma.Completion
	for {
		if _, err := r.cq.Wait(ctx, c[:]); err != nil {
			t.Fatal("no IU from the target in 5 s")
		}
		if c[0].Op != rdma.OpRecv {
			continue
		}
		if c[0].Status != rdma.Success {
			return nil
		}
		iu := append([]byte(nil), r.buf[c[0].ID][:c[0].Len]...)
		_ = r.qp.PostRecv(rdma.RecvWR{ID: c[0].ID, Buf: r.buf[c[0].ID][:]})
		return iu
	}
}

func (r *raw) expectLogout(t *testing.T, want srp.LogoutReason) {
	t.Helper()
	for {
		iu := r.next(t)
		if iu == nil {
			t.Fatalf("channel ended without SRP_T_LOGOUT (want reason %v)", want)
		}
		if srp.Op(iu) != srp.OpTLogout {
			continue
		}
		var lo srp.TLogout
		if err := lo.Decode(iu); err != nil || lo.Reason != want {
			t.Fatalf("SRP_T_LOGOUT %+v %v, want reason %v", lo, err, want)
		}
		select {
		case <-r.qp.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("channel not closed after SRP_T_LOGOUT")
		}
		return
	}
}

// good is a well-behaved initiator running beside the hostile one.
func good(t *testing.T, addr string) *srpinitiator.Device {
	t.Helper()
	d, err := srpinitiator.Open(context.Background(), "srp://"+addr+"/0011223344556677/0", srpinitiator.Options{Fabric: siw.New(siw.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func checkGood(t *testing.T, d *srpinitiator.Device) {
	t.Helper()
	want := bytes.Repeat([]byte("blockwire"), 456)[:4096]
	if _, err := d.WriteAt(want, 8192); err != nil {
		t.Fatalf("well-behaved channel: %v", err)
	}
	got := make([]byte, 4096)
	if _, err := d.ReadAt(got, 8192); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("well-behaved channel read back: %v", err)
	}
}

func TestMalformedIUsLogOut(t *testing.T) {
	addr, _, _ := start(t, 0)
	d := good(t, addr)
	tur := srp.Cmd{Tag: 1, CDB: []byte{scsi.OpTestUnitReady}}
	turIU, _ := tur.Append(nil, 0)
	for _, tc := range []struct {
		name string
		iu   []byte
		want srp.LogoutReason
	}{
		{"truncated SRP_CMD", turIU[:30], srp.LogoutInvalidIULength},
		{"unknown IU type", append([]byte{0x55}, make([]byte, 15)...), srp.LogoutInvalidIUType},
		{"descriptor past the IU", func() []byte { b := append([]byte(nil), turIU...); b[5] = 0x01; return b }(), srp.LogoutInvalidIULength},
		{"data-in format 7", func() []byte { b := append([]byte(nil), turIU...); b[5] = 0x07; return b }(), srp.LogoutDataInFormat},
		{"immediate data past the IU", func() []byte {
			c := srp.Cmd{Tag: 2, CDB: []byte{scsi.OpWrite10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, Out: srp.Immediate(make([]byte, 512))}
			b, _ := c.Append(nil, 68)
			return b[:300]
		}(), srp.LogoutInvalidIULength},
		{"SRP_AER_RSP without a request", srp.AppendAerRsp(nil, 9), srp.LogoutSpuriousResponse},
		{"SRP_LOGIN_REQ on a live channel", (&srp.LoginReq{MaxITIULen: 64}).Append(nil), srp.LogoutInvalidIUType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := dialRaw(t, addr)
			r.send(t, tc.iu)
			r.expectLogout(t, tc.want)
			checkGood(t, d)
		})
	}
}

// TestDescriptorOutsideRegisteredMemory: the target's RDMA Read of a
// descriptor the initiator never registered fails at the initiator's
// RDMA layer (Terminate); that channel ends, the others go on.
func TestDescriptorOutsideRegisteredMemory(t *testing.T) {
	addr, srv, _ := start(t, 0)
	d := good(t, addr)
	r := dialRaw(t, addr)
	c := srp.Cmd{Tag: 1, CDB: []byte{scsi.OpWrite10, 0, 0, 0, 0, 0, 0, 0, 8, 0},
		Out: srp.Direct(srp.Desc{VA: 0x1000, Key: 0x00abcd00, Len: 4096})}
	iu, _ := c.Append(nil, 0)
	r.send(t, iu)
	select {
	case <-r.qp.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("channel survived a descriptor outside registered memory")
	}
	var te *rdma.TerminateError
	if err := r.qp.Err(); !errors.As(err, &te) {
		t.Logf("raw channel ended with %v", err)
	}
	checkGood(t, d)
	deadline := time.Now().Add(5 * time.Second)
	for srv.Channels() != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := srv.Channels(); n != 1 {
		t.Fatalf("%d channels, want the well-behaved one only", n)
	}
}

// TestCreditOverrun: an IU beyond the request limit logs the channel out.
func TestCreditOverrun(t *testing.T) {
	addr, _, g := start(t, 1)
	gate := make(chan struct{})
	g.gate.Store(&gate)
	r := dialRaw(t, addr)
	if r.rsp.ReqLimDelta != 1 {
		t.Fatalf("granted %d credits, want 1", r.rsp.ReqLimDelta)
	}
	// The unit attention of the new nexus comes first (its response
	// returns the credit).
	tur := srp.Cmd{Tag: 9, CDB: []byte{scsi.OpTestUnitReady}}
	iu, _ := tur.Append(nil, 0)
	r.send(t, iu)
	var rsp srp.Rsp
	if err := rsp.Decode(r.next(t)); err != nil || rsp.ReqLimDelta != 1 {
		t.Fatalf("TUR: %+v %v", rsp, err)
	}
	for tag := uint64(1); tag <= 2; tag++ {
		c := srp.Cmd{Tag: tag, CDB: []byte{scsi.OpWrite10, 0, 0, 0, 0, 0, 0, 0, 1, 0}, Out: srp.Immediate(make([]byte, 512))}
		iu, _ := c.Append(nil, 68)
		r.send(t, iu)
		if tag == 1 {
			<-g.inside // the first write holds its credit in the backend
		}
	}
	r.expectLogout(t, srp.LogoutNoReason)
	g.gate.Store(nil)
	close(gate)
}

// TestAbortTask: a command stuck in the backend is aborted by the
// initiator when its context ends (SRP_TSK_MGMT ABORT TASK); the channel
// stays usable and keeps its credits.
func TestAbortTask(t *testing.T) {
	addr, _, g := start(t, 3) // the initiator keeps one credit for task management
	d := good(t, addr)
	checkGood(t, d) // clears the unit attention
	gate := make(chan struct{})
	g.gate.Store(&gate)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := d.WriteAtContext(ctx, make([]byte, 4096), 0)
		errc <- err
	}()
	<-g.inside
	cancel()
	time.Sleep(100 * time.Millisecond) // ABORT TASK waits for the task to leave the backend
	g.gate.Store(nil)
	close(gate)
	if err := <-errc; err != context.Canceled { // not wrapped: the ABORT TASK succeeded
		t.Fatalf("aborted write: %v", err)
	}
	for i := 0; i < 10; i++ { // more commands than credits: the aborted one's came back
		checkGood(t, d)
	}
}

// TestIndirectTables: data spread over three descriptors, as an indirect
// buffer whose table is only partly in the IU (one of three), so the
// target fetches the table by RDMA Read (SRP r16a) — for a write and for
// a read back; then the same with the whole table in the IU.
func TestIndirectTables(t *testing.T) {
	addr, _, _ := start(t, 0)
	r := dialRaw(t, addr)
	data := make([]byte, 3*4096)
	for i := range data {
		data[i] = byte(i * 7)
	}
	back := make([]byte, len(data))
	const base = 0x7f5500000000
	src, err := r.pd.Register(data, base, rdma.RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := r.pd.Register(back, base+0x100000, rdma.RemoteWrite|rdma.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	// Pieces out of order in memory: 4 KiB at +8K, +0, +4K.
	descs := func(mr *rdma.MR, va uint64) []srp.Desc {
		return []srp.Desc{{VA: va + 8192, Key: mr.STag(), Len: 4096}, {VA: va, Key: mr.STag(), Len: 4096}, {VA: va + 4096, Key: mr.STag(), Len: 4096}}
	}
	tables := make([]byte, 2*48)
	for i, d := range descs(src, base) {
		putDesc(tables[i*16:], d)
	}
	for i, d := range descs(dst, base+0x100000) {
		putDesc(tables[48+i*16:], d)
	}
	tmr, err := r.pd.Register(tables, base+0x200000, rdma.RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	tur := srp.Cmd{Tag: 1, CDB: []byte{scsi.OpTestUnitReady}}
	iu, _ := tur.Append(nil, 0)
	r.send(t, iu)
	r.next(t) // the unit attention
	do := func(tag uint64, c srp.Cmd) srp.Rsp {
		t.Helper()
		c.Tag = tag
		iu, err := c.Append(nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		r.send(t, iu)
		var rsp srp.Rsp
		if err := rsp.Decode(r.next(t)); err != nil || rsp.Tag != tag || rsp.Status != 0 {
			t.Fatalf("tag %d: %+v %v", tag, rsp, err)
		}
		return rsp
	}
	for _, external := range []bool{true, false} {
		clear(back)
		out := srp.Indirect(srp.Desc{VA: base + 0x200000, Key: tmr.STag(), Len: 48}, descs(src, base))
		in := srp.Indirect(srp.Desc{VA: base + 0x200030, Key: tmr.STag(), Len: 48}, descs(dst, base+0x100000))
		if external {
			out = srp.Indirect(srp.Desc{VA: base + 0x200000, Key: tmr.STag(), Len: 48}, descs(src, base)[:1])
			out.Total = 3 * 4096
			in = srp.Indirect(srp.Desc{VA: base + 0x200030, Key: tmr.STag(), Len: 48}, descs(dst, base+0x100000)[:1])
			in.Total = 3 * 4096
			if !out.External() || !in.External() {
				t.Fatal("tables not external")
			}
		}
		do(2, srp.Cmd{CDB: []byte{scsi.OpWrite10, 0, 0, 0, 0, 64, 0, 0, 24, 0}, Out: out})
		do(3, srp.Cmd{CDB: []byte{scsi.OpRead10, 0, 0, 0, 0, 64, 0, 0, 24, 0}, In: in})
		// The device holds the pieces in descriptor order; reading them
		// back through the same descriptors restores the memory layout.
		if !bytes.Equal(back, data) {
			t.Fatalf("external %v: data differs", external)
		}
	}
}

func putDesc(p []byte, d srp.Desc) {
	for i := 0; i < 8; i++ {
		p[i] = byte(d.VA >> (56 - 8*i))
	}
	for i := 0; i < 4; i++ {
		p[8+i] = byte(d.Key >> (24 - 8*i))
		p[12+i] = byte(d.Len >> (24 - 8*i))
	}
}

// TestIOBudgetPerNexus: writes stuck in a slow backend hold their buffers;
// once the nexus holds its share of the I/O budget, further commands get
// TASK SET FULL at once instead of more memory, and the node's total stays
// within the budget; when the backend moves on, everything completes
// (every SRP command took its whole buffer on arrival).
func TestIOBudgetPerNexus(t *testing.T) {
	budget := blockcore.NewIOBudget(64<<20, 8<<20)
	addr, _, g := startBudget(t, 32, budget)
	d := good(t, addr)
	checkGood(t, d)
	gate := make(chan struct{})
	g.gate.Store(&gate)
	// 512 KiB writes (the initiator's largest command): 16 fill the
	// share.
	const n, fit = 24, 16
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := d.WriteAt(make([]byte, 512<<10), int64(i%16)*(512<<10))
			errs <- err
		}()
	}
	full := 0
	deadline := time.After(10 * time.Second)
	for full < n-fit {
		select {
		case err := <-errs:
			var se *blockdev.SCSIError
			if !errors.As(err, &se) || se.Status != scsi.StatusTaskSetFull {
				t.Fatalf("a command over the nexus's share: %v, want TASK SET FULL", err)
			}
			full++
		case <-deadline:
			t.Fatalf("%d TASK SET FULL after 10 s, want %d; budget used %d", full, n-fit, budget.Used())
		}
	}
	if used := budget.Used(); used > 8<<20 {
		t.Fatalf("budget used %d with the share at 8 MiB", used)
	}
	t.Logf("%d writes of 512 KiB held in the backend: %d MiB of the 8 MiB share; %d commands answered TASK SET FULL", fit, budget.Used()>>20, full)
	g.gate.Store(nil)
	close(gate)
	for range fit {
		if err := <-errs; err != nil {
			t.Fatalf("admitted write: %v", err)
		}
	}
	// A task gives its budget back when its response's send completes,
	// a moment after the initiator has the response.
	for deadline := time.Now().Add(2 * time.Second); budget.Used() != 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if budget.Used() != 0 {
		t.Fatalf("budget still holds %d bytes", budget.Used())
	}
	checkGood(t, d)
}

// TestChannelsPerSource: one address may hold only so many RDMA channels,
// so that one initiator host cannot take all MaxChannels and lock the
// others out. Beyond it a login is rejected with the channel limit's
// reason; another address still logs in, and a channel that ends frees
// its place.
func TestChannelsPerSource(t *testing.T) {
	addr, srv, _ := startWith(t, srptarget.Options{MaxChannelsPerSource: 2})
	first := dialRaw(t, addr)
	dialRaw(t, addr)
	_, err := dialRawFrom(t, "127.0.0.1", addr)
	var rj *rdma.RejectError
	var rej srp.LoginRej
	if !errors.As(err, &rj) || rej.Decode(rj.PrivateData) != nil || rej.Reason != srp.RejectChannelLimit {
		t.Fatalf("a third channel from one address: %v, want SRP_LOGIN_REJ with the channel limit reason", err)
	}
	if h := srv.BoundsHit(); h["channels_per_source"] != 1 || h["channels"] != 0 {
		t.Fatalf("bounds hit %v, want one login rejected for channels_per_source", h)
	}
	if _, err := dialRawFrom(t, "127.0.0.2", addr); err != nil {
		t.Fatalf("a channel from another address: %v", err)
	}
	// The target counts a channel once its accept returns, a moment
	// after the initiator's connect does.
	waitChannels := func(n int) {
		t.Helper()
		waitfor.True(t, 5*time.Second, func() bool { return srv.Channels() == n }, func() string { return fmt.Sprintf("%d channels, want %d", srv.Channels(), n) })
	}
	waitChannels(3)
	first.qp.Close()
	waitChannels(2)
	if _, err := dialRawFrom(t, "127.0.0.1", addr); err != nil {
		t.Fatalf("a channel after one from the address ended: %v", err)
	}
}

// TestTaskManagementLogIsBounded: task management functions are logged at
// Info, the first 16 of a channel and then one in 1024, so an initiator
// sending them in a loop does not flood the log.
func TestTaskManagementLogIsBounded(t *testing.T) {
	var logs servetest.LogBuffer
	addr, _, _ := startWith(t, srptarget.Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	r := dialRaw(t, addr)
	const n = 3000
	for i := range n {
		tm := srp.TskMgmt{Tag: uint64(i), Function: srp.TMFAbortTask, TaskTag: 1 << 40}
		r.send(t, tm.Append(nil))
		for {
			var rsp srp.Rsp
			if rsp.Decode(r.next(t)) == nil && rsp.Tag == uint64(i) {
				break
			}
		}
	}
	lines := strings.Count(logs.String(), `msg="srp: task management"`)
	if lines < 16 || lines > 16+n/1024 {
		t.Fatalf("%d task management functions logged %d lines, want 16 to %d", n, lines, 16+n/1024)
	}
}

// TestLogoutAwaitsAResentSend: a channel the target logs out closes once
// its SRP_T_LOGOUT has been sent — also when that takes a retransmission
// (1.5 s here), so the initiator learns why the channel ends. (It closed
// after a second before: the channel ended with no SRP_T_LOGOUT.)
func TestLogoutAwaitsAResentSend(t *testing.T) {
	addr, _, _ := startServing(t, srptarget.Options{}, func(ln rdma.Listener) rdma.Listener {
		return servetest.LateListener{Listener: ln, Delay: 1500 * time.Millisecond}
	})
	r := dialRaw(t, addr)
	start := time.Now()
	r.send(t, append([]byte{0x55}, make([]byte, 15)...))
	r.expectLogout(t, srp.LogoutInvalidIUType)
	if d := time.Since(start); d < time.Second {
		t.Fatalf("SRP_T_LOGOUT after %v, before the delayed send", d)
	}
}
