package iser

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/rdma"
)

// sendCommand has the peer send a SCSI Command for itt advertising a Read
// STag.
func sendCommand(t *testing.T, peer *rawPeer, itt, stag uint32) {
	t.Helper()
	var cmd pdu.BHS
	(&pdu.SCSICommand{Final: true, Read: true, ITT: itt, EDTL: 4096, CmdSN: 1}).Encode(&cmd)
	msg := control(HeaderLenLinux, Header{RSV: true, ReadSTag: stag, ReadVA: 0x10000}, 0, nil)
	copy(msg[HeaderLenLinux:], cmd[:])
	peer.send(t, msg)
}

// tagCount is how many ITTs the target side keeps STags for.
func tagCount(c *Conn) int {
	c.tmu.Lock()
	defer c.tmu.Unlock()
	return len(c.tasks)
}

// TestRefusedCommandsKeepNoTags: the STags a SCSI Command advertises are
// kept for its Put_Data and Get_Data from the moment it arrives; one the
// iSCSI layer refuses (a Reject: outside the window, a duplicate ITT) never
// becomes a task, so nothing would deallocate them. A peer sending such
// commands with ever new ITTs grew the table without bound.
func TestRefusedCommandsKeepNoTags(t *testing.T) {
	c, peer := pair(t, Options{})
	u := newUpcalls()
	u.refuse = &datamover.ProtocolError{Reject: true, Reason: pdu.RejectImmediateCmd, Err: errors.New("beyond the command window")}
	go c.Serve(u)
	const n = 64
	for i := range n {
		sendCommand(t, peer, uint32(100+i), 0x1234)
		// Take the Reject (sent after the tags are dropped) and give the
		// buffer back.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var cs [1]rdma.Completion
		_, err := peer.rcq.Wait(ctx, cs[:])
		cancel()
		if err != nil || cs[0].Status != rdma.Success {
			t.Fatalf("no Reject for command %d: %v %+v", i, err, cs[0])
		}
		if err := peer.qp.PostRecv(rdma.RecvWR{ID: cs[0].ID, Buf: peer.bufs[cs[0].ID]}); err != nil {
			t.Fatal(err)
		}
	}
	if got := tagCount(c); got != 0 {
		t.Fatalf("STags kept for %d refused commands", got)
	}
}

// TestReusedITTKeepsItsTags: an initiator may reuse an ITT as soon as it
// holds the response, so the new command's STags can arrive before the
// old task is deallocated. The old task's deallocation must leave the new
// command's STags, which its Put_Data needs.
func TestReusedITTKeepsItsTags(t *testing.T) {
	c, peer := pair(t, Options{})
	u := newUpcalls()
	go c.Serve(u)
	sendCommand(t, peer, 9, 0x1111)
	u.waitFor(t, 1)
	sendCommand(t, peer, 9, 0x2222) // the ITT again, before the old task ends
	u.waitFor(t, 2)
	c.DeallocateTaskResources(9) // the old task ends
	c.tmu.Lock()
	tags := c.tasks[9]
	c.tmu.Unlock()
	if tags == nil || !tags.rsv || tags.rstag != 0x2222 {
		t.Fatalf("after the old task's end the ITT's tags are %+v, want the new command's Read STag 0x2222", tags)
	}
	c.DeallocateTaskResources(9) // the new one ends
	if got := tagCount(c); got != 0 {
		t.Fatalf("STags kept for %d ITTs after both tasks ended", got)
	}
}

// TestReadWithoutReadSTag: a SCSI read command must advertise the Read
// STag its data goes to (RFC 5046 §7.3.1 c). One that does not could
// never be answered (its Put_Data has nowhere to write), and the
// initiator would wait until its own timeout: the connection ends at
// once, naming the violation, and the command never reaches the iSCSI
// layer. A write that advertises nothing is fine: all its data may be
// unsolicited.
func TestReadWithoutReadSTag(t *testing.T) {
	c, peer := pair(t, Options{})
	u := newUpcalls()
	go c.Serve(u)
	var write pdu.BHS
	(&pdu.SCSICommand{Final: true, Write: true, ITT: 1, EDTL: 512, CmdSN: 1}).Encode(&write)
	write.SetDataSegmentLength(512)
	msg := control(HeaderLenLinux, Header{}, 0, make([]byte, 512))
	copy(msg[HeaderLenLinux:], write[:])
	peer.send(t, msg)
	u.waitFor(t, 1)

	var read pdu.BHS
	(&pdu.SCSICommand{Final: true, Read: true, ITT: 2, EDTL: 4096, CmdSN: 2}).Encode(&read)
	msg = control(HeaderLenLinux, Header{}, 0, nil)
	copy(msg[HeaderLenLinux:], read[:])
	peer.send(t, msg)
	err := ended(t, u)
	var pe *datamover.ProtocolError
	if err == nil || !strings.Contains(err.Error(), "Read STag") || !errors.As(err, &pe) {
		t.Fatalf("ended with %v, want a protocol error naming the missing Read STag", err)
	}
	u.mu.Lock()
	delivered := len(u.pdus)
	u.mu.Unlock()
	if delivered != 1 {
		t.Fatalf("%d PDUs reached the iSCSI layer, want only the write", delivered)
	}
	if got := tagCount(c); got > 1 {
		t.Fatalf("STags kept for %d ITTs", got)
	}
}
