package srpinitiator

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/blockdev"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/siw"
	"github.com/blockwire/blockwire/scsi"
	"github.com/blockwire/blockwire/scsitarget"
	"github.com/blockwire/blockwire/srp"
	"github.com/blockwire/blockwire/srp/srptarget"
)

const idExt = 0xc8995efffe09646d

// startTarget serves a 64 MiB memory LUN 0 over SRP on a loopback
// iWARP listener and returns its address and the server.
func startTarget(t testing.TB, mod func(*srptarget.Options)) (string, *srptarget.Server) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dev := scsitarget.NewDevice("iqn.2026-11.org.blockwire:srp-test", log)
	m, _ := mem.New(64 << 20)
	lu, err := scsitarget.NewLU(dev.Name(), scsitarget.LUConfig{Backend: m})
	if err != nil {
		t.Fatal(err)
	}
	dev.AddLU(lu)
	opts := srptarget.Options{PD: rdma.NewDevice("srpt").AllocPD(), Device: dev, IDExt: idExt, IOCGUID: idExt, Logger: log}
	if mod != nil {
		mod(&opts)
	}
	srv := srptarget.New(opts)
	ln, err := siw.New(siw.Options{Logger: log}).Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), srv
}

func opts() Options {
	return Options{Fabric: siw.New(siw.Options{})}
}

func srpURL(addr string) string { return "srp://" + addr + "/c8995efffe09646d/0" }

func TestReadWriteVerify(t *testing.T) {
	addr, _ := startTarget(t, nil)
	ctx := context.Background()
	for _, noImm := range []bool{false, true} {
		o := opts()
		o.NoImmediate = noImm
		d, err := Open(ctx, srpURL(addr), o)
		if err != nil {
			t.Fatal(err)
		}
		if d.Size() != 64<<20 || d.BlockSize() != 512 {
			t.Fatalf("size %d block %d", d.Size(), d.BlockSize())
		}
		// Sizes around the immediate-data limit and above the per-command
		// maximum (split into several commands).
		for _, n := range []int{512, 4096, 8192, 8704, 128 << 10, 1536 << 10} {
			want := make([]byte, n)
			rand.Read(want)
			off := int64(n) * 3
			if _, err := d.WriteAtContext(ctx, want, off); err != nil {
				t.Fatalf("write %d (immediate %v): %v", n, !noImm, err)
			}
			got := make([]byte, n)
			if _, err := d.ReadAtContext(ctx, got, off); err != nil {
				t.Fatalf("read %d: %v", n, err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%d bytes read back differ (immediate %v)", n, !noImm)
			}
		}
		if err := d.Flush(); err != nil {
			t.Fatal(err)
		}
		d.Close()
	}
}

func TestConcurrentBeyondCredits(t *testing.T) {
	addr, srv := startTarget(t, func(o *srptarget.Options) { o.Credits = 4 })
	ctx := context.Background()
	d, err := Open(ctx, srpURL(addr), opts())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			chk := make([]byte, 4096)
			for i := 0; i < 50; i++ {
				off := int64((w*50+i)%4096) * 4096
				for j := range buf {
					buf[j] = byte(w + i + j)
				}
				if _, err := d.WriteAtContext(ctx, buf, off); err != nil {
					errs <- err
					return
				}
				if _, err := d.ReadAtContext(ctx, chk, off); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(buf, chk) {
					errs <- errors.New("mismatch")
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if srv.Channels() != 1 {
		t.Fatalf("%d channels", srv.Channels())
	}
}

func TestSCSIErrorsAndResiduals(t *testing.T) {
	addr, _ := startTarget(t, nil)
	ctx := context.Background()
	d, err := Open(ctx, srpURL(addr), opts())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// READ beyond the end: CHECK CONDITION, LBA out of range, with sense.
	cdb := []byte{scsi.OpRead16, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 1, 0, 0}
	_, err = d.Do(ctx, cdb, nil, make([]byte, 512))
	var se *blockdev.SCSIError
	if !errors.As(err, &se) || se.Status != scsi.StatusCheckCondition || se.Sense == nil || se.Sense.ASC != 0x21 {
		t.Fatalf("read past the end: %v", err)
	}
	// INQUIRY with a 255-byte buffer: underflow residual.
	buf := make([]byte, 255)
	r, err := d.Do(ctx, []byte{scsi.OpInquiry, 0, 0, 0, 255, 0}, nil, buf)
	if err != nil || r.Residual <= 0 || r.In != 255-r.Residual || r.In < 36 {
		t.Fatalf("INQUIRY: %+v %v", r, err)
	}
	// A CDB asking for more than the buffer: overflow.
	r, err = d.Do(ctx, []byte{scsi.OpRead16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0}, nil, make([]byte, 512))
	if err != nil || r.Residual != -512 {
		t.Fatalf("overflow: %+v %v", r, err)
	}
	// LUN 3 does not exist.
	_, err = d.Channel().Do(ctx, 3, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil, nil)
	if !errors.As(err, &se) || se.Sense == nil || se.Sense.ASC != 0x25 {
		t.Fatalf("LUN 3: %v", err)
	}
}

func TestLoginRejects(t *testing.T) {
	addr, _ := startTarget(t, func(o *srptarget.Options) {
		o.MaxChannels = 1
		o.Allow = func(p srp.PortID, _ net.Addr) bool { _, lo := p.Halves(); return lo != 0xbad }
	})
	ctx := context.Background()
	reason := func(err error) srp.RejectReason {
		var rej *srp.LoginRej
		if !errors.As(err, &rej) {
			t.Fatalf("not a login reject: %v", err)
		}
		return rej.Reason
	}
	_, err := Dial(ctx, addr, srp.MakePortID(1, 2), opts())
	if r := reason(err); r != srp.RejectAssociate {
		t.Fatalf("wrong target port: %v", r)
	}
	o := opts()
	o.Initiator = srp.MakePortID(0, 0xbad)
	_, err = Dial(ctx, addr, srp.MakePortID(idExt, idExt), o)
	if r := reason(err); r != srp.RejectAssociate {
		t.Fatalf("initiator not admitted: %v", r)
	}
	o = opts()
	o.MaxITIULen = 32
	_, err = Dial(ctx, addr, srp.MakePortID(idExt, idExt), o)
	if r := reason(err); r != srp.RejectITIULen {
		t.Fatalf("IU length 32: %v", r)
	}
	c1, err := Dial(ctx, addr, srp.MakePortID(idExt, idExt), opts())
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	_, err = Dial(ctx, addr, srp.MakePortID(idExt, idExt), opts())
	if r := reason(err); r != srp.RejectChannelLimit {
		t.Fatalf("second channel over the limit of 1: %v", r)
	}
	if _, err := c1.Do(ctx, 0, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil, nil); err != nil && !strings.Contains(err.Error(), "UNIT ATTENTION") {
		var se *blockdev.SCSIError
		if !errors.As(err, &se) {
			t.Fatalf("first channel after the rejects: %v", err)
		}
	}
}

func TestMultiChannelAction(t *testing.T) {
	addr, srv := startTarget(t, nil)
	ctx := context.Background()
	tgt := srp.MakePortID(idExt, idExt)
	o := opts()
	o.Initiator = srp.MakePortID(7, 7)
	o.MultiChannel = srp.MultiChannelMulti
	a, err := Dial(ctx, addr, tgt, o)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Dial(ctx, addr, tgt, o)
	if err != nil {
		t.Fatal(err)
	}
	// Dial returns once the login response arrives; the target registers
	// the channel just after, so give it a moment.
	for deadline := time.Now().Add(5 * time.Second); srv.Channels() != 2 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if srv.Channels() != 2 {
		t.Fatalf("MULTI: %d channels, want 2", srv.Channels())
	}
	// SINGLE logs the nexus's other channels out with SRP_T_LOGOUT.
	o.MultiChannel = srp.MultiChannelSingle
	c, err := Dial(ctx, addr, tgt, o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, old := range []*Channel{a, b} {
		select {
		case <-old.done:
			if !strings.Contains(old.err.Error(), "multi-channel") {
				t.Fatalf("old channel ended with %v", old.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("old channel still up after a SINGLE login")
		}
		old.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for srv.Channels() != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if srv.Channels() != 1 {
		t.Fatalf("%d channels after SINGLE", srv.Channels())
	}
	if _, err := c.Do(ctx, 0, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil, nil); err != nil {
		var se *blockdev.SCSIError
		if !errors.As(err, &se) || se.Sense == nil || se.Sense.Key != scsi.SenseUnitAttention {
			t.Fatalf("new channel: %v", err)
		}
	}
}

// TestAsyncEvent: a capacity change reaches the initiator as SRP_AER_REQ
// (and it answers SRP_AER_RSP: the channel carries on); the unit
// attention is also there for the next command.
func TestAsyncEvent(t *testing.T) {
	var lu *scsitarget.LU
	addr, _ := startTarget(t, func(o *srptarget.Options) { lu = o.Device.LU(0) })
	events := make(chan *scsi.Sense, 4)
	o := opts()
	o.OnEvent = func(lun uint64, s *scsi.Sense) {
		if lun == 0 {
			events <- s
		}
	}
	d, err := Open(context.Background(), srpURL(addr), o)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := lu.Resize(96 << 20); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-events:
		if s.Key != scsi.SenseUnitAttention || s.ASC != 0x2a || s.ASCQ != 0x09 {
			t.Fatalf("event %v, want CAPACITY DATA HAS CHANGED", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no SRP_AER_REQ after a resize")
	}
	// The unit attention is also reported by CHECK CONDITION (blockdev
	// retries it); once it is consumed, a second change makes a second
	// event: the first AER_RSP was taken (a spurious one would have
	// logged the channel out).
	buf := make([]byte, 512)
	if _, err := d.ReadAt(buf, 0); err != nil {
		t.Fatalf("channel after the event: %v", err)
	}
	if err := lu.Resize(128 << 20); err != nil {
		t.Fatal(err)
	}
	select {
	case <-events:
	case <-time.After(5 * time.Second):
		t.Fatal("no second SRP_AER_REQ")
	}
	if _, err := d.ReadAt(buf, 0); err != nil {
		t.Fatalf("channel after the events: %v", err)
	}
}

func TestServerCloseLogsOut(t *testing.T) {
	addr, srv := startTarget(t, nil)
	c, err := Dial(context.Background(), addr, srp.MakePortID(idExt, idExt), opts())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv.Close()
	select {
	case <-c.done:
		if !strings.Contains(c.err.Error(), "target logout") {
			t.Fatalf("channel ended with %v", c.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("channel still up after the server closed")
	}
}

// FuzzParseURL: a URL it accepts names a host:port and a LUN SRP can
// address (below 2^14).
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"srp://127.0.0.1/c8995efffe09646d/0", "srp://[::1]:5555/0xc8995efffe09646d:0x0002c90300b10c6b/3",
		"srp://h/1:2/16384", "srp://h:1/a/0?initiator=1:2", "srp://h/a/0?x=1", "srp:///a/0", "iscsi://h/a/0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseURL(s)
		if err != nil {
			return
		}
		if h, _, err := net.SplitHostPort(u.Addr); err != nil || h == "" {
			t.Fatalf("ParseURL(%q): address %q: %v", s, u.Addr, err)
		}
		if u.LUN >= 1<<14 {
			t.Fatalf("ParseURL(%q): LUN %d", s, u.LUN)
		}
	})
}
