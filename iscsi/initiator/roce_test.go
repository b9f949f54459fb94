package initiator

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/datamover/iser"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/internal/servetest"
	"github.com/blockwire/blockwire/iscsi/iscsitarget"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/roce"
	"github.com/blockwire/blockwire/scsitarget"
)

// iSER over the software RoCEv2 device: the connection made with the
// InfiniBand CM over UDP (REQ with the RDMA/CM header and the iSER CM
// header, REP, RTU), login in RC SENDs, data by RDMA WRITE and READ in
// 1024-byte packets — the same SCSI workload as over TCP and iWARP.
func TestISEROverRoCE(t *testing.T) {
	idev, _ := serveISEROverRoCE(t, 24791, scsitarget.LUConfig{})

	ctx := context.Background()
	d, err := Open(ctx, fmt.Sprintf("iser://127.0.0.2:3260/%s/0", tIQN), Options{Dialer: &fabric.Dialer{RDMA: idev}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if tr := d.s.links[0].dm.(*iser.Conn).Transport(); tr != "roce" {
		t.Fatalf("transport %q", tr)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for _, n := range []int{512, 4096, 65536, 300 << 10} {
				data := make([]byte, n)
				rand.Read(data)
				off := int64(g) * (1 << 20)
				if _, err := d.WriteAt(data, off); err != nil {
					errs <- fmt.Errorf("write %d: %w", n, err)
					return
				}
				back := make([]byte, n)
				if _, err := d.ReadAt(back, off); err != nil {
					errs <- fmt.Errorf("read %d: %w", n, err)
					return
				}
				if !bytes.Equal(back, data) {
					errs <- fmt.Errorf("%d bytes at %d: read back differs", n, off)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// The iSER-on-InfiniBand draft part III on InfiniBand: with a preference set, the REQ goes to
// the iSER-on-InfiniBand draft's iSER service ID (base 0x20000 + port) with the seed's private
// data; a node of the wrong kind refuses with REJ 28 and its reason in the
// ARI; a node with no iSER service answers REJ 8, and the initiator falls
// back to iSCSI/TCP on the same address.
func TestPreferFallbackOverRoCE(t *testing.T) {
	const port = 24792
	idev, err := roce.Open("127.0.0.9", roce.Options{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer idev.Close()
	node := func(ip string, opts iscsitarget.Options, iserOn bool) string {
		srv := newTargetServer(t, scsitarget.LUConfig{}, nil, opts)
		l, err := net.Listen("tcp", ip+":0")
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(fabric.TCP(l))
		d, err := roce.Open(ip, roce.Options{Port: port})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		if iserOn {
			rl, err := d.Listen(l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			go srv.Serve(fabric.ISER(rl, d.RDMA().AllocPD(), iser.Options{}))
		}
		return l.Addr().String()
	}
	endNode := node("127.0.0.6", iscsitarget.Options{EndNode: true}, true)
	gateway := node("127.0.0.7", iscsitarget.Options{Gateway: true}, true)
	tcpOnly := node("127.0.0.8", iscsitarget.Options{}, false)
	for _, tc := range []preferCase{
		{"direct to an end node", endNode, "direct", true, iser.PreferEndNode, ""},
		{"direct to a gateway", gateway, "direct", true, iser.PreferGateway, "rejected: iSER: this node is a gateway; an end node only was asked"},
		{"gateway to an end node", endNode, "gateway", true, iser.PreferEndNode, "rejected: iSER: this node is an end node; a gateway only was asked"},
		{"direct without iSER", tcpOnly, "direct", false, 0, "reason 8"},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, idev, "roce") })
	}
}

// A peer that stops taking messages holds few of an LU's workers: an
// iSER initiator that posts few receive buffers and then stops reading
// its completions makes every later Send of the target wait on RNR NAKs,
// which a RoCE device retries for ever (RNR retry count 7). A worker
// answering a READ waits for its Send to complete, so each of that
// peer's commands would hold one of the LU's 64 workers until the
// target's NOP-In timed out (25 s): the other initiators of the LU would
// wait as long. Once such a connection holds maxWorking workers, its
// further commands wait for one of them (iscsi/iscsitarget conn.toWorker), on
// iSER as on TCP;
// and a worker whose command waits only for its answer to be taken is
// counted out of the LU's workers (scsitarget.LU.Detach), so even an LU
// with fewer workers than that bound keeps serving the others.
func TestISERPeerThatStopsReceivingHoldsFewWorkers(t *testing.T) {
	t.Run("64 workers", func(t *testing.T) { testStalledISERPeer(t, 24793, scsitarget.LUConfig{}) })
	t.Run("8 workers", func(t *testing.T) { testStalledISERPeer(t, 24794, scsitarget.LUConfig{Workers: 8}) })
}

func testStalledISERPeer(t *testing.T, port int, lc scsitarget.LUConfig) {
	idev, lu := serveISEROverRoCE(t, port, lc)
	url := fmt.Sprintf("iser://127.0.0.2:3260/%s/0", tIQN)

	ctx := context.Background()
	sd := &stallDialer{dev: idev, pd: idev.RDMA().AllocPD(), gate: make(chan struct{})}
	hostile, err := Open(ctx, url, Options{Dialer: sd})
	if err != nil {
		t.Fatal(err)
	}
	sd.stalled.Store(true)
	var wg sync.WaitGroup
	defer func() {
		close(sd.gate) // reading again: everything drains
		wg.Wait()
		hostile.Close()
	}()
	const cmds = 100
	var finished atomic.Int32
	for i := range cmds {
		wg.Go(func() {
			buf := make([]byte, 4096)
			hostile.ReadAt(buf, int64(i)*4096)
			finished.Add(1)
		})
	}
	time.Sleep(500 * time.Millisecond) // the target's sends stall
	// The connection holds at most 33 answers (iscsi/iscsitarget maxWorking
	// + 1): its receiver stops reading the other commands.
	if n := lu.Detached(); n < 8 || n > 33 {
		t.Fatalf("%d answers wait for the stalled peer, want 8 to 33", n)
	}

	// A well-behaved initiator of the same LU: its login's commands
	// (INQUIRY, READ CAPACITY) and 32 reads.
	servetest.ReadsWithin(t, 5*time.Second, 32, func() (servetest.Disk, error) {
		return Open(ctx, url, Options{Dialer: &fabric.Dialer{RDMA: idev}})
	}, "a well-behaved initiator waits behind a peer that stopped receiving")
	if n := finished.Load(); n != 0 {
		t.Fatalf("%d of the stalled peer's reads finished: it was not stalled", n)
	}
}

// serveISEROverRoCE serves tIQN (one LU as lc says) over iSER on a
// software RoCEv2 device on 127.0.0.2:3260 and returns the initiators'
// device on 127.0.0.1 (both on UDP port port, closed when the test ends)
// and the LU.
func serveISEROverRoCE(t *testing.T, port int, lc scsitarget.LUConfig) (*roce.Device, *scsitarget.LU) {
	t.Helper()
	idev, lu, _ := serveISEROverRoCEServer(t, port, lc)
	return idev, lu
}

// serveISEROverRoCEServer is serveISEROverRoCE that returns the server too.
func serveISEROverRoCEServer(t *testing.T, port int, lc scsitarget.LUConfig) (*roce.Device, *scsitarget.LU, *iscsitarget.Server) {
	t.Helper()
	tdev, err := roce.Open("127.0.0.2", roce.Options{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tdev.Close() })
	idev, err := roce.Open("127.0.0.1", roce.Options{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idev.Close() })
	var lu *scsitarget.LU
	srv := newTargetServer(t, lc, func(tg *iscsitarget.Target) { lu = tg.Device.LU(0) }, iscsitarget.Options{})
	ln, err := tdev.Listen("127.0.0.2:3260")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(fabric.ISER(ln, tdev.RDMA().AllocPD(), iser.Options{}))
	return idev, lu, srv
}

// stallDialer dials iSER over a RoCE device with 8 receive buffers and
// wraps the connection so that, once stalled is set, its receiving
// goroutine blocks until gate closes: no buffer is posted again meanwhile.
type stallDialer struct {
	dev     *roce.Device
	pd      *rdma.PD
	stalled atomic.Bool
	gate    chan struct{}
}

func (d *stallDialer) Dial(ctx context.Context, portal string, p datamover.DialParams) (*datamover.Established, error) {
	res := iser.Prepare(d.pd, iser.Options{Initiator: true, Recvs: 8})
	hdr := iser.CMHeader{ZBVANotSupported: true}
	qp, reply, err := d.dev.Dial(ctx, portal, res.ConnParams(hdr.Append(nil)))
	if err != nil {
		return nil, err
	}
	peer := iser.DecodeCMHeader(reply)
	return &datamover.Established{Open: func(st datamover.Stamper) datamover.Conn {
		return &stallConn{Conn: res.Attach(qp, peer, st), d: d}
	}, Kind: datamover.KindISER, Close: func() { qp.Close() }}, nil
}

type stallConn struct {
	*iser.Conn
	d *stallDialer
}

func (c *stallConn) Serve(up datamover.Upcalls) { c.Conn.Serve(stallUpcalls{up, c.d}) }

type stallUpcalls struct {
	datamover.Upcalls
	d *stallDialer
}

func (u stallUpcalls) ControlNotify(p *datamover.PDU) error {
	if u.d.stalled.Load() {
		<-u.d.gate
	}
	return u.Upcalls.ControlNotify(p)
}
