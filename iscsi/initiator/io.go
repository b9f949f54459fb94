package initiator

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/internal/serial"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/iscsi/text"
	"github.com/blockwire/blockwire/scsi"
)

func randRead(b []byte) { rand.Read(b) }

// DataBuffer implements datamover.Upcalls: Data-In lands directly in the
// caller's buffer at its offset.
func (l *link) DataBuffer(h *pdu.BHS) ([]byte, error) {
	if !l.ffp.Load() || h.Opcode() != pdu.OpDataIn {
		return nil, nil
	}
	s := l.s
	off := int(h.BufferOffset())
	n := h.DataSegmentLength()
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tasks[h.ITT()]
	if t == nil || off+n > len(t.in) || off < 0 {
		return nil, nil // discarded (see handleDataIn)
	}
	return t.in[off : off+n], nil
}

// ControlNotify implements datamover.Upcalls.
func (l *link) ControlNotify(p *datamover.PDU) error {
	s := l.s
	if !s.heard.Load() {
		s.heard.Store(true)
	}
	h := &p.BHS
	if !l.ffp.Load() {
		cp := &datamover.PDU{BHS: p.BHS, Data: append([]byte(nil), p.Data...)}
		if h.Opcode() == pdu.OpLoginResp {
			s.expStatSN.Store(h.StatSN() + 1)
			l.noteLoginKeys(cp)
		}
		select {
		case l.loginCh <- cp:
		default:
			return errors.New("iscsi: unexpected PDUs during login")
		}
		return nil
	}
	s.notePDU(h)
	switch h.Opcode() {
	case pdu.OpDataIn:
		return s.handleDataIn(h, p.Data)
	case pdu.OpSCSIResponse:
		return s.handleResponse(h, p.Data)
	case pdu.OpR2T:
		return s.handleR2T(l, h)
	case pdu.OpNopIn:
		var n pdu.NopIn
		if err := n.Decode(h); err != nil {
			return err
		}
		if n.TTT != pdu.ReservedTTT {
			// The target pings: answer at once (RFC 7143 §11.18).
			s.mu.Lock()
			out := pdu.NopOut{Immediate: true, LUN: n.LUN, ITT: pdu.ReservedITT, TTT: n.TTT, CmdSN: s.cmdSN}
			s.mu.Unlock()
			var r datamover.PDU
			out.Encode(&r.BHS)
			return l.dm.SendControl(&r, false)
		}
	case pdu.OpTaskMgmtResp:
		s.mu.Lock()
		ch := s.tmfs[h.ITT()]
		delete(s.tmfs, h.ITT())
		s.mu.Unlock()
		if ch != nil {
			ch <- h.Response()
		}
	case pdu.OpTextResp:
		cp := &datamover.PDU{BHS: p.BHS, Data: append([]byte(nil), p.Data...)}
		select {
		case l.textCh <- cp:
		default:
			return errors.New("iscsi: unsolicited Text Response")
		}
	case pdu.OpLogoutResp:
		// One answer ends the wait; a second one, or one nobody asked
		// for, is ignored.
		s.mu.Lock()
		ch := s.logoutCh
		s.logoutCh = nil
		s.mu.Unlock()
		if ch != nil {
			close(ch)
		}
	case pdu.OpAsyncMsg:
		var a pdu.AsyncMsg
		if err := a.Decode(h); err != nil {
			return err // a malformed PDU from the target ends the connection
		}
		s.log.Info("asynchronous message from the target", "event", a.Event, "parameter3", a.Parameter3)
		if a.Event == pdu.AsyncLogoutRequest || a.Event == pdu.AsyncDropConnection || a.Event == pdu.AsyncDropAllConnections {
			// The target is going away: drop this connection; recovery
			// reconnects and replays what was in flight.
			go l.dm.ConnectionTerminate()
		}
	case pdu.OpReject:
		if len(p.Data) >= pdu.BHSLen {
			rejected := pdu.BHS(p.Data[:pdu.BHSLen])
			s.finish(rejected.ITT(), nil, fmt.Errorf("iscsi: target rejected the PDU (reason %#x)", h.Response()))
		}
	}
	return nil
}

// noteLoginKeys records the target's login keys and, on the final
// successful response, switches the datamover to the negotiated digests
// (in the receive goroutine, so the next PDU is already read with them).
func (l *link) noteLoginKeys(p *datamover.PDU) {
	var r pdu.LoginResp
	if r.Decode(&p.BHS) != nil || r.StatusClass != 0 {
		return
	}
	kvs, _ := text.Parse(p.Data)
	for _, kv := range kvs {
		l.keys[kv.Key] = kv.Value
	}
	if !(r.Transit && r.NSG == pdu.StageFullFeature) {
		return
	}
	num := func(k string, def int) int {
		if v, ok := l.keys[k]; ok {
			if n, err := text.ParseNumber(v); err == nil {
				return int(n)
			}
		}
		return def
	}
	yes := func(k string, def bool) bool {
		switch v := l.keys[k]; v {
		case "Yes", "No":
			return v == "Yes"
		}
		// Not answered, or NotUnderstood, Irrelevant, Reject: the default
		// (RFC 7143 §6.2); anything else fails the login (text.Settle).
		return def
	}
	pr := params{
		immediateData: yes("ImmediateData", true),
		initialR2T:    yes("InitialR2T", true),
		firstBurst:    num("FirstBurstLength", 65536),
		maxBurst:      num("MaxBurstLength", 262144),
		maxXmit:       num("MaxRecvDataSegmentLength", 8192),
		maxConns:      num("MaxConnections", 1),
		headerDigest:  l.keys["HeaderDigest"] == "CRC32C",
		dataDigest:    l.keys["DataDigest"] == "CRC32C",
	}
	dp := datamover.Params{
		HeaderDigest: pr.headerDigest, DataDigest: pr.dataDigest,
		MaxRecvDataSegmentLength: l.s.opts.MaxRecvDataSegmentLength,
		MaxXmitDataSegmentLength: pr.maxXmit,
	}
	if l.rdma && l.keys["RDMAExtensions"] == "Yes" {
		// RFC 5046 §6: digests off; the control-PDU sizes are the iSER
		// lengths (the minimum of both declarations).
		dp.RDMAExtensions, dp.HeaderDigest, dp.DataDigest = true, false, false
		dp.TargetRecvDataSegmentLength = min(num("TargetRecvDataSegmentLength", 8192), 8192)
		dp.InitiatorRecvDataSegmentLength = min(num("InitiatorRecvDataSegmentLength", 8192), 8192)
		pr.maxXmit = dp.TargetRecvDataSegmentLength
		if rb, ok := l.dm.(datamover.ReceiveBudget); ok {
			// 0 when the target does not know the key (NotUnderstood).
			dp.MaxOutstandingUnexpectedPDUs = rb.MaxOutstandingUnexpectedPDUs()
			dp.PeerMaxOutstandingUnexpectedPDUs = num("MaxOutstandingUnexpectedPDUs", 0)
		}
		pr.headerDigest, pr.dataDigest = false, false
	}
	l.params = pr
	l.finalExp = p.BHS.ExpCmdSN()
	l.finalMax = p.BHS.MaxCmdSN()
	l.dm.NoticeKeyValues(dp)
	l.dm.EnableDatamover(nil)
	l.ffp.Store(true)
}

// check refuses what a target may not declare (RFC 7143 §13.12–13.14):
// data segments, bursts and first bursts outside the key table's bounds
// (512 to 2^24-1 bytes), a first burst longer than a burst. A target that
// declared 0 would otherwise get empty Data-Out PDUs without end.
func (p params) check() error {
	for _, k := range text.Keys() {
		var n int
		switch k.Name {
		case "MaxRecvDataSegmentLength":
			n = p.maxXmit
		case "MaxBurstLength":
			n = p.maxBurst
		case "FirstBurstLength":
			n = p.firstBurst
		default:
			continue
		}
		if n < 0 || uint64(n) < k.Min || uint64(n) > k.Max {
			return fmt.Errorf("iscsi: the target declared %s=%d (%d to %d)", k.Name, n, k.Min, k.Max)
		}
	}
	if p.firstBurst > p.maxBurst {
		return fmt.Errorf("iscsi: the target declared FirstBurstLength=%d above MaxBurstLength=%d", p.firstBurst, p.maxBurst)
	}
	return nil
}

// notePDU takes ExpCmdSN, MaxCmdSN and StatSN from a target PDU.
func (s *Session) notePDU(h *pdu.BHS) {
	exp, max := h.ExpCmdSN(), h.MaxCmdSN()
	op := h.Opcode()
	hasStatus := op == pdu.OpSCSIResponse || op == pdu.OpTaskMgmtResp || op == pdu.OpLogoutResp ||
		op == pdu.OpTextResp || op == pdu.OpAsyncMsg || op == pdu.OpReject ||
		h.DataInStatus() || (op == pdu.OpNopIn && h.ITT() != pdu.ReservedITT)
	if hasStatus {
		s.expStatSN.Store(h.StatSN() + 1)
	}
	s.mu.Lock()
	// RFC 7143 §4.2.2.1: MaxCmdSN and ExpCmdSN only move forward, and are
	// ignored when MaxCmdSN < ExpCmdSN - 1.
	if !serial.LessThan(max, exp-1) {
		if serial.GreaterThan(exp, s.exp) {
			s.exp = exp
		}
		if serial.GreaterThan(max, s.max) {
			s.max = max
			s.cond.Broadcast()
		}
	}
	s.mu.Unlock()
}

func (s *Session) handleDataIn(h *pdu.BHS, data []byte) error {
	var d pdu.DataIn
	if err := d.Decode(h); err != nil {
		return err
	}
	s.mu.Lock()
	t := s.tasks[d.ITT]
	if t != nil && int(d.Offset)+len(data) <= len(t.in) {
		t.res.In += len(data)
	}
	s.mu.Unlock()
	if t == nil {
		return nil // an aborted task's data
	}
	if int(d.Offset)+len(data) > len(t.in) {
		s.finish(d.ITT, nil, fmt.Errorf("iscsi: Data-In [%d,+%d) beyond the %d-byte buffer (RFC 7143 §11.7.6)", d.Offset, len(data), len(t.in)))
		return nil
	}
	if d.HasStatus {
		r := Result{Status: d.Status, Residual: residual(d.Overflow, d.Underflow, d.Residual)}
		s.finish(d.ITT, &r, nil)
	}
	return nil
}

func residual(over, under bool, n uint32) int {
	switch {
	case under:
		return int(n)
	case over:
		return -int(n)
	}
	return 0
}

func (s *Session) handleResponse(h *pdu.BHS, data []byte) error {
	var r pdu.SCSIResponse
	if err := r.Decode(h); err != nil {
		return err
	}
	res := Result{Status: r.Status, Residual: residual(r.Overflow, r.Underflow, r.Residual)}
	if r.Response != pdu.RespCompleted {
		s.finish(r.ITT, nil, fmt.Errorf("iscsi: target failure (response %#x)", r.Response))
		return nil
	}
	if len(data) >= 2 {
		n := int(binary.BigEndian.Uint16(data))
		if 2+n <= len(data) && n > 0 {
			if sn, err := scsi.ParseSense(data[2 : 2+n]); err == nil {
				res.Sense = sn
			}
		}
	}
	s.finish(r.ITT, &res, nil)
	return nil
}

// finish completes a task.
func (s *Session) finish(itt uint32, r *Result, err error) {
	s.mu.Lock()
	t := s.tasks[itt]
	if t == nil || t.ended {
		s.mu.Unlock()
		return
	}
	delete(s.tasks, itt)
	t.ended = true
	if r != nil {
		in := t.res.In
		t.res = *r
		t.res.In = in
		if t.link != nil && t.link.rdma && t.in != nil {
			// iSER: the data went by RDMA Write, no Data-In PDU counted
			// it; the residual says how much (RFC 5046 §7.3.5).
			t.res.In = max(len(t.in)-max(r.Residual, 0), 0)
			if r.Residual < 0 {
				t.res.In = len(t.in)
			}
		}
	}
	if t.link != nil {
		// The task's STags are invalidated (unless the target did) and
		// recycled (draft-ietf-ips-iwarp-da §9.9).
		t.link.dm.DeallocateTaskResources(itt)
	}
	t.err = err
	s.mu.Unlock()
	close(t.done)
}

// handleR2T sends the solicited Data-Out (RFC 7143 §11.8).
func (s *Session) handleR2T(l *link, h *pdu.BHS) error {
	var r pdu.R2T
	if err := r.Decode(h); err != nil {
		return err
	}
	s.mu.Lock()
	t := s.tasks[r.ITT]
	mx := l.params.maxXmit
	s.mu.Unlock()
	if t == nil {
		return nil
	}
	end := int(r.Offset) + int(r.Desired)
	if end > len(t.out) {
		s.finish(r.ITT, nil, fmt.Errorf("iscsi: R2T for [%d,%d) beyond the %d bytes to write", r.Offset, end, len(t.out)))
		return nil
	}
	// Not sent here: a receiver blocked writing Data-Out to a target
	// whose own receiver is blocked writing to us (an R2T, Data-In)
	// deadlocks the connection until a send times out (seen: 1 MiB
	// writes at QD 32 with reads beside them, 15 s stalls).
	select {
	case l.solicited <- solicitedData{t: t, ttt: r.TTT, from: int(r.Offset), to: end, mx: mx}:
	case <-l.done:
	}
	return nil
}

// maxSolicited bounds the R2Ts received and not yet answered on a
// connection: we ask for MaxOutstandingR2T=1, so a target keeps one per
// task, and a session holds fewer tasks than this. A target past it
// holds up our receiver, not our memory.
const maxSolicited = 1024

// solicitedData is an R2T's Data-Out to send: [from, to) of t's data.
type solicitedData struct {
	t            *task
	ttt          uint32
	from, to, mx int
}

// sendSolicited sends the Data-Out of the R2Ts the receiver hands it, in
// the order they came, until the connection ends.
func (l *link) sendSolicited() {
	for {
		select {
		case w := <-l.solicited:
			l.s.mu.Lock()
			live := l.s.tasks[w.t.itt] == w.t
			l.s.mu.Unlock()
			if !live {
				continue // finished or aborted meanwhile: its data may be the caller's again
			}
			if err := sendDataOut(l, w.t, w.ttt, w.from, w.to, w.mx); err != nil {
				l.dm.ConnectionTerminate()
			}
		case <-l.done:
			return
		}
	}
}

func sendDataOut(l *link, t *task, ttt uint32, from, to, mx int) error {
	var p datamover.PDU
	sn := uint32(0)
	for off := from; off < to; sn++ {
		n := min(to-off, mx)
		d := pdu.DataOut{Final: off+n == to, LUN: t.lun, ITT: t.itt, TTT: ttt, DataSN: sn, Offset: uint32(off)}
		d.Encode(&p.BHS)
		p.Data = t.out[off : off+n]
		if err := l.dm.SendControl(&p, false); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// ConnectionTerminateNotify implements datamover.Upcalls: the session
// recovers by reinstatement (ERL 0) unless it is closing.
func (l *link) ConnectionTerminateNotify(err error) {
	close(l.done)
	l.s.lose(l, err)
}

// install makes links the session's connections. A connection that ended
// before it was installed (its ConnectionTerminateNotify found it was not
// the session's yet) is lost now, so the session recovers as it would
// have a moment later.
func (s *Session) install(links []*link) {
	s.mu.Lock()
	s.links = links
	s.mu.Unlock()
	s.loseEnded(links)
}

// loseEnded calls lose for the first of links that has already ended.
func (s *Session) loseEnded(links []*link) {
	for _, l := range links {
		select {
		case <-l.done:
			s.lose(l, errors.New("the connection ended as it was logged in"))
			return
		default:
		}
	}
}

// lose handles the end of connection l: when l is one of the session's
// connections in full feature phase and the session is not closing, the
// others are dropped and the session recovers. A second call for the same
// loss finds l no longer the session's and does nothing.
func (s *Session) lose(l *link, err error) {
	s.mu.Lock()
	mine := false
	for _, x := range s.links {
		mine = mine || x == l
	}
	if !mine || s.closed || s.discovery || !l.ffp.Load() {
		s.mu.Unlock()
		return
	}
	others := s.links
	s.links = nil
	s.mu.Unlock()
	s.log.Warn("connection lost", "cid", l.cid, "err", err)
	// ERL 0: the loss of one connection fails the session (RFC 7143
	// §7.1.4); drop the others and reinstate.
	for _, x := range others {
		if x != l {
			x.dm.ConnectionTerminate()
		}
	}
	if err == nil {
		err = errors.New("the target closed the connection")
	}
	go s.recover(err)
}

// DataCompletionNotify and DataACKNotify implement datamover.Upcalls; the
// TCP datamover does not call them.
func (l *link) DataCompletionNotify(itt, ttt uint32) {}
func (l *link) DataACKNotify(itt, dataSN uint32)     {}

// recover reconnects with the same ISID (session reinstatement) and
// replays every unfinished command, with backoff, for up to
// RecoveryTimeout (RFC 7143 §6.3.5, ERL 0). lost is why the connection
// ended: the error the session fails with when recovery is disabled.
func (s *Session) recover(lost error) {
	deadline := time.Now().Add(s.opts.RecoveryTimeout)
	backoff := 100 * time.Millisecond
	lastErr := lost
	// The portal that was lost first, then the other paths (multipath
	// failover: Options.Paths), in turn.
	paths := []string{s.portal}
	for _, p := range s.opts.Paths {
		if p = withPort(p); !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	for try := 0; s.opts.RecoveryTimeout > 0 && time.Now().Before(deadline); try++ {
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return
		}
		// Only recover (one goroutine at a time) sets the portal after
		// Login, and only it dials then.
		s.portal = paths[try%len(paths)]
		links, err := s.connectAll(context.Background())
		if err == nil && s.portal != paths[0] {
			s.log.Warn("failed over to another path", "portal", s.portal, "lost", paths[0])
		}
		if err == nil {
			s.sendMu.Lock()
			s.mu.Lock()
			s.links = links
			var pending []*task
			for _, t := range s.tasks {
				pending = append(pending, t)
			}
			sort.Slice(pending, func(i, j int) bool { return serial.LessThan(pending[i].itt, pending[j].itt) })
			s.mu.Unlock()
			s.log.Info("session reinstated", "tsih", s.tsih, "replaying", len(pending))
			for _, t := range pending {
				s.mu.Lock()
				t.res = Result{}
				cmdSN := s.cmdSN
				if !t.imm {
					s.cmdSN++
				}
				l := s.pick()
				t.link = l
				s.mu.Unlock()
				if err := s.sendCommand(l, t, cmdSN); err != nil {
					break // the new link failed too; its notify recovers again
				}
			}
			s.sendMu.Unlock()
			s.mu.Lock()
			s.cond.Broadcast()
			s.mu.Unlock()
			s.loseEnded(links)
			return
		}
		lastErr = err
		if isLoginError(err) && len(paths) == 1 {
			break
		}
		if (try+1)%len(paths) == 0 {
			time.Sleep(backoff)
			backoff = min(2*backoff, 2*time.Second)
		}
	}
	s.fail(fmt.Errorf("iscsi: session lost and not recovered: %v", lastErr))
}

// fail ends the session with err: every waiting command returns it.
func (s *Session) fail(err error) {
	s.mu.Lock()
	s.closed = true
	s.stopOnce.Do(func() { close(s.stop) })
	s.failed = err
	tasks := s.tasks
	s.tasks = map[uint32]*task{}
	s.cond.Broadcast()
	s.mu.Unlock()
	for _, t := range tasks {
		if !t.ended {
			t.ended = true
			t.err = err
			close(t.done)
		}
	}
}

// Do runs one SCSI command on lun. out is the data-out payload (nil for
// none); in is the buffer for data-in (nil for none). A command that ends
// with a status other than GOOD returns its Result and a *SCSIError.
// Cancelling ctx aborts the command with ABORT TASK.
func (s *Session) Do(ctx context.Context, lun uint64, cdb []byte, out, in []byte) (Result, error) {
	if out != nil && in != nil {
		return Result{}, errors.New("iscsi: bidirectional commands are not supported")
	}
	t := &task{lun: scsi.EncodeLUN(lun), cdb: cdb, out: out, in: in, done: make(chan struct{})}
	if err := s.lockWindow(ctx, false); err != nil {
		return Result{}, err
	}
	t.itt = s.nextITT
	s.nextITT++
	if s.nextITT == pdu.ReservedITT {
		s.nextITT = 1
	}
	cmdSN := s.cmdSN
	s.cmdSN++
	s.tasks[t.itt] = t
	l := s.pick()
	t.link = l
	s.mu.Unlock()
	err := s.sendCommand(l, t, cmdSN)
	s.sendMu.Unlock()
	if err != nil {
		// The connection broke: recovery replays the command.
		s.log.Debug("send failed; waiting for recovery", "err", err)
	}
	select {
	case <-t.done:
	case <-ctx.Done():
		s.abort(t)
		return Result{}, ctx.Err()
	}
	if t.err != nil {
		return t.res, t.err
	}
	if t.res.Status != scsi.StatusGood {
		return t.res, &SCSIError{Status: t.res.Status, Sense: t.res.Sense}
	}
	return t.res, nil
}

// lockWindow waits for a connection and room in the command window and
// returns holding sendMu and mu. closing lets Close's Logout through.
func (s *Session) lockWindow(ctx context.Context, closing bool) error {
	stop := context.AfterFunc(ctx, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer stop()
	ready := func() bool { return len(s.links) > 0 && serial.LessOrEqual(s.cmdSN, s.max) }
	for {
		// Wait without holding sendMu (recovery needs it to replay).
		s.mu.Lock()
		for (closing || !s.closed) && !ready() && ctx.Err() == nil {
			s.cond.Wait()
		}
		s.mu.Unlock()
		s.sendMu.Lock()
		s.mu.Lock()
		if s.closed && !closing || ctx.Err() != nil {
			err := ctx.Err()
			if s.closed && !closing {
				err = ErrClosed
				if s.failed != nil {
					err = s.failed
				}
			}
			s.mu.Unlock()
			s.sendMu.Unlock()
			return err
		}
		if ready() {
			return nil
		}
		s.mu.Unlock()
		s.sendMu.Unlock()
	}
}

// sendUnexpected sends an immediate PDU (a TMF, a ping, a Logout, a Text
// Request). When the target's MaxOutstandingUnexpectedPDUs is reached
// (RFC 5046 §8.1.1.3: the initiator MUST NOT generate more) it goes as a
// regulated PDU instead: without the immediate flag, with the next CmdSN,
// once the command window has room. The target's answer to it retires
// the outstanding ones.
func (s *Session) sendUnexpected(ctx context.Context, l *link, p *datamover.PDU, closing bool) error {
	err := l.dm.SendControl(p, false)
	if !errors.Is(err, datamover.ErrUnexpectedLimit) {
		return err
	}
	s.log.Debug("the target's MaxOutstandingUnexpectedPDUs is reached; sending without the immediate flag",
		"op", p.BHS.Opcode())
	if err := s.lockWindow(ctx, closing); err != nil {
		return err
	}
	p.BHS.SetImmediate(false)
	p.BHS.SetCmdSN(s.cmdSN)
	s.cmdSN++
	s.mu.Unlock()
	err = l.dm.SendControl(p, true)
	s.sendMu.Unlock()
	return err
}

// sendCommand transmits a SCSI Command with its immediate data and any
// unsolicited Data-Out (RFC 7143 §11.3, §13.10-§13.14).
func (s *Session) sendCommand(l *link, t *task, cmdSN uint32) error {
	s.mu.Lock()
	pr := s.params
	s.mu.Unlock()
	edtl := len(t.out)
	if t.in != nil {
		edtl = len(t.in)
	}
	cmd := pdu.SCSICommand{Final: true, Read: t.in != nil, Write: t.out != nil, Attr: pdu.AttrSimple,
		LUN: t.lun, ITT: t.itt, EDTL: uint32(edtl), CmdSN: cmdSN}
	copy(cmd.CDB[:], t.cdb)
	var p datamover.PDU
	var ahs []byte
	if len(t.cdb) > 16 {
		ahs = pdu.AppendExtendedCDB(nil, t.cdb)
	}
	imm := 0
	mx := l.params.maxXmit
	if t.out != nil && pr.immediateData {
		imm = min(len(t.out), pr.firstBurst, mx)
	}
	unsolEnd := imm
	if t.out != nil && !pr.initialR2T {
		unsolEnd = min(len(t.out), pr.firstBurst)
	}
	cmd.Final = unsolEnd == imm
	cmd.Encode(&p.BHS)
	p.AHS = ahs
	p.Data = t.out[:imm]
	// The I/O buffers, for an RDMA datamover to register (draft-ietf-ips-iwarp-da
	// §11.3.1).
	p.DataOut, p.DataIn, p.UnsolicitedDataSize = t.out, t.in, unsolEnd
	if err := l.dm.SendControl(&p, !cmd.Immediate); err != nil {
		return err
	}
	if unsolEnd > imm {
		return sendDataOut(l, t, pdu.ReservedTTT, imm, unsolEnd, mx)
	}
	return nil
}

// abort sends ABORT TASK for t and waits for the answer, so that no data
// for t lands in its buffer after Do returns.
// pick chooses the connection for a new command (s.mu held).
func (s *Session) pick() *link {
	if len(s.links) == 0 {
		return nil
	}
	s.rr = (s.rr + 1) % len(s.links)
	return s.links[s.rr]
}

func (s *Session) abort(t *task) {
	s.mu.Lock()
	l := t.link
	if !s.hasLink(l) {
		l = s.pick()
	}
	if t.ended || l == nil {
		s.mu.Unlock()
		if l == nil {
			s.finish(t.itt, nil, context.Canceled)
		}
		return
	}
	itt := s.nextITT
	s.nextITT++
	ch := make(chan byte, 1)
	s.tmfs[itt] = ch
	tmf := pdu.TaskMgmtReq{Immediate: true, Function: pdu.TMFAbortTask, LUN: t.lun, ITT: itt, RTT: t.itt, CmdSN: s.cmdSN, RefCmdSN: s.cmdSN - 1}
	s.mu.Unlock()
	var p datamover.PDU
	tmf.Encode(&p.BHS)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if s.sendUnexpected(ctx, l, &p, false) == nil {
		select {
		case <-ch:
		case <-t.done:
		case <-time.After(10 * time.Second):
			// No answer: the connection is no longer trustworthy.
			l.dm.ConnectionTerminate()
			<-l.done
		}
	}
	s.mu.Lock()
	delete(s.tmfs, itt)
	s.mu.Unlock()
	s.finish(t.itt, nil, context.Canceled)
}

// pinger sends a NOP-Out when the target has been silent for NopInterval
// (RFC 7143 §11.18).
func (s *Session) pinger() {
	tick := time.NewTicker(s.opts.NopInterval / 2)
	defer tick.Stop()
	last := time.Now() // when a PDU was last heard, to within a tick
	for {
		var now time.Time
		select {
		case now = <-tick.C:
		case <-s.stop:
			return
		}
		if s.heard.Swap(false) {
			last = now
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		var l *link
		if len(s.links) > 0 {
			l = s.links[0]
		}
		if l == nil || now.Sub(last) < s.opts.NopInterval {
			s.mu.Unlock()
			continue
		}
		itt := s.nextITT
		s.nextITT++
		nop := pdu.NopOut{Immediate: true, ITT: itt, TTT: pdu.ReservedTTT, CmdSN: s.cmdSN}
		s.mu.Unlock()
		var p datamover.PDU
		nop.Encode(&p.BHS)
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.NopInterval)
		s.sendUnexpected(ctx, l, &p, false)
		cancel()
	}
}

// Close logs out (reason: close the session) and closes the connection.
func (s *Session) Close() error {
	s.sendMu.Lock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.sendMu.Unlock()
		return nil
	}
	s.closed = true
	s.stopOnce.Do(func() { close(s.stop) })
	var l *link
	if len(s.links) > 0 {
		l = s.links[0]
	}
	all := s.links
	ch := make(chan struct{})
	s.logoutCh = ch
	lo := pdu.LogoutReq{Immediate: true, Reason: pdu.LogoutCloseSession, ITT: s.nextITT, CmdSN: s.cmdSN}
	s.nextITT++
	s.cond.Broadcast()
	s.mu.Unlock()
	s.sendMu.Unlock()
	if l == nil {
		s.fail(ErrClosed)
		return nil
	}
	var p datamover.PDU
	lo.Encode(&p.BHS)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if err = s.sendUnexpected(ctx, l, &p, true); err == nil {
		select {
		case <-ch:
		case <-l.done:
			// The target closes right after its Logout Response; the
			// response may have been handled just before the close.
			select {
			case <-ch:
			default:
				err = errors.New("iscsi: connection closed before the Logout Response")
			}
		case <-time.After(10 * time.Second):
			err = errors.New("iscsi: no Logout Response")
		}
	}
	for _, x := range all {
		x.dm.ConnectionTerminate()
		<-x.done
	}
	s.fail(ErrClosed)
	return err
}

func (s *Session) hasLink(l *link) bool {
	for _, x := range s.links {
		if x == l {
			return true
		}
	}
	return false
}

// Target returns the target name.
func (s *Session) Target() string { return s.target }

// TSIH returns the target-assigned session handle.
func (s *Session) TSIH() uint16 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tsih
}

// Connections returns the number of connections the session has now.
func (s *Session) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.links)
}
