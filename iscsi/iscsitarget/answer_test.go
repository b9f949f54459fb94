package iscsitarget

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/internal/servetest"
	"github.com/blockwire/blockwire/internal/waitfor"
)

// failingPutData is a datamover whose Put_Data cannot deliver (an iSER
// command that advertised no Read STag, a transport that failed).
type failingPutData struct{ datamover.Conn }

func (failingPutData) PutData(d *datamover.DataIn) error {
	return &datamover.ProtocolError{Err: errors.New("test: this datamover cannot deliver data-in")}
}

// TestUndeliverableAnswerEndsTheConnection: when the datamover cannot
// deliver a command's answer, the initiator would wait for it until its
// own timeout (30 s for Linux) and the target would go on as if it had
// answered. As with a Get_Data that fails, the connection ends at once,
// with the reason in the log, so the initiator recovers on a new one.
func TestUndeliverableAnswerEndsTheConnection(t *testing.T) {
	var log servetest.LogBuffer
	ts := startServerOn(t, Options{}, nil, &log, func(l net.Listener) datamover.Acceptor {
		return &establishedWith{fabric.TCP(l), func(e *datamover.Established) {
			open := e.Open
			e.Open = func(s datamover.Stamper) datamover.Conn { return failingPutData{open(s)} }
		}}
	})
	c := dial(t, ts.addr)
	c.mustLogin(normalKeys(ini)...)
	c.command(tur(), false, 0, nil, 0) // answered: a SCSI Response is delivered
	cmd := read10(0, 8)
	c.sendCmd(cmd, true, 4096, false, nil)
	start := time.Now()
	if h, _, ok := c.recv(5 * time.Second); ok {
		t.Fatalf("the target sent %s for a READ whose data it could not deliver", h.Opcode())
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the connection was still open %v after the answer failed", d.Round(time.Millisecond))
	}
	waitfor.True(t, 2*time.Second, func() bool { return strings.Contains(log.String(), "cannot deliver data-in") }, func() string {
		return "the log does not say why the connection ended:\n" + log.String()
	})
}
