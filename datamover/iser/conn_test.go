package iser

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/internal/servetest"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/siw"
)

// upcalls records what the datamover delivers.
type upcalls struct {
	mu     sync.Mutex
	pdus   []pdu.Opcode
	ended  chan error
	reads  int
	acks   [][2]uint32
	onAck  func()
	bufFor func(h *pdu.BHS) []byte
	refuse error // ControlNotify's answer to every PDU, once recorded
}

func newUpcalls() *upcalls { return &upcalls{ended: make(chan error, 1)} }

func (u *upcalls) DataBuffer(h *pdu.BHS) ([]byte, error) {
	if u.bufFor != nil {
		return u.bufFor(h), nil
	}
	return nil, nil
}
func (u *upcalls) ControlNotify(p *datamover.PDU) error {
	u.mu.Lock()
	u.pdus = append(u.pdus, p.BHS.Opcode())
	u.mu.Unlock()
	return u.refuse
}
func (u *upcalls) ConnectionTerminateNotify(err error) { u.ended <- err }
func (u *upcalls) DataCompletionNotify(itt, ttt uint32) {
	u.mu.Lock()
	u.reads++
	u.mu.Unlock()
}
func (u *upcalls) DataACKNotify(itt, dataSN uint32) {
	u.mu.Lock()
	u.acks = append(u.acks, [2]uint32{itt, dataSN})
	if u.onAck != nil {
		u.onAck()
	}
	u.mu.Unlock()
}

// rawPeer is the other end of a datamover under test: a bare queue pair
// whose receives land in rcq.
type rawPeer struct {
	bufs [][]byte
	qp   rdma.QP
	pd   *rdma.PD
	rcq  *rdma.CQ
	scq  *rdma.CQ
}

// pair connects a datamover (opt) to a raw peer in memory.
func pair(t *testing.T, opt Options) (*Conn, *rawPeer) {
	t.Helper()
	return pairOn(t, opt, nil)
}

// pairOn is pair with the datamover's queue pair wrapped by wrap (nil:
// as it is).
func pairOn(t *testing.T, opt Options, wrap func(rdma.QP) rdma.QP) (*Conn, *rawPeer) {
	t.Helper()
	dev := rdma.NewDevice("test")
	res := Prepare(dev.AllocPD(), opt)
	peer := &rawPeer{pd: rdma.NewDevice("peer").AllocPD(), rcq: rdma.NewCQ(16), scq: rdma.NewCQ(16)}
	var recvs []rdma.RecvWR
	for i := 0; i < 8; i++ {
		peer.bufs = append(peer.bufs, make([]byte, 9000))
		recvs = append(recvs, rdma.RecvWR{ID: uint64(i), Buf: peer.bufs[i]})
	}
	pp := rdma.ConnParams{PD: peer.pd, QP: rdma.QPConfig{SendCQ: peer.scq, RecvCQ: peer.rcq}, Recvs: recvs}
	qa, qb, err := siw.New(siw.Options{}).Pair(res.ConnParams(nil), pp)
	if err != nil {
		t.Fatal(err)
	}
	peer.qp = qb
	if wrap != nil {
		qa = wrap(qa)
	}
	c := res.Attach(qa, CMHeader{}, nil)
	t.Cleanup(func() { c.ConnectionTerminate(); qb.Close() })
	return c, peer
}

func (p *rawPeer) send(t *testing.T, msg []byte) {
	t.Helper()
	if err := p.qp.PostSend(&rdma.SendWR{Op: rdma.OpSend, SG: [][]byte{msg}}); err != nil {
		t.Fatal(err)
	}
}

func (p *rawPeer) recv(t *testing.T) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var cs [1]rdma.Completion
	if _, err := p.rcq.Wait(ctx, cs[:]); err != nil || cs[0].Status != rdma.Success {
		t.Fatalf("peer receive: %v %+v", err, cs[0])
	}
	return p.bufs[cs[0].ID][:cs[0].Len]
}

func ended(t *testing.T, u *upcalls) error {
	t.Helper()
	select {
	case err := <-u.ended:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("the datamover did not end the connection")
	}
	return nil
}

// control builds a control-type message: header, BHS (opcode op, data
// length dsl), data.
func control(hl int, h Header, op byte, data []byte) []byte {
	b := make([]byte, hl+48+len(data))
	h.Encode(b, hl)
	b[hl] = op
	var bhs pdu.BHS
	copy(bhs[:], b[hl:hl+48])
	bhs.SetDataSegmentLength(len(data))
	copy(b[hl:], bhs[:])
	copy(b[hl+48:], data)
	return b
}

// TestFormatAndProtocolErrors: RFC 5046 §10.1.3.2 — a malformed iSER
// header, an unknown opcode, a Hello where none belongs, a message shorter
// than it says: the stream is terminated and the iSCSI layer told.
func TestFormatAndProtocolErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  []byte
		want string
	}{
		{"short control message", []byte{0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, "header and BHS need"},
		{"unknown opcode", append([]byte{0x50}, make([]byte, 80)...), "unknown iSER opcode"},
		{"Hello in the Linux profile", (&Hello{MaxVer: 1, MinVer: 1}).Append(nil), "unexpected 0x2 message"},
		{"data beyond the message", func() []byte {
			m := control(HeaderLenLinux, Header{}, byte(pdu.OpNopOut)|0x40, []byte("abcd"))
			m[HeaderLenLinux+7] = 200 // DataSegmentLength 200, 4 present
			return m
		}(), "announces"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, peer := pair(t, Options{})
			u := newUpcalls()
			go c.Serve(u)
			peer.send(t, tc.msg)
			err := ended(t, u)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ended with %v, want %q", err, tc.want)
			}
			var fe *FormatError
			if tc.name != "Hello in the Linux profile" && !errors.As(err, &fe) {
				t.Fatalf("%v is not a FormatError", err)
			}
			<-peer.qp.Done()
		})
	}
}

// TestHelloRules: in the RFC 5046 profile the target's first message
// must answer a Hello; versions that do not overlap get REJ and the
// stream ends; anything else first is a protocol error.
func TestHelloRules(t *testing.T) {
	c, peer := pair(t, Options{Profile: ProfileRFC5046})
	u := newUpcalls()
	go c.Serve(u)
	peer.send(t, (&Hello{MaxVer: 3, MinVer: 2, IRD: 4}).Append(nil))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var cs [1]rdma.Completion
	if _, err := peer.rcq.Wait(ctx, cs[:]); err != nil || cs[0].Status != rdma.Success {
		t.Fatalf("no HelloReply: %v %+v", err, cs[0])
	}
	if err := ended(t, u); err == nil || !strings.Contains(err.Error(), "Hello rejected") {
		t.Fatalf("ended with %v", err)
	}

	c2, peer2 := pair(t, Options{Profile: ProfileRFC5046})
	u2 := newUpcalls()
	go c2.Serve(u2)
	peer2.send(t, control(HeaderLenRFC5046, Header{}, byte(pdu.OpNopOut)|0x40, nil))
	if err := ended(t, u2); err == nil || !strings.Contains(err.Error(), "not a Hello") {
		t.Fatalf("ended with %v", err)
	}

	// A good Hello gets a HelloReply carrying iSER-ORD = min(ORD, IRD).
	c3, peer3 := pair(t, Options{Profile: ProfileRFC5046})
	u3 := newUpcalls()
	go c3.Serve(u3)
	peer3.send(t, (&Hello{MaxVer: 1, MinVer: 1, IRD: 2}).Append(nil))
	if _, err := peer3.rcq.Wait(ctx, cs[:]); err != nil || cs[0].Len != HelloLen {
		t.Fatalf("HelloReply: %v %+v", err, cs[0])
	}
}

// TestReadBeyondAdvertised: a target that RDMA-Reads more than the
// initiator registered for a write is refused by the initiator's device
// (a Terminate, base or bounds), and nothing outside the buffer is read.
func TestReadBeyondAdvertised(t *testing.T) {
	c, peer := pair(t, Options{Initiator: true})
	u := newUpcalls()
	go c.Serve(u)
	out := make([]byte, 8192)
	var p datamover.PDU
	cmd := pdu.SCSICommand{Final: true, Write: true, ITT: 7, EDTL: 8192}
	cmd.Encode(&p.BHS)
	p.DataOut, p.UnsolicitedDataSize = out, 0
	if err := c.SendControl(&p, true); err != nil {
		t.Fatal(err)
	}
	// The peer sees the command with its Write STag and base offset.
	h, err := Decode(peer.recv(t), HeaderLenLinux)
	if err != nil || !h.WSV || h.RSV {
		t.Fatalf("%+v %v", h, err)
	}
	sink, _ := peer.pd.Register(make([]byte, 16384), 0, rdma.LocalWrite)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var cs [1]rdma.Completion
	// Reading what was advertised works…
	copy(out, "advertised data")
	peer.qp.PostSend(&rdma.SendWR{ID: 1, Op: rdma.OpRead, Sink: sink, Length: 8192, RemoteSTag: h.WriteSTag, RemoteTO: h.WriteVA})
	if _, err := peer.scq.Wait(ctx, cs[:]); err != nil || cs[0].Status != rdma.Success {
		t.Fatalf("read within the buffer: %v %+v", err, cs[0])
	}
	if string(sink.Buf()[:15]) != "advertised data" {
		t.Fatalf("read %q", sink.Buf()[:15])
	}
	// …one byte more is refused with a Terminate and the stream ends.
	peer.qp.PostSend(&rdma.SendWR{ID: 2, Op: rdma.OpRead, Sink: sink, Length: 8193, RemoteSTag: h.WriteSTag, RemoteTO: h.WriteVA})
	select {
	case <-peer.qp.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("an RDMA Read beyond the advertised buffer was not refused")
	}
	var te *rdma.TerminateError
	if !errors.As(peer.qp.Err(), &te) || !te.Remote || te.EType != 1 || te.Code != 1 {
		t.Fatalf("peer's error %v, want the initiator's Terminate (remote protection, base or bounds)", peer.qp.Err())
	}
	if err := ended(t, u); err == nil {
		t.Fatal("the initiator's datamover did not report the terminated stream")
	}
}

// TestDataACK: a Put_Data with the A-bit (ErrorRecoveryLevel ≥ 1) is
// acknowledged by a zero-length RDMA Read after the RDMA Write (RFC 5046
// §7.3.5): Data_ACK_Notify comes once the initiator has placed the data,
// with the DataSN that follows.
func TestDataACK(t *testing.T) {
	c, peer := pair(t, Options{})
	u := newUpcalls()
	go c.Serve(u)
	buf := make([]byte, 16384)
	mr, err := peer.pd.Register(buf, 0x10000, rdma.RemoteWrite|rdma.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	var cmd pdu.BHS
	(&pdu.SCSICommand{Final: true, Read: true, ITT: 9, EDTL: 16384, CmdSN: 1}).Encode(&cmd)
	msg := control(HeaderLenLinux, Header{RSV: true, ReadSTag: mr.STag(), ReadVA: 0x10000}, 0, nil)
	copy(msg[HeaderLenLinux:], cmd[:])
	peer.send(t, msg)
	u.waitFor(t, 1)
	var placed []byte
	u.onAck = func() { placed = append([]byte(nil), buf[:5]...) }
	sn := uint32(1)
	data := make([]byte, 16384)
	copy(data, "hello")
	if err := c.PutData(&datamover.DataIn{ITT: 9, Data: data, DataSN: &sn, Ack: true}); err != nil {
		t.Fatal(err)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.acks) != 1 || u.acks[0] != [2]uint32{9, 1} {
		t.Fatalf("Data_ACK_Notify %v, want once for ITT 9, DataSN 1", u.acks)
	}
	if string(placed) != "hello" {
		t.Fatalf("at Data_ACK_Notify the initiator's buffer held %q", placed)
	}
}

// silentQP is a queue pair that fails without flushing its receives, as a
// kernel device can (rxe after the peer's access violation, a removed
// device): Done closes, nothing reaches the receive queue.
type silentQP struct {
	rdma.QP
	done chan struct{}
	once sync.Once
}

func (q *silentQP) Done() <-chan struct{} { return q.done }
func (q *silentQP) Err() error {
	select {
	case <-q.done:
		return errors.New("queue pair error: the peer's RDMA reached for memory it was not given")
	default:
		return nil
	}
}
func (q *silentQP) fail() { q.once.Do(func() { close(q.done) }) }

// serveSilent serves a connection on a silentQP over a software iWARP
// pair; qb is the peer's queue pair (closed when the test ends).
func serveSilent(t *testing.T) (*silentQP, rdma.QP, *upcalls) {
	t.Helper()
	res := Prepare(rdma.NewDevice("test").AllocPD(), Options{})
	pp := rdma.ConnParams{PD: rdma.NewDevice("peer").AllocPD(), QP: rdma.QPConfig{SendCQ: rdma.NewCQ(16), RecvCQ: rdma.NewCQ(16)}}
	qa, qb, err := siw.New(siw.Options{}).Pair(res.ConnParams(nil), pp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qb.Close() })
	sq := &silentQP{QP: qa, done: make(chan struct{})}
	c := res.Attach(sq, CMHeader{}, nil)
	u := newUpcalls()
	go c.Serve(u)
	return sq, qb, u
}

func TestQueuePairFailureWithoutFlushEndsTheConnection(t *testing.T) {
	sq, _, u := serveSilent(t)
	time.Sleep(50 * time.Millisecond)
	sq.fail()
	if err := ended(t, u); err == nil || !strings.Contains(err.Error(), "not given") {
		t.Fatalf("the connection ended with %v, not the queue pair's reason", err)
	}
}

// A queue pair's end heard before a message it had received is read (a
// target's Logout Response and, at once, its disconnect: a kernel device
// tells the two on different channels) does not lose the message: the
// receives flush in order behind it, and the connection ends on the flush.
func TestMessageBeforeTheEndIsDelivered(t *testing.T) {
	sq, qb, u := serveSilent(t)
	time.Sleep(20 * time.Millisecond)
	sq.fail() // the end, heard first
	time.Sleep(10 * time.Millisecond)
	var h pdu.BHS
	(&pdu.NopOut{ITT: 1, TTT: pdu.ReservedTTT}).Encode(&h)
	msg := control(HeaderLenLinux, Header{}, 0, nil)
	copy(msg[HeaderLenLinux:], h[:])
	if err := qb.PostSend(&rdma.SendWR{Op: rdma.OpSend, SG: [][]byte{msg}}); err != nil {
		t.Fatal(err)
	}
	u.waitFor(t, 1)
	qb.Close() // the disconnect: the receives flush
	ended(t, u)
}

// TestTerminateAwaitsAResentResponse: a Logout Response handed to
// Send_Control before ConnectionTerminate reaches the initiator even when
// the link takes 1.5 s to deliver it (verbs-rxe-loss lost its Logout
// Response so: the queue pair closed after a second, before the resend).
func TestTerminateAwaitsAResentResponse(t *testing.T) {
	c, peer := pairOn(t, Options{}, func(q rdma.QP) rdma.QP { return &servetest.LateQP{QP: q, Delay: 1500 * time.Millisecond} })
	go c.Serve(newUpcalls())
	var p datamover.PDU
	(&pdu.LogoutResp{ITT: 5, StatSN: 1, ExpCmdSN: 2, MaxCmdSN: 2}).Encode(&p.BHS)
	if err := c.SendControl(&p, true); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.ConnectionTerminate()
	waited := time.Since(start)
	msg := peer.recv(t)
	var h pdu.BHS
	copy(h[:], msg[HeaderLenLinux:])
	if h.Opcode() != pdu.OpLogoutResp {
		t.Fatalf("the initiator received %v, not the Logout Response", h.Opcode())
	}
	if waited > 2500*time.Millisecond {
		t.Fatalf("ConnectionTerminate took %v for a send that completed after 1.5 s", waited)
	}
}

// TestTerminateGraceIsBounded: a send that never completes (a peer that
// never acknowledges) holds ConnectionTerminate for terminateGrace, no
// longer.
func TestTerminateGraceIsBounded(t *testing.T) {
	c, _ := pairOn(t, Options{}, func(q rdma.QP) rdma.QP { return &servetest.LateQP{QP: q, Delay: time.Hour} })
	go c.Serve(newUpcalls())
	var p datamover.PDU
	(&pdu.LogoutResp{ITT: 5}).Encode(&p.BHS)
	if err := c.SendControl(&p, true); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.ConnectionTerminate()
	if d := time.Since(start); d < terminateGrace-100*time.Millisecond || d > terminateGrace+time.Second {
		t.Fatalf("ConnectionTerminate returned after %v; its grace is %v", d, terminateGrace)
	}
}
