// Text Request and Response in full feature phase (RFC 7143 §11.10,
// §11.11): renegotiation and SendTargets.

package iscsitarget

import (
	"net"
	"slices"
	"strconv"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/iscsi/text"
)

type textDelivery struct {
	c   *conn
	req pdu.TextReq
	kvs []text.KV
}

func (d *textDelivery) drop() {}

// funcDelivery runs fn when its command's CmdSN comes up.
type funcDelivery struct{ fn func() }

func (d *funcDelivery) enter() {}
func (d *funcDelivery) act()   { d.fn() }
func (d *funcDelivery) drop()  {}

func (d *textDelivery) enter() {}
func (d *textDelivery) act() {
	c := d.c
	var out []byte
	for _, kv := range d.kvs {
		if kv.Key == "SendTargets" {
			out = c.sendTargets(out, kv.Value)
		}
	}
	var rest []text.KV
	for _, kv := range d.kvs {
		if kv.Key != "SendTargets" {
			rest = append(rest, kv)
		}
	}
	if len(rest) > 0 {
		// Full feature phase renegotiation (RFC 7143 §6.2): only keys
		// without the InitializeOnly restriction may change.
		neg := text.NewNegotiator(c.srv.localKeys(), false)
		ans, err := neg.Respond(rest, text.Context{Login: false})
		if err == nil {
			out = text.Append(out, ans...)
			if v, ok := neg.Peer("MaxRecvDataSegmentLength"); ok {
				if n, err := text.ParseNumber(v); err == nil {
					c.setMaxXmit(int(n))
				}
			}
		}
	}
	c.textOut = out
	c.sendTextChunk(d.req.ITT, d.req.LUN)
}

func (c *conn) setMaxXmit(n int) {
	c.dm.NoticeKeyValues(datamover.Params{MaxXmitDataSegmentLength: n})
}

// sendTextChunk sends the next part of a text response, continuing with C=1
// when it does not fit the initiator's MaxRecvDataSegmentLength (RFC 7143
// §11.11.2).
func (c *conn) sendTextChunk(itt uint32, lun [8]byte) {
	out := c.textOut
	mx := c.dm.MaxSendDataSegmentLength()
	r := pdu.TextResp{ITT: itt, LUN: lun, TTT: pdu.ReservedTTT, Final: true}
	if len(out) > mx {
		c.textTTT++
		if c.textTTT == pdu.ReservedTTT {
			c.textTTT = 1
		}
		r.Final, r.Continue, r.TTT = false, true, c.textTTT
		c.textOut = out[mx:]
		out = out[:mx]
	} else {
		c.textOut = nil
	}
	var h pdu.BHS
	r.Encode(&h)
	c.send(&h, out, true)
}

func (c *conn) handleText(p *datamover.PDU) error {
	var req pdu.TextReq
	if err := req.Decode(&p.BHS); err != nil {
		return asReject(err)
	}
	if req.TTT != pdu.ReservedTTT {
		// Continuation of a long response, or of the initiator's text.
		if req.TTT != c.textTTT || (c.textOut == nil && c.textIn == nil) {
			return reject(pdu.RejectInvalidPDUField, "iscsi: Text Request with unknown TTT %#x (RFC 7143 §11.10.4)", req.TTT)
		}
		if c.textOut != nil && len(p.Data) == 0 {
			// A request like any other: it takes its CmdSN (RFC 7143
			// §4.2.2.1), so it waits for its turn and moves ExpCmdSN.
			c.sess.sequence(req.CmdSN, req.Immediate, &funcDelivery{func() { c.sendTextChunk(req.ITT, req.LUN) }})
			return nil
		}
	} else {
		c.textOut = nil
	}
	if len(c.textIn)+len(p.Data) > text.MaxTextLen {
		c.textIn = nil
		return reject(pdu.RejectProtocolError, "iscsi: text request exceeds %d bytes", text.MaxTextLen)
	}
	c.textIn = append(c.textIn, p.Data...)
	if req.Continue || !req.Final {
		// More text follows: acknowledge with an empty response and a TTT
		// (RFC 7143 §11.10.2).
		c.textTTT++
		if c.textTTT == pdu.ReservedTTT {
			c.textTTT = 1
		}
		r := pdu.TextResp{ITT: req.ITT, LUN: req.LUN, TTT: c.textTTT}
		c.sess.sequence(req.CmdSN, req.Immediate, &funcDelivery{func() {
			var h pdu.BHS
			r.Encode(&h)
			c.send(&h, nil, true)
		}})
		return nil
	}
	kvs, err := text.Parse(c.textIn)
	c.textIn = nil
	if err != nil {
		return reject(pdu.RejectProtocolError, "%v", err)
	}
	c.sess.sequence(req.CmdSN, req.Immediate, &textDelivery{c: c, req: req, kvs: kvs})
	return nil
}

// sendTargets appends the SendTargets answer (RFC 7143 Appendix C).
func (c *conn) sendTargets(out []byte, which string) []byte {
	var list []*Target
	switch {
	case which == "All" && c.sess.discovery:
		list = c.srv.targetList()
	case which == "All" || which == "":
		if !c.sess.discovery {
			list = []*Target{c.sess.tgt}
		}
	default:
		if t := c.srv.target(which); t != nil {
			list = []*Target{t}
		}
	}
	local := c.dm.LocalAddr()
	for _, t := range list {
		if !t.allows(c.sess.initiator) || !t.admitsFrom(c.sess.initiator, c.dm.RemoteAddr()) || !t.onPortal(local) {
			continue
		}
		out = text.Append(out, text.KV{Key: "TargetName", Value: t.Name})
		for _, a := range c.srv.portalAddrs(local) {
			if t.onPortal(a) {
				out = text.Append(out, text.KV{Key: "TargetAddress", Value: a + "," + strconv.Itoa(int(t.TPGT))})
			}
		}
	}
	return out
}

// portalAddrs lists the portals, replacing wildcard listen addresses with
// the address the initiator reached.
func (s *Server) portalAddrs(local string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, p := range s.portals {
		host, port, err := net.SplitHostPort(p)
		if err != nil {
			continue
		}
		ip := net.ParseIP(host)
		if ip == nil || ip.IsUnspecified() {
			if lh, _, err := net.SplitHostPort(local); err == nil {
				host = lh
			}
		}
		// One address, once: an iSCSI/TCP portal and an iSER portal on an
		// RDMA device may share it.
		if a := net.JoinHostPort(host, port); !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}
