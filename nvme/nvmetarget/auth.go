package nvmetarget

import (
	"crypto/hmac"
	"crypto/rand"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blockwire/blockwire/nvme"
	"github.com/blockwire/blockwire/nvme/dhchap"
)

// In-band authentication, DH-HMAC-CHAP (NVMe Base 2.0, "Authentication";
// the controller's side). A host the subsystem (or the discovery
// controller) has a secret for must authenticate every queue it
// connects: Connect answers with AUTHREQ.ATR set, and until the queue
// has authenticated it takes Authentication Send and Receive alone —
// anything else is refused with Authentication Required, the admin
// queue's Property Set of CC.EN included. The exchange: the host's
// AUTH_Negotiate (the controller picks the strongest hash and
// Diffie-Hellman group both offer), the controller's challenge, the
// host's reply (its response, and with a controller secret configured,
// its own challenge: bidirectional), the controller's Success1 (with its
// response), the host's Success2. A wrong response gets AUTH_Failure1 and
// the queue's connection closed. A queue that has not authenticated
// within Options.AuthTimeout is closed (nothing a host that cannot authenticate
// starts is held longer). A queue that has authenticated may
// authenticate again (a new AUTH_Negotiate).

// AuthKeys are the secrets of one host: Host, the host's own (it proves
// itself with it); Ctrl, the controller's (it proves itself to a host
// that asks), nil where the host may not ask.
type AuthKeys struct {
	Host, Ctrl *dhchap.Secret
}

// statusAuthRequired: the queue has not authenticated yet.
var statusAuthRequired = nvme.MakeStatus(nvme.SCTCommandSpecific, 0x91, true)

// DefaultAuthTimeout is Options.AuthTimeout's default.
const DefaultAuthTimeout = 10 * time.Second

// Authentication states of a queue.
const (
	authNegotiate = iota // waiting for AUTH_Negotiate
	authChallenge        // the next Receive gets the challenge
	authReply            // waiting for the reply
	authSuccess1         // the next Receive gets Success1
	authSuccess2         // waiting for Success2 (bidirectional)
	authFailure1         // the next Receive gets AUTH_Failure1
	authDone
	authFailed
)

// queueAuth is one queue's authentication. mu guards the fields (lock
// order: alone).
type queueAuth struct {
	keys   AuthKeys
	done   atomic.Bool // authenticated: every command is allowed
	mu     sync.Mutex
	state  int
	tid    uint16
	hash   dhchap.Hash
	group  dhchap.Group
	seq    uint32
	c      []byte // the controller's challenge
	kp     *dhchap.KeyPair
	resp   []byte // the controller's response (bidirectional)
	reason uint8
	timer  *time.Timer
}

// authKeys are the secrets of host for s (nil: it need not
// authenticate).
func (s *Subsystem) authKeys(host string) *AuthKeys {
	f := s.cfg.Auth
	if s.discovery {
		f = s.t.o.DiscoveryAuth
	}
	if f == nil {
		return nil
	}
	k := f(host)
	if k.Host == nil {
		return nil
	}
	return &k
}

// startAuth makes q authenticate before anything else when its host has
// a secret; it returns AUTHREQ for Connect's DW0.
func (q *Queue) startAuth() uint32 {
	k := q.c.s.authKeys(q.c.hostNQN)
	if k == nil {
		return 0
	}
	a := &queueAuth{keys: *k}
	conn := q.conn
	a.timer = time.AfterFunc(q.c.s.t.o.AuthTimeout, func() {
		if !a.done.Load() {
			q.c.log.Warn("NVMe authentication timed out: queue closed", "qid", q.qid)
			q.c.s.t.refuse("authentication timed out")
			conn.Close()
		}
	})
	q.auth = a
	return 1 << 17 // AUTHREQ.ATR
}

// authenticated reports whether q may run any command.
func (q *Queue) authenticated() bool { return q.auth == nil || q.auth.done.Load() }

// authFields checks Authentication Send/Receive's SECP, SPSP0, SPSP1 and
// its transfer or allocation length against the data.
func authFields(c *nvme.Command, n int) bool {
	w := c.CDW[0]
	return byte(w>>24) == dhchap.SECP && byte(w>>8) == dhchap.SPSP0 && byte(w>>16) == dhchap.SPSP1 && int(c.CDW[1]) == n
}

// authSend executes Authentication Send: a message from the host.
func (q *Queue) authSend(c *nvme.Command, data []byte) Result {
	a := q.auth
	if a == nil {
		return fail(nvme.StatusInvalidField) // the host has no secret here: nothing to authenticate with
	}
	if !authFields(c, len(data)) {
		return fail(nvme.StatusInvalidField)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	typ, id, tid, err := dhchap.Header(data)
	if err != nil {
		return a.fail1(dhchap.ReasonIncorrectPayload)
	}
	switch {
	case typ == dhchap.TypeCommon && id == dhchap.IDNegotiate:
		if a.state == authDone {
			a.state = authNegotiate // authenticating again
		}
		if a.state != authNegotiate {
			return a.fail1(dhchap.ReasonIncorrectProtocol)
		}
		var n dhchap.Negotiate
		err := n.Decode(data)
		a.tid = tid
		switch {
		case err != nil:
			return a.fail1(dhchap.ReasonIncorrectPayload)
		case n.SCC != 0:
			return a.fail1(dhchap.ReasonSCCMismatch)
		case !n.Offered:
			return a.fail1(dhchap.ReasonProtocolUnusable)
		}
		a.hash, a.group = 0, 255
		for _, h := range dhchap.Hashes() {
			if slices.Contains(n.Hashes, h) {
				a.hash = h
				break
			}
		}
		for _, g := range dhchap.Groups() {
			if slices.Contains(n.Groups, g) {
				a.group = g
				break
			}
		}
		switch {
		case a.hash == 0:
			return a.fail1(dhchap.ReasonHashUnusable)
		case a.group == 255:
			return a.fail1(dhchap.ReasonGroupUnusable)
		}
		a.state = authChallenge
		return Result{}
	case typ == dhchap.TypeDHCHAP && id == dhchap.IDReply:
		if a.state != authReply {
			return a.fail1(dhchap.ReasonIncorrectProtocol)
		}
		var r dhchap.Reply
		if err := r.Decode(data, a.hash); err != nil || r.TID != a.tid {
			return a.fail1(dhchap.ReasonIncorrectPayload)
		}
		var dh []byte
		if a.kp != nil {
			var err error
			if dh, err = a.kp.Secret(r.DH); err != nil {
				return a.fail1(dhchap.ReasonFailed)
			}
		} else if len(r.DH) != 0 {
			return a.fail1(dhchap.ReasonIncorrectPayload)
		}
		sub := q.c.s.nqn
		want := dhchap.Response(*a.keys.Host, a.hash, "HostHost", a.c, a.seq, a.tid, q.c.hostNQN, sub, dh)
		if !hmac.Equal(want, r.R) {
			q.c.log.Warn("NVMe authentication failed: wrong response", "qid", q.qid)
			return a.fail1(dhchap.ReasonFailed)
		}
		a.resp = nil
		if r.CValid {
			if a.keys.Ctrl == nil {
				q.c.log.Warn("NVMe authentication failed: the host asks the controller to authenticate, and it has no secret for that", "qid", q.qid)
				return a.fail1(dhchap.ReasonFailed)
			}
			a.resp = dhchap.Response(*a.keys.Ctrl, a.hash, "Controller", r.C, r.Seq, a.tid, sub, q.c.hostNQN, dh)
		}
		a.state = authSuccess1
		return Result{}
	case typ == dhchap.TypeDHCHAP && id == dhchap.IDSuccess2:
		if a.state != authSuccess2 || tid != a.tid {
			return a.fail1(dhchap.ReasonIncorrectProtocol)
		}
		a.succeed(q)
		return Result{}
	case typ == dhchap.TypeCommon && id == dhchap.IDFailure2:
		if a.state != authSuccess2 {
			return a.fail1(dhchap.ReasonIncorrectProtocol)
		}
		// The host did not accept the controller's response.
		q.c.log.Warn("NVMe authentication: the host refused the controller's response", "qid", q.qid)
		a.state = authFailed
		a.closeSoon(q)
		return Result{}
	}
	return a.fail1(dhchap.ReasonIncorrectProtocol)
}

// authRecv executes Authentication Receive: the controller's message.
func (q *Queue) authRecv(c *nvme.Command, data []byte) Result {
	a := q.auth
	if a == nil {
		return fail(nvme.StatusInvalidField)
	}
	if !authFields(c, len(data)) {
		return fail(nvme.StatusInvalidField)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var msg []byte
	switch a.state {
	case authChallenge:
		a.c = make([]byte, a.hash.Len())
		rand.Read(a.c)
		a.seq = q.c.s.nextAuthSeq()
		var err error
		if a.kp, err = dhchap.NewKeyPair(a.group); err != nil {
			a.reason = dhchap.ReasonFailed
			a.state = authFailure1
			msg = dhchap.Failure(dhchap.IDFailure1, a.tid, a.reason)
			break
		}
		ch := dhchap.Challenge{TID: a.tid, Hash: a.hash, Group: a.group, Seq: a.seq, C: a.c}
		if a.kp != nil {
			ch.DH = a.kp.Public
		}
		msg = ch.Append(nil)
		a.state = authReply
	case authSuccess1:
		s := dhchap.Success1{TID: a.tid, HL: uint8(a.hash.Len())}
		if a.resp != nil {
			s.RValid, s.R = true, a.resp
			a.state = authSuccess2
		} else {
			a.succeed(q)
		}
		msg = s.Append(nil)
	case authFailure1:
		msg = dhchap.Failure(dhchap.IDFailure1, a.tid, a.reason)
		a.state = authFailed
		a.closeSoon(q)
	default:
		msg = dhchap.Failure(dhchap.IDFailure1, a.tid, dhchap.ReasonIncorrectProtocol)
		a.state = authFailed
		a.closeSoon(q)
	}
	if len(msg) > len(data) {
		return fail(nvme.StatusInvalidField)
	}
	return Result{N: copy(data, msg)}
}

// fail1 ends the exchange: the Send completes, the next Receive gets
// AUTH_Failure1 with reason, and the connection is closed after it.
func (a *queueAuth) fail1(reason uint8) Result {
	a.state, a.reason = authFailure1, reason
	return Result{}
}

// succeed marks the queue authenticated.
func (a *queueAuth) succeed(q *Queue) {
	a.state = authDone
	a.kp, a.c, a.resp = nil, nil, nil
	if !a.done.Load() {
		q.c.log.Info("NVMe queue authenticated", "qid", q.qid, "hash", a.hash, "dhgroup", a.group)
	}
	a.done.Store(true)
	if a.timer != nil {
		a.timer.Stop()
	}
}

// closeSoon closes the queue's connection once the failure message has
// had time to leave (the host reads it, then sees the connection end).
func (a *queueAuth) closeSoon(q *Queue) {
	a.done.Store(false)
	q.c.s.t.refuse("authentication failed")
	conn := q.conn
	time.AfterFunc(100*time.Millisecond, func() { conn.Close() })
}

// nextAuthSeq is the next sequence number of the subsystem's challenges
// (never 0).
func (s *Subsystem) nextAuthSeq() uint32 {
	for {
		v := s.authSeq.Add(1)
		if v != 0 {
			return v
		}
	}
}
