package iscsitarget

import (
	"bufio"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/iscsi/text"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/siw"
	"github.com/blockwire/blockwire/scsi"
	"github.com/blockwire/blockwire/scsitarget"
)

// This file holds a minimal raw-PDU initiator for protocol tests: it can
// send exactly the (mis)behaviour a test needs. Interoperability with real
// initiators is tested in test/interop.

const testIQN = "iqn.2026-11.org.blockwire:unit"

type testServer struct {
	srv   *Server
	addr  string
	dev   *scsitarget.Device
	l     net.Listener
	pipes *pipeListener // startBubbleServer's: what ts.dial connects through
}

func startServer(t testing.TB, opts Options, mod func(*Target)) *testServer {
	t.Helper()
	return startServerLog(t, opts, mod, os.Stderr)
}

// startServerLog starts a server whose log goes to w.
func startServerLog(t testing.TB, opts Options, mod func(*Target), w io.Writer) *testServer {
	t.Helper()
	return startServerOn(t, opts, mod, w, fabric.TCP)
}

// sharedPortal is the acceptor blockwire serve puts on each iSCSI portal
// by default: iSCSI/TCP and iSER over software iWARP on one port.
func sharedPortal(l net.Listener) datamover.Acceptor {
	return fabric.Portal(l, fabric.ISERPortal{IWARP: siw.New(siw.Options{}), PD: rdma.NewDevice("target").AllocPD()})
}

// startServerOn starts a server whose log goes to w, taking connections
// through the acceptor accept builds.
func startServerOn[A datamover.Acceptor](t testing.TB, opts Options, mod func(*Target), w io.Writer, accept func(net.Listener) A) *testServer {
	t.Helper()
	lvl := slog.LevelWarn
	if os.Getenv("BLOCKWIRE_TEST_DEBUG") != "" {
		lvl = slog.LevelDebug
	}
	return startServerAt(t, opts, mod, w, accept, lvl)
}

// startServerAt is startServerOn logging from level lvl up.
func startServerAt[A datamover.Acceptor](t testing.TB, opts Options, mod func(*Target), w io.Writer, accept func(net.Listener) A, lvl slog.Level) *testServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, opts, mod, w, lvl, accept(l), l, nil)
}

// startBubbleServer starts a server in the caller's synctest bubble: its
// connections are in-memory pipes (ts.dial), so that every wait of the
// target's — login timeout, NOP interval and timeout, idle discovery — is
// on the bubble's clock and a test of them takes no time.
func startBubbleServer(t *testing.T, opts Options) *testServer {
	t.Helper()
	l := newPipeListener()
	return serveOn(t, opts, nil, os.Stderr, slog.LevelWarn, fabric.TCP(l), l, l)
}

// serveOn serves a target with one 16 MiB LU through the acceptor a,
// which takes connections from l.
func serveOn(t testing.TB, opts Options, mod func(*Target), w io.Writer, lvl slog.Level, a datamover.Acceptor, l net.Listener, pipes *pipeListener) *testServer {
	t.Helper()
	log := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: lvl}))
	dev := scsitarget.NewDevice(testIQN, log)
	be, _ := mem.New(16 << 20)
	lu, err := scsitarget.NewLU(testIQN, scsitarget.LUConfig{Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	dev.AddLU(lu)
	srv := NewServer(log, opts)
	tg := &Target{Name: testIQN, Device: dev}
	if mod != nil {
		mod(tg)
	}
	if err := srv.AddTarget(tg); err != nil {
		t.Fatal(err)
	}
	go srv.Serve(a)
	ts := &testServer{srv: srv, addr: l.Addr().String(), dev: dev, l: l, pipes: pipes}
	t.Cleanup(func() {
		ctx, cancel := contextWithTimeout(5 * time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		if pipes != nil {
			dev.Close() // the LU's workers end: a bubble ends with all its goroutines
		}
	})
	return ts
}

// dial connects to the server: through its pipes in a bubble, else TCP.
func (ts *testServer) dial(t testing.TB) *tclient {
	t.Helper()
	if ts.pipes == nil {
		return dial(t, ts.addr)
	}
	nc := ts.pipes.dial()
	t.Cleanup(func() { nc.Close() })
	return &tclient{t: t, nc: nc, r: bufio.NewReader(nc), isid: [6]byte{0x80, 0, 0, 0, 0, 1}, keys: map[string]string{}}
}

// pipeListener hands out the server's ends of in-memory connections
// (net.Pipe, which a synctest bubble's clock and deadlocks govern).
type pipeListener struct {
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// dial returns the client's end of a new connection, once the server
// took the other.
func (l *pipeListener) dial() net.Conn {
	c, s := bufferedPipe()
	select {
	case l.conns <- s:
	case <-l.done:
		s.Close()
	}
	return c
}

// bufferedPipe is net.Pipe with a buffer each way, as a socket has: a
// write returns once its bytes are buffered, not when the other end reads
// them (a target pinging a peer that reads nothing is not held by it).
func bufferedPipe() (client, server net.Conn) {
	client, c2 := net.Pipe()
	s2, server := net.Pipe()
	go pump(c2, s2)
	go pump(s2, c2)
	return client, server
}

// pump copies from one pipe end to another through a buffer of up to
// 256 reads; when either side closes, so does the other.
func pump(from, to net.Conn) {
	q := make(chan []byte, 256)
	go func() {
		for b := range q {
			if _, err := to.Write(b); err != nil {
				from.Close()
			}
		}
		to.Close()
	}()
	for {
		b := make([]byte, 64<<10)
		n, err := from.Read(b)
		if n > 0 {
			q <- b[:n]
		}
		if err != nil {
			close(q)
			return
		}
	}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

type tclient struct {
	t         testing.TB
	nc        net.Conn
	r         *bufio.Reader
	itt       uint32
	cmdSN     uint32
	expStatSN uint32
	isid      [6]byte
	tsih      uint16
	cid       uint16
	keys      map[string]string
	hd, dd    bool
	badDD     bool     // corrupt the next data digest
	pending   *pdu.BHS // a PDU read ahead by a test action
	rerr      error    // why the last recv returned no PDU
	lun       uint64   // the LUN command addresses
}

func dial(t testing.TB, addr string) *tclient {
	t.Helper()
	return dialAt(t, addr, nil)
}

// dialAt is dial from the local address ip (nil: any) — another host,
// to the per-source bounds.
func dialAt(t testing.TB, addr string, ip net.IP) *tclient {
	t.Helper()
	d := net.Dialer{}
	if ip != nil {
		d.LocalAddr = &net.TCPAddr{IP: ip}
	}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &tclient{t: t, nc: nc, r: bufio.NewReader(nc), isid: [6]byte{0x80, 0, 0, 0, 0, 1}, keys: map[string]string{}}
}

func (c *tclient) sendRaw(h *pdu.BHS, ahs, data []byte) {
	c.t.Helper()
	h.SetTotalAHSLength(len(ahs))
	h.SetDataSegmentLength(len(data))
	b := append(append([]byte(nil), h[:]...), ahs...)
	if c.hd {
		var d [4]byte
		pdu.PutDigest(d[:], pdu.Digest(b))
		b = append(b, d[:]...)
	}
	b = append(b, data...)
	b = append(b, pdu.PadFor(len(data))...)
	if c.dd && len(data) > 0 {
		var d [4]byte
		sum := pdu.Digest(data, pdu.PadFor(len(data)))
		if c.badDD {
			sum ^= 1
			c.badDD = false
		}
		pdu.PutDigest(d[:], sum)
		b = append(b, d[:]...)
	}
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// recv reads one PDU; ok is false when the connection ended.
func (c *tclient) recv(timeout time.Duration) (h pdu.BHS, data []byte, ok bool) {
	c.nc.SetReadDeadline(time.Now().Add(timeout))
	if _, c.rerr = io.ReadFull(c.r, h[:]); c.rerr != nil {
		return h, nil, false
	}
	if n := h.TotalAHSLength(); n > 0 {
		io.CopyN(io.Discard, c.r, int64(n))
	}
	if c.hd {
		io.CopyN(io.Discard, c.r, 4)
	}
	n := h.DataSegmentLength()
	data = make([]byte, pdu.PaddedLen(n))
	if _, c.rerr = io.ReadFull(c.r, data); c.rerr != nil {
		return h, nil, false
	}
	if c.dd && n > 0 {
		var d [4]byte
		io.ReadFull(c.r, d[:])
		if pdu.GetDigest(d[:]) != pdu.Digest(data) {
			c.t.Errorf("%s: data digest mismatch from the target", h.Opcode())
		}
	}
	if sn := binary.BigEndian.Uint32(h[24:]); h.Opcode() != pdu.OpR2T && h.Opcode() != pdu.OpDataIn {
		c.expStatSN = sn + 1
	}
	return h, data[:n], true
}

func (c *tclient) must(timeout time.Duration) (pdu.BHS, []byte) {
	c.t.Helper()
	h, d, ok := c.recv(timeout)
	if !ok {
		c.t.Fatal("connection closed while waiting for a PDU")
	}
	return h, d
}

// login performs a one-PDU operational login (or discovery) and returns the
// status.
func (c *tclient) login(kvs ...text.KV) (uint16, map[string]string) {
	c.t.Helper()
	req := pdu.LoginReq{Transit: true, CSG: pdu.StageOperational, NSG: pdu.StageFullFeature, ISID: c.isid, TSIH: c.tsih, ITT: c.itt, CID: c.cid, CmdSN: c.cmdSN}
	c.itt++
	var h pdu.BHS
	req.Encode(&h)
	c.sendRaw(&h, nil, text.Append(nil, kvs...))
	rh, data := c.must(5 * time.Second)
	var resp pdu.LoginResp
	if rh.Opcode() != pdu.OpLoginResp {
		c.t.Fatalf("got %s, want Login Response", rh.Opcode())
	}
	resp.Decode(&rh)
	got := map[string]string{}
	if parsed, err := text.Parse(data); err == nil {
		for _, kv := range parsed {
			got[kv.Key] = kv.Value
		}
	}
	c.keys = got
	c.tsih = resp.TSIH
	return uint16(resp.StatusClass)<<8 | uint16(resp.StatusDetail), got
}

func normalKeys(initiator string, extra ...text.KV) []text.KV {
	return append([]text.KV{
		{Key: "InitiatorName", Value: initiator}, {Key: "TargetName", Value: testIQN},
		{Key: "SessionType", Value: "Normal"}, {Key: "MaxRecvDataSegmentLength", Value: "65536"},
	}, extra...)
}

func (c *tclient) mustLogin(kvs ...text.KV) {
	c.t.Helper()
	if st, _ := c.login(kvs...); st != 0 {
		c.t.Fatalf("login status %04x", st)
	}
}

type result struct {
	status   byte
	sense    []byte
	data     []byte
	residual uint32
	under    bool
	over     bool
	seqs     int // Data-In sequences (PDUs with F)
}

// command runs one SCSI command to completion, answering R2Ts.
func (c *tclient) command(cdb []byte, read bool, edtl uint32, out []byte, immediate int) result {
	c.t.Helper()
	itt := c.itt
	c.itt++
	cmd := pdu.SCSICommand{Final: true, Read: read, Write: out != nil, Attr: pdu.AttrSimple, ITT: itt, EDTL: edtl, CmdSN: c.cmdSN, ExpStatSN: c.expStatSN,
		LUN: scsi.EncodeLUN(c.lun)}
	c.cmdSN++
	copy(cmd.CDB[:], cdb)
	var h pdu.BHS
	cmd.Encode(&h)
	imm := out
	if len(imm) > immediate {
		imm = imm[:immediate]
	}
	c.sendRaw(&h, nil, imm)
	var res result
	for {
		rh, data := c.must(10 * time.Second)
		switch rh.Opcode() {
		case pdu.OpR2T:
			var r pdu.R2T
			r.Decode(&rh)
			sent := uint32(0)
			for sn := uint32(0); sent < r.Desired; sn++ {
				n := min(r.Desired-sent, 8192)
				do := pdu.DataOut{Final: sent+n == r.Desired, ITT: itt, TTT: r.TTT, DataSN: sn, Offset: r.Offset + sent, ExpStatSN: c.expStatSN}
				var dh pdu.BHS
				do.Encode(&dh)
				c.sendRaw(&dh, nil, out[r.Offset+sent:r.Offset+sent+n])
				sent += n
			}
		case pdu.OpDataIn:
			var d pdu.DataIn
			d.Decode(&rh)
			res.data = append(res.data, data...)
			if d.Final {
				res.seqs++
			}
			if d.HasStatus {
				res.status, res.residual, res.under, res.over = d.Status, d.Residual, d.Underflow, d.Overflow
				return res
			}
		case pdu.OpSCSIResponse:
			var r pdu.SCSIResponse
			r.Decode(&rh)
			res.status, res.residual, res.under, res.over = r.Status, r.Residual, r.Underflow, r.Overflow
			if len(data) >= 2 {
				res.sense = data[2 : 2+int(binary.BigEndian.Uint16(data))]
			}
			return res
		case pdu.OpNopIn, pdu.OpAsyncMsg:
		default:
			c.t.Fatalf("unexpected %s while waiting for ITT %#x", rh.Opcode(), itt)
		}
	}
}

func tur() []byte { return []byte{0, 0, 0, 0, 0, 0} }

func read10(lba uint32, blocks uint16) []byte {
	b := []byte{0x28, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[2:], lba)
	binary.BigEndian.PutUint16(b[7:], blocks)
	return b
}

func write10(lba uint32, blocks uint16) []byte {
	b := read10(lba, blocks)
	b[0] = 0x2a
	return b
}
