// Logout (RFC 7143 §11.14, §11.15): closing a connection or the session.

package iscsitarget

import (
	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/iscsi/pdu"
)

type logoutDelivery struct {
	c   *conn
	req pdu.LogoutReq
}

func (d *logoutDelivery) drop()  {}
func (d *logoutDelivery) enter() {}

// act runs the Logout on a goroutine of its own (it waits for the
// connections' tasks), or, at the connection's bound, answers "cleanup
// failed" (RFC 7143 §11.15.1).
func (d *logoutDelivery) act() {
	var no pdu.BHS
	(&pdu.LogoutResp{ITT: d.req.ITT, Response: pdu.LogoutRespCleanupFailed}).Encode(&no)
	d.c.goBounded("Logout", func() { d.c.logout(d.req) }, &no)
}

func (c *conn) handleLogout(p *datamover.PDU) error {
	var req pdu.LogoutReq
	if err := req.Decode(&p.BHS); err != nil {
		return asReject(err)
	}
	c.sess.sequence(req.CmdSN, req.Immediate, &logoutDelivery{c: c, req: req})
	return nil
}

// logout carries out a Logout Request (RFC 7143 §11.14): the response is
// sent after the affected connections' commands have completed.
func (c *conn) logout(req pdu.LogoutReq) {
	resp := pdu.LogoutResp{ITT: req.ITT, Time2Wait: c.conf.DefaultTime2Wait, Time2Retain: c.conf.DefaultTime2Retain}
	closeSelf := false
	switch req.Reason {
	case pdu.LogoutCloseSession:
		for _, o := range c.sess.connList() {
			o.inflight.Wait()
		}
		closeSelf = true
	case pdu.LogoutCloseConnection:
		if req.CID == c.cid {
			c.inflight.Wait()
			closeSelf = true
		} else {
			var other *conn
			for _, o := range c.sess.connList() {
				if o.cid == req.CID {
					other = o
				}
			}
			if other == nil {
				resp.Response = pdu.LogoutRespCIDNotFound
			} else {
				other.mu.Lock()
				other.loggedOut = true
				other.mu.Unlock()
				other.inflight.Wait()
				other.terminate()
			}
		}
	case pdu.LogoutRecovery:
		resp.Response = pdu.LogoutRespNoRecovery
	}
	if closeSelf {
		c.mu.Lock()
		c.loggedOut = req.Reason == pdu.LogoutCloseConnection
		c.mu.Unlock()
		if ss := c.sess; ss.nexus != nil && (req.Reason == pdu.LogoutCloseSession || len(ss.connList()) == 1) {
			// The I_T nexus ends with this response: what it held
			// (SPC-2 reservations, medium removal prevention) is
			// released first, so the initiator's next command through
			// another nexus already sees it free.
			ss.tgt.Device.ReleaseNexus(ss.nexus)
		}
	}
	var h pdu.BHS
	resp.Encode(&h)
	c.send(&h, nil, true)
	if closeSelf {
		c.log.Info("logout", "reason", req.Reason)
		if req.Reason == pdu.LogoutCloseSession {
			for _, o := range c.sess.connList() {
				if o != c {
					o.mu.Lock()
					o.loggedOut = true
					o.mu.Unlock()
					o.terminate()
				}
			}
		}
		c.terminate()
	}
}
