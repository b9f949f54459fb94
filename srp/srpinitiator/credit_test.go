package srpinitiator

import (
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/blockwire/blockwire/srp"
)

// The REQUEST LIMIT DELTA of SRP_RSP, SRP_CRED_REQ and SRP_AER_REQ is a
// signed 32-bit count (SRP r16a §6.9, §6.11, §6.12; Linux's ib_srp reads it
// as s32): a target may take credits back. 0xffffffff is one credit fewer,
// not four billion more — which would let the initiator send past the
// target's limit. The codec reads it as int32; the bytes 0xffffffff are -1.
func TestCreditDeltaIsSigned(t *testing.T) {
	c := &Channel{reqLim: 5, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	c.cond = sync.NewCond(&c.mu)
	var r srp.Rsp
	iu := (&srp.Rsp{ReqLimDelta: 1}).Append(nil)
	copy(iu[4:8], []byte{0xff, 0xff, 0xff, 0xff})
	if err := r.Decode(iu); err != nil || r.ReqLimDelta != -1 {
		t.Fatalf("delta bytes ff ff ff ff decoded as %d (%v), want -1", r.ReqLimDelta, err)
	}
	c.receive((&srp.Rsp{ReqLimDelta: -1, Tag: 77}).Append(nil))
	if c.reqLim != 4 {
		t.Fatalf("after a response with delta -1: %d credits, want 4", c.reqLim)
	}
	c.grant(-2)
	if c.reqLim != 2 {
		t.Fatalf("after a grant of -2: %d credits, want 2", c.reqLim)
	}
	c.grant(3)
	if c.reqLim != 5 {
		t.Fatalf("after a grant of 3: %d credits, want 5", c.reqLim)
	}
}
