package servetest

import (
	"context"
	"time"

	"github.com/blockwire/blockwire/rdma"
)

// LateQP delivers each Send Delay late, as a reliable connection does when
// the first transmission was lost: the peer has it, and the send
// completes, one or two ACK timeouts later (Linux's rdma_cm asks for
// 0.54 s on RoCE). A queue pair closed meanwhile never sends it.
type LateQP struct {
	rdma.QP
	Delay time.Duration
}

// PostSend posts wr on the queue pair Delay from now.
func (q *LateQP) PostSend(wr *rdma.SendWR) error {
	w := *wr
	w.SG = append([][]byte(nil), wr.SG...) // the buffers stay the sender's until the completion
	time.AfterFunc(q.Delay, func() { q.QP.PostSend(&w) })
	return nil
}

// LateListener hands out queue pairs that are LateQPs.
type LateListener struct {
	rdma.Listener
	Delay time.Duration
}

// Accept returns the next connection request, whose queue pair, once
// accepted, sends late.
func (l LateListener) Accept(ctx context.Context) (rdma.ConnRequest, error) {
	r, err := l.Listener.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return lateRequest{r, l.Delay}, nil
}

type lateRequest struct {
	rdma.ConnRequest
	delay time.Duration
}

func (r lateRequest) Accept(p rdma.ConnParams) (rdma.QP, error) {
	qp, err := r.ConnRequest.Accept(p)
	if err != nil {
		return nil, err
	}
	return &LateQP{QP: qp, Delay: r.delay}, nil
}
