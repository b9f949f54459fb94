package tcp

import (
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/blockwire/blockwire/internal/servetest"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/iscsi/pdu"
)

type upcalls struct {
	mu    sync.Mutex
	ctrl  []pdu.Opcode
	acks  [][2]uint32
	ended chan error
}

func (u *upcalls) DataBuffer(h *pdu.BHS) ([]byte, error) { return nil, nil }
func (u *upcalls) ControlNotify(p *datamover.PDU) error {
	u.mu.Lock()
	u.ctrl = append(u.ctrl, p.BHS.Opcode())
	u.mu.Unlock()
	return nil
}
func (u *upcalls) ConnectionTerminateNotify(err error)  { u.ended <- err }
func (u *upcalls) DataCompletionNotify(itt, ttt uint32) {}
func (u *upcalls) DataACKNotify(itt, dataSN uint32) {
	u.mu.Lock()
	u.acks = append(u.acks, [2]uint32{itt, dataSN})
	u.mu.Unlock()
}

// TestDataACK: a Put_Data with the A-bit marks its last Data-In with A and
// a TTT; the initiator's DataACK SNACK naming that TTT becomes
// Data_ACK_Notify (draft-ietf-ips-iwarp-da §10.4, RFC 7143 §11.7.2, §11.16.3) instead of
// reaching the iSCSI layer. A DataACK nobody asked for, and other
// SNACKs, still go to the iSCSI layer (which rejects them at ERL 0).
func TestDataACK(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	c := New(a, nil)
	c.NoticeKeyValues(datamover.Params{MaxRecvDataSegmentLength: 8192, MaxXmitDataSegmentLength: 4096})
	c.EnableDatamover(nil)
	u := &upcalls{ended: make(chan error, 1)}
	go c.Serve(u)
	defer c.ConnectionTerminate()

	got := make(chan []pdu.BHS, 1)
	go func() {
		var hs []pdu.BHS
		for range 3 { // 10000 bytes in 4096-byte PDUs
			var h pdu.BHS
			if _, err := io.ReadFull(b, h[:]); err != nil {
				break
			}
			io.CopyN(io.Discard, b, int64(h.DataSegmentLength()+pdu.Pad(h.DataSegmentLength())))
			hs = append(hs, h)
		}
		got <- hs
	}()
	sn := uint32(0)
	if err := c.PutData(&datamover.DataIn{ITT: 0x42, Data: make([]byte, 10000), DataSN: &sn, Ack: true}); err != nil {
		t.Fatal(err)
	}
	hs := <-got
	if len(hs) != 3 {
		t.Fatalf("%d Data-In PDUs", len(hs))
	}
	for i, h := range hs {
		var di pdu.DataIn
		if err := di.Decode(&h); err != nil {
			t.Fatal(err)
		}
		if last := i == 2; di.Ack != last || last && di.TTT != 0x42 || !last && di.TTT != pdu.ReservedTTT {
			t.Fatalf("Data-In %d: A=%v TTT=%#x", i, di.Ack, di.TTT)
		}
	}
	snack := func(typ byte, ttt, beg uint32) {
		var h pdu.BHS
		(&pdu.SNACKReq{Type: typ, ITT: pdu.ReservedITT, TTT: ttt, BegRun: beg}).Encode(&h)
		if _, err := b.Write(h[:]); err != nil {
			t.Fatal(err)
		}
	}
	snack(pdu.SNACKDataACK, 0x42, 3)
	snack(pdu.SNACKDataACK, 0x42, 3) // a second one: not awaited any more
	snack(pdu.SNACKDataACK, 0x77, 1) // never asked for
	deadline := time.Now().Add(5 * time.Second)
	for {
		u.mu.Lock()
		n := len(u.ctrl)
		u.mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("delivered %v", u.ctrl)
		}
		time.Sleep(time.Millisecond)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.acks) != 1 || u.acks[0] != [2]uint32{0x42, 3} {
		t.Fatalf("Data_ACK_Notify %v, want once for ITT 0x42 with DataSN 3", u.acks)
	}
}

// TestMoreSharesWrites: responses sent with More by senders that run one
// at a time (one processor) leave in shared writes; without More each
// sender writes its own, which is what the comparison shows the batching
// against.
func TestMoreSharesWrites(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const n = 16
	batches := map[bool]uint64{}
	for _, more := range []bool{false, true} {
		a, b := servetest.TCPPair(t)
		got := make(chan int64, 1)
		go func() {
			m, _ := io.Copy(io.Discard, b)
			got <- m
		}()
		c := New(a, nil)
		c.NoticeKeyValues(datamover.Params{MaxRecvDataSegmentLength: 8192, MaxXmitDataSegmentLength: 8192})
		c.EnableDatamover(nil)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				p := datamover.PDU{More: more, Data: make([]byte, 512)}
				(&pdu.NopIn{ITT: uint32(i), TTT: pdu.ReservedTTT}).Encode(&p.BHS)
				if err := c.SendControl(&p, false); err != nil {
					t.Error(err)
				}
			})
		}
		close(start)
		wg.Wait()
		c.wmu.Lock()
		batches[more] = c.written
		c.wmu.Unlock()
		a.(*net.TCPConn).CloseWrite()
		if m := <-got; m != n*(pdu.BHSLen+512) {
			t.Fatalf("more=%v: the peer got %d bytes, want %d", more, m, n*(pdu.BHSLen+512))
		}
	}
	t.Logf("%d responses: %d writes without More, %d with", n, batches[false], batches[true])
	if batches[true] > 2 || batches[true] >= batches[false] {
		t.Fatalf("%d responses with More took %d writes (%d without): not shared", n, batches[true], batches[false])
	}
}

// TestPending: while a PDU is delivered, Pending tells whether the next
// one has arrived already (the target then lets the command go to a
// worker rather than run it on the receiver).
func TestPending(t *testing.T) {
	a, b := servetest.TCPPair(t)
	c := New(a, nil)
	c.NoticeKeyValues(datamover.Params{MaxRecvDataSegmentLength: 8192, MaxXmitDataSegmentLength: 8192})
	c.EnableDatamover(nil)
	seen := make(chan bool, 3)
	go c.Serve(&pendingUpcalls{c: c, seen: seen})
	defer c.ConnectionTerminate()
	var two [2 * pdu.BHSLen]byte
	for i := range 2 {
		(&pdu.NopOut{ITT: uint32(i), TTT: pdu.ReservedTTT}).Encode((*pdu.BHS)(two[i*pdu.BHSLen:]))
	}
	if _, err := b.Write(two[:]); err != nil { // both in one segment
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		select {
		case p := <-seen:
			if p != want {
				t.Fatalf("PDU %d: Pending = %v, want %v", i, p, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("PDU %d not delivered", i)
		}
	}
}

type pendingUpcalls struct {
	upcalls
	c    *Conn
	seen chan bool
}

func (u *pendingUpcalls) ControlNotify(p *datamover.PDU) error {
	u.seen <- u.c.Pending()
	return nil
}
func (u *pendingUpcalls) ConnectionTerminateNotify(err error) {}
