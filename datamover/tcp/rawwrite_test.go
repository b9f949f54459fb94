package tcp

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/blockwire/blockwire/internal/servetest"
	"github.com/blockwire/blockwire/internal/sockpoll"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/internal/sendguard"
	"github.com/blockwire/blockwire/iscsi/pdu"
)

// pollingConn is a Conn that polls (SetPoll: raw reads and writes) over a
// loopback TCP connection whose client end is returned, its send buffer
// small so that the Conn's writes find the socket full. (A small receive
// buffer at the client instead stalls loopback TCP itself: a 64 KiB
// segment never fits its window, and the sender only probes.)
func pollingConn(t *testing.T, timeout time.Duration) (*Conn, net.Conn) {
	server, client := servetest.TCPPair(t)
	server.(*net.TCPConn).SetWriteBuffer(64 << 10)
	c := New(server, nil)
	c.SetPoll(sockpoll.NewGroup(time.Millisecond))
	if c.rw == nil {
		t.Fatal("SetPoll on a TCP socket left the writes to net.Conn")
	}
	c.SetSendTimeout(timeout)
	c.NoticeKeyValues(datamover.Params{MaxRecvDataSegmentLength: 8192, MaxXmitDataSegmentLength: 64 << 10})
	c.EnableDatamover(nil)
	return c, client
}

// TestRawWritesArriveWhole: PDUs sent through the raw writes arrive whole
// and in order — each header, its data and pad — across writes that the
// full socket cut short and the network poller resumed.
func TestRawWritesArriveWhole(t *testing.T) {
	c, client := pollingConn(t, 10*time.Second)
	const n = 400
	payload := func(i int) []byte {
		b := make([]byte, (i*7919+i%3)%(64<<10)) // up to 64 KiB, some padded
		for j := range b {
			b[j] = byte(i + j)
		}
		return b
	}
	errc := make(chan error, 1)
	go func() {
		for i := range n {
			p := datamover.PDU{Data: payload(i)}
			(&pdu.NopIn{ITT: uint32(i), TTT: pdu.ReservedTTT}).Encode(&p.BHS)
			if err := c.SendControl(&p, false); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	time.Sleep(200 * time.Millisecond) // the socket fills meanwhile
	r := bufio.NewReader(client)
	client.SetReadDeadline(time.Now().Add(20 * time.Second))
	for i := range n {
		var h pdu.BHS
		if _, err := io.ReadFull(r, h[:]); err != nil {
			t.Fatalf("PDU %d: %v", i, err)
		}
		want := payload(i)
		if h.ITT() != uint32(i) || h.DataSegmentLength() != len(want) {
			t.Fatalf("PDU %d: ITT %d with %d bytes, want %d bytes", i, h.ITT(), h.DataSegmentLength(), len(want))
		}
		got := make([]byte, len(want)+len(pdu.PadFor(len(want))))
		if _, err := io.ReadFull(r, got); err != nil {
			t.Fatalf("PDU %d data: %v", i, err)
		}
		if !bytes.Equal(got[:len(want)], want) {
			t.Fatalf("PDU %d: its data differs", i)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if c.rw.full == 0 {
		t.Fatal("no write found the socket full: the resumed path was not taken")
	}
}

// TestRawWritesKeepTheSendTimeout: a peer that stops reading is dropped
// after the send timeout through the raw writes too (the network
// poller's wait honours the write deadline).
func TestRawWritesKeepTheSendTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	c, _ := pollingConn(t, timeout)
	d, err := sendUntilError(c, 40*timeout)
	if err == nil {
		t.Fatalf("a peer that reads nothing still had its sends taken after %v", d)
	}
	if !sendguard.IsTimeout(err) || d > 10*timeout {
		t.Fatalf("dropped after %v with %v; want a timeout within a few of %v", d, err, timeout)
	}
}
