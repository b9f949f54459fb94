// NOP-Out and NOP-In (RFC 7143 §11.18, §11.19): answering pings, and the
// connection's own keep-alive — pinging a silent initiator, and ending a
// connection whose data or answers stall.

package iscsitarget

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/scsi"
)

type nopDelivery struct {
	c    *conn
	nop  pdu.NopOut
	data []byte
}

func (d *nopDelivery) enter() {}
func (d *nopDelivery) act() {
	if d.nop.ITT == pdu.ReservedITT {
		return
	}
	in := pdu.NopIn{LUN: d.nop.LUN, ITT: d.nop.ITT, TTT: pdu.ReservedTTT}
	var h pdu.BHS
	in.Encode(&h)
	if err := d.c.send(&h, d.data, true); err != nil {
		d.c.answerFailed(d.nop.ITT, err)
	}
}
func (d *nopDelivery) drop() {}

func (c *conn) handleNopOut(p *datamover.PDU) error {
	var n pdu.NopOut
	if err := n.Decode(&p.BHS); err != nil {
		return asReject(err)
	}
	if n.ITT == pdu.ReservedITT {
		// The answer to our ping (RFC 7143 §11.18.3).
		if n.TTT == c.pingTTT.Load() {
			c.pingOut.Store(false)
		}
		return nil
	}
	data := p.Data
	if mx := c.dm.MaxSendDataSegmentLength(); len(data) > mx {
		data = data[:mx]
	}
	d := &nopDelivery{c: c, nop: n, data: append([]byte(nil), data...)}
	c.sess.sequence(n.CmdSN, n.Immediate, d)
	return nil
}

// pinger sends NOP-In pings on idle connections and drops connections that
// stop answering (RFC 7143 §11.19: target-initiated NOP-In with a TTT).
func (c *conn) pinger() {
	iv := c.srv.opts.NopInterval
	// A discovery session holds one of a few places: one that asks
	// nothing for DiscoveryIdle ends, pinged or not.
	disc := c.sess != nil && c.sess.discovery
	// WRITEs whose data stops coming end (Options.DataTimeout).
	dt := c.srv.opts.DataTimeout
	checkData := dt > 0 && !disc
	if iv < 0 && !disc && !checkData {
		return
	}
	every := dt / 4
	switch {
	case iv >= 0:
		every = min(iv, c.srv.opts.NopTimeout) / 2
	case disc:
		every = c.srv.opts.DiscoveryIdle / 4
	}
	if checkData {
		every = min(every, dt/4)
	}
	// A WRITE that owes data and got none for stallTicks ticks has been
	// without it for DataTimeout at least.
	stallTicks := int((dt+every-1)/every) + 1
	tick := time.NewTicker(every)
	defer tick.Stop()
	// Linux's ib_iser gives a discovery session one receive buffer, posted
	// only when it sends a request (its login buffer, reused): a NOP-In
	// there meets Receiver Not Ready until the RC retries run out, and
	// the connection dies with a transport error. So an iSER discovery
	// session is never pinged; one silent for the ping's interval and
	// timeout together is over, and ends quietly.
	quiet := c.sess != nil && c.sess.discovery && c.onRDMA()
	ttt := uint32(0)
	// last is when a PDU was last heard, to within a tick (the tick that
	// found heard set); sent is when the ping awaiting its answer went.
	last, sent := time.Now(), time.Time{}
	lastAsked := last
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
		}
		now := time.Now()
		if c.heard.Swap(false) {
			last = now
		}
		if checkData && !c.checkData(stallTicks) {
			return
		}
		if iv < 0 && !disc {
			continue
		}
		if disc {
			if c.asked.Swap(false) {
				lastAsked = now
			}
			if now.Sub(lastAsked) > c.srv.opts.DiscoveryIdle {
				c.srv.discoveryIdle.Add(1)
				c.log.Info("ending a discovery session that asked for nothing", "idle", c.srv.opts.DiscoveryIdle)
				c.terminate()
				return
			}
			if iv < 0 {
				continue
			}
		}
		if quiet {
			if now.Sub(last) > iv+c.srv.opts.NopTimeout {
				c.log.Info("ending an idle iSER discovery session (it is not pinged: the initiator may have no receive posted)", "idle", iv+c.srv.opts.NopTimeout)
				c.terminate()
				return
			}
			continue
		}
		if c.pingOut.Load() {
			if now.Sub(sent) > c.srv.opts.NopTimeout {
				c.log.Warn("dropping connection: NOP-In ping unanswered", "timeout", c.srv.opts.NopTimeout)
				c.terminate()
				return
			}
			continue
		}
		if now.Sub(last) < iv {
			continue
		}
		ttt++
		if ttt == pdu.ReservedTTT {
			ttt = 1
		}
		c.pingTTT.Store(ttt)
		sent = now
		c.pingOut.Store(true)
		in := pdu.NopIn{ITT: pdu.ReservedITT, TTT: ttt}
		var h pdu.BHS
		in.Encode(&h)
		if err := c.send(&h, nil, false); err != nil {
			return
		}
	}
}

// checkData ends the tasks that owe Data-Out — an R2T outstanding, or
// unsolicited data announced (F=0) — and got none for stallTicks of the
// pinger's ticks: each is answered CHECK CONDITION, ABORTED COMMAND /
// INITIATOR RESPONSE TIMEOUT (SPC-4), and its buffer and I/O budget are
// freed, so a peer that answers pings but never sends the data it owes
// does not hold them for as long as it stays logged in. Data-Out that
// comes later for it is discarded, as after an abort. The second such
// end on one connection ends the connection (RFC 7143 §7.1.4: at ERL 0
// the session then recovers). False when the connection ends.
func (c *conn) checkData(stallTicks int) bool {
	type ended struct {
		t         *task
		itt       uint32
		expDataSN uint32
		edtl      uint32
		received  uint32
	}
	var late []ended
	c.mu.Lock()
	for _, t := range c.tasks {
		owed := t.unsolOpen
		for i := range t.bursts {
			owed = owed || t.bursts[i].live
		}
		if !owed || t.executing || t.aborted || t.released || t.full || t.received != t.seen {
			t.seen, t.stalled = t.received, 0
			continue
		}
		if t.stalled++; t.stalled >= stallTicks {
			t.aborted = true
			late = append(late, ended{t: t, itt: t.itt, expDataSN: t.dataSN + t.r2tSN, edtl: t.edtl, received: t.received})
		}
	}
	c.mu.Unlock()
	for _, e := range late {
		c.srv.dataTimeouts.Add(1)
		c.dataTimeouts++
		c.log.Warn("ending a WRITE whose data stopped coming", "itt", fmt.Sprintf("%#x", e.itt), "received", e.received,
			"edtl", e.edtl, "timeout", c.srv.opts.DataTimeout)
		c.release(e.t, false)
		sense := (&scsi.Sense{Key: scsi.SenseAbortedCommand, ASC: 0x4b, ASCQ: 0x06}).AppendFixed(make([]byte, 2, 2+scsi.FixedLen))
		binary.BigEndian.PutUint16(sense, uint16(len(sense)-2))
		r := pdu.SCSIResponse{ITT: e.itt, Response: pdu.RespCompleted, Status: scsi.StatusCheckCondition, ExpDataSN: e.expDataSN}
		var h pdu.BHS
		r.Encode(&h)
		if err := c.send(&h, sense, true); err != nil {
			return false
		}
	}
	if len(late) > 0 && c.dataTimeouts > 1 {
		c.log.Warn("dropping connection: the data of its WRITEs stopped coming again", "timeout", c.srv.opts.DataTimeout)
		c.terminate()
		return false
	}
	return true
}

// requestLogout sends an Async Message asking the initiator to log out
// within wait seconds (RFC 7143 §11.9.1, event 1).
func (c *conn) requestLogout(wait int) {
	c.mu.Lock()
	if !c.ffp.Load() {
		// Still logging in: finishLogin asks once the final response is
		// out; a login that never finishes times out.
		c.logoutAsked = wait
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	if c.sess.discovery {
		c.terminate()
		return
	}
	m := pdu.AsyncMsg{Event: pdu.AsyncLogoutRequest, Parameter3: uint16(wait)}
	var h pdu.BHS
	m.Encode(&h)
	if err := c.send(&h, nil, true); err != nil {
		c.terminate()
	}
}

// drainAndClose gives the connection's commands up to drainWait to
// complete and answer, then drops the connection; commands still waiting
// for data-out then end unanswered, executing ones still run to the end
// (ConnectionTerminateNotify waits for them).
func (c *conn) drainAndClose() {
	go func() {
		done := make(chan struct{})
		go func() { c.inflight.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(drainWait):
		}
		c.terminate()
	}()
}

const drainWait = 5 * time.Second
