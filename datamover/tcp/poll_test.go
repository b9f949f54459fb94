package tcp

import (
	"testing"
	"time"

	"github.com/blockwire/blockwire/internal/servetest"
	"github.com/blockwire/blockwire/internal/sockpoll"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/iscsi/pdu"
)

// A connection that polls delivers each PDU, whether it lands while the
// reader polls or after it slept, and ends with the peer's close.
func TestPollingConnServes(t *testing.T) {
	server, client := servetest.TCPPair(t)
	c := New(server, nil)
	const spin = 100 * time.Millisecond
	c.SetPoll(sockpoll.NewGroup(spin))
	if c.poll == nil {
		t.Fatal("SetPoll put no poller under the reader")
	}
	c.NoticeKeyValues(datamover.Params{MaxRecvDataSegmentLength: 8192, MaxXmitDataSegmentLength: 8192})
	c.EnableDatamover(nil)
	u := &upcalls{ended: make(chan error, 1)}
	go c.Serve(u)
	send := func(i int) {
		var h pdu.BHS
		(&pdu.NopOut{ITT: uint32(i), TTT: pdu.ReservedTTT}).Encode(&h)
		if _, err := client.Write(h[:]); err != nil {
			t.Fatal(err)
		}
	}
	// Well within the polling time: read while polling (unless the
	// reader was descheduled for all of it).
	for i := range 10 {
		send(i)
		time.Sleep(spin / 10)
	}
	// Past it: read after a sleep.
	time.Sleep(spin * 3 / 2)
	send(10)
	time.Sleep(10 * time.Millisecond)
	client.Close()
	select {
	case err := <-u.ended:
		if err != nil {
			t.Fatalf("ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the connection did not end after the peer closed it")
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.ctrl) != 11 {
		t.Fatalf("%d PDUs delivered, want 11", len(u.ctrl))
	}
	if polled, slept := c.poll.Counts(); polled == 0 || slept == 0 {
		t.Fatalf("polled %d, slept %d: want reads of both kinds", polled, slept)
	}
}
