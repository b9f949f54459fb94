package tcp

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/iscsi/pdu"
)

// sendUntilError sends NOP-Ins with 64 KiB of data until a send fails and
// says when it did (or never, within limit).
func sendUntilError(c *Conn, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	data := make([]byte, 64<<10)
	for i := 0; time.Since(start) < limit; i++ {
		p := datamover.PDU{Data: data}
		(&pdu.NopIn{ITT: uint32(i), TTT: pdu.ReservedTTT}).Encode(&p.BHS)
		if err := c.SendControl(&p, false); err != nil {
			return time.Since(start), err
		}
	}
	return limit, nil
}

// sendingConn is a Conn over net.Pipe, whose writes move exactly what the
// peer reads: a peer on a loopback socket cannot read at a chosen pace,
// as the kernel opens its window in steps of a (64 KiB) segment.
func sendingConn(t *testing.T, timeout time.Duration) (*Conn, net.Conn) {
	server, client := net.Pipe()
	t.Cleanup(func() { server.Close(); client.Close() })
	c := New(server, nil)
	c.SetSendTimeout(timeout)
	c.NoticeKeyValues(datamover.Params{MaxRecvDataSegmentLength: 8192, MaxXmitDataSegmentLength: 64 << 10})
	c.EnableDatamover(nil)
	return c, client
}

// TestSendTimeoutDropsATricklingPeer: a peer that reads a few bytes now
// and then, never going a whole send timeout without reading, is as stuck
// as one that reads nothing — it holds the connection's buffers and tasks
// for ever. A stretch of the send timeout must move at least
// minSendProgress bytes (or all that is left); this peer, reading 512
// bytes every third of the timeout, is dropped within a few timeouts.
func TestSendTimeoutDropsATricklingPeer(t *testing.T) {
	const timeout = 300 * time.Millisecond
	c, client := sendingConn(t, timeout)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		buf := make([]byte, 512)
		for {
			select {
			case <-stop:
				return
			case <-time.After(timeout / 3):
			}
			if _, err := io.ReadFull(client, buf); err != nil {
				return
			}
		}
	}()
	d, err := sendUntilError(c, 40*timeout)
	if err == nil {
		t.Fatalf("a peer reading 512 bytes every %v still had its sends taken after %v", timeout/3, d)
	}
	if d > 10*timeout {
		t.Fatalf("a trickling peer was dropped only after %v (send timeout %v): %v", d, timeout, err)
	}
	t.Logf("dropped after %v: %v", d, err)
}

// TestSendTimeoutKeepsASlowReader: a peer that reads steadily, if slowly —
// 64 KiB every 10 ms, a hundred times the least a send timeout's stretch
// (1 s here) must move — is not taken for a stalled one. One read per
// stretch is enough, so only a reader held up for a whole second (not a
// loaded machine's scheduling) could fail it.
func TestSendTimeoutKeepsASlowReader(t *testing.T) {
	const timeout = time.Second
	c, client := sendingConn(t, timeout)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			time.Sleep(10 * time.Millisecond)
			if _, err := io.ReadFull(client, buf); err != nil {
				return
			}
		}
	}()
	if d, err := sendUntilError(c, 3*timeout); err != nil {
		t.Fatalf("a peer reading 6.4 MB/s was dropped after %v: %v", d, err)
	}
}
