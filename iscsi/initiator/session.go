package initiator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/internal/serial"
	"github.com/blockwire/blockwire/iscsi/auth"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/iscsi/text"
)

// ErrClosed is returned by commands on a closed session.
var ErrClosed = errors.New("iscsi: session closed")

// Session is a logged-in normal session with one target. It is safe for
// concurrent use: commands from several goroutines are pipelined up to the
// target's command window.
type Session struct {
	opts   Options
	portal string
	target string
	// discovery: a discovery session, which is not reinstated when its
	// connection ends.
	discovery bool
	isid      [6]byte
	// portals are those the session has logged in to (Portals), in
	// order; guarded by mu.
	portals []string
	log     slogger
	sendMu  sync.Mutex // orders CmdSN assignment with transmission
	mu      sync.Mutex
	cond    *sync.Cond
	links   []*link // the session's connections; links[0] is the leading one
	rr      int     // round-robin position for new commands
	tsih    uint16
	params  params
	cmdSN   uint32
	exp     uint32 // ExpCmdSN
	max     uint32 // MaxCmdSN
	nextITT uint32
	tasks   map[uint32]*task
	tmfs    map[uint32]chan byte
	closed  bool
	failed  error
	// expStatSN is read by the stamper under the datamover's lock.
	expStatSN atomic.Uint32
	// heard is set by every PDU received and cleared by the pinger at
	// each tick: no clock read per PDU, and idleness measured on the
	// monotonic clock, which a step of the wall clock does not move.
	heard    atomic.Bool
	logoutCh chan struct{}
	// stop is closed when the session closes (closed set): the pinger
	// ends then, not at its next tick.
	stop     chan struct{}
	stopOnce sync.Once
}

type slogger = interface {
	Info(msg string, args ...any)
	Warn(msg string, args ...any)
	Debug(msg string, args ...any)
}

// params are the negotiated values the initiator acts on.
type params struct {
	immediateData bool
	initialR2T    bool
	firstBurst    int
	maxBurst      int
	maxXmit       int // the target's MaxRecvDataSegmentLength (per connection)
	maxConns      int
	headerDigest  bool
	dataDigest    bool
}

type task struct {
	itt   uint32
	lun   [8]byte
	cdb   []byte
	out   []byte
	in    []byte
	imm   bool
	link  *link // the connection the command went out on (allegiance)
	done  chan struct{}
	res   Result
	err   error
	ended bool
}

// link is one TCP connection of the session; a new one replaces it after
// a connection loss. It implements datamover.Upcalls.
type link struct {
	s       *Session
	dm      datamover.Conn
	cid     uint16
	leading bool
	loginCh chan *datamover.PDU
	textCh  chan *datamover.PDU // Text Responses in full feature phase
	done    chan struct{}
	// solicited carries the R2Ts received to the goroutine that sends
	// their Data-Out (sendSolicited), so the receiver goes on reading
	// while the data goes out.
	solicited chan solicitedData
	ffp       atomic.Bool
	keys      map[string]string // the target's login keys so far (Serve goroutine)
	rdma      bool              // the datamover is iSER
	offers    map[string]string
	chapAlg   int
	// Set by the receive goroutine on the final login response.
	params   params
	finalExp uint32
	finalMax uint32
}

// Login connects to portal ("host:port", port 3260 by default) and logs
// in to target.
func Login(ctx context.Context, portal, target string, opts Options) (*Session, error) {
	opts.defaults()
	s := &Session{
		opts:    opts,
		portal:  withPort(portal),
		target:  target,
		isid:    opts.ISID,
		log:     opts.Logger.With("target", target, "portal", portal),
		tasks:   map[uint32]*task{},
		tmfs:    map[uint32]chan byte{},
		cmdSN:   1,
		nextITT: 1,
		stop:    make(chan struct{}),
	}
	if s.isid == ([6]byte{}) {
		s.isid = newISID()
	}
	s.cond = newCond(s)
	links, err := s.connectAll(ctx)
	if err != nil {
		return nil, err
	}
	s.install(links)
	if opts.NopInterval > 0 {
		go s.pinger()
	}
	return s, nil
}

// Portals are the portals the session has logged in to so far: its
// first, and those recovery failed over to (Options.Paths). A command the
// session sent may have reached any of them.
func (s *Session) Portals() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.portals)
}

func withPort(p string) string {
	if _, _, err := net.SplitHostPort(p); err == nil {
		return p
	}
	if strings.HasPrefix(p, "[") && strings.HasSuffix(p, "]") {
		return p + ":3260"
	}
	if strings.Count(p, ":") > 1 {
		return "[" + p + "]:3260"
	}
	return p + ":3260"
}

// connectAll logs in the leading connection (TSIH 0, the same ISID, so a
// reconnect reinstates the session, RFC 7143 §6.3.5) and then adds up to
// Options.Connections-1 more (RFC 7143 §4.4: MC/S), as many as the
// negotiated MaxConnections allows.
func (s *Session) connectAll(ctx context.Context) ([]*link, error) {
	s.mu.Lock()
	s.tsih = 0
	s.mu.Unlock()
	l, err := s.connect(ctx, false, 0)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if !slices.Contains(s.portals, s.portal) {
		s.portals = append(s.portals, s.portal)
	}
	s.mu.Unlock()
	links := []*link{l}
	want := min(max(s.opts.Connections, 1), s.params.maxConns)
	for cid := 1; cid < want; cid++ {
		m, err := s.connect(ctx, false, uint16(cid))
		if err != nil {
			s.log.Warn("could not add a connection to the session", "cid", cid, "err", err)
			break
		}
		links = append(links, m)
	}
	return links, nil
}

// connect dials and logs in one connection with CID cid: the leading one
// when s.tsih is 0, else an additional connection of the session.
func (s *Session) connect(ctx context.Context, discovery bool, cid uint16) (*link, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.DialTimeout)
	defer cancel()
	l := &link{s: s, cid: cid, loginCh: make(chan *datamover.PDU, 4), textCh: make(chan *datamover.PDU, 4), done: make(chan struct{}), keys: map[string]string{},
		solicited: make(chan solicitedData, maxSolicited)}
	if s.opts.Dialer == nil {
		return nil, errors.New("iscsi: Options.Dialer is nil (fabric.Dialer connects over TCP and iSER)")
	}
	est, err := s.opts.Dialer.Dial(ctx, s.portal, datamover.DialParams{ISER: s.opts.ISER, Preference: s.opts.pref,
		HasPreference: s.opts.prefSet, Logger: s.opts.Logger})
	if err != nil {
		return nil, err
	}
	l.dm, l.rdma = est.Open(s.stamp), est.Kind.RDMA()
	go l.dm.Serve(l)
	go l.sendSolicited()
	stop := context.AfterFunc(ctx, l.dm.ConnectionTerminate)
	err = s.login(ctx, l, discovery)
	stop()
	if err != nil {
		l.dm.ConnectionTerminate()
		<-l.done
		if ctx.Err() != nil && !isLoginError(err) {
			what := "target " + s.target
			if discovery {
				what = "a discovery session"
			}
			return nil, fmt.Errorf("iscsi: login to %s at %s: %w", what, s.portal, ctx.Err())
		}
		return nil, err
	}
	return l, nil
}

func isLoginError(err error) bool {
	var le *LoginError
	return errors.As(err, &le) || errors.Is(err, ErrTargetAuth)
}

// stamp fills ExpStatSN of every outgoing PDU; CmdSN is set
// by the sender under sendMu (datamover.Stamper).
func (s *Session) stamp(h *pdu.BHS, _ bool) {
	h.SetExpStatSN(s.expStatSN.Load())
}

// login runs the login phase on l (RFC 7143 §6.3).
func (s *Session) login(ctx context.Context, l *link, discovery bool) error {
	o := s.opts
	decl := []text.KV{{Key: "InitiatorName", Value: o.InitiatorName}}
	if discovery {
		decl = append(decl, text.KV{Key: "SessionType", Value: "Discovery"})
	} else {
		decl = append(decl, text.KV{Key: "TargetName", Value: s.target}, text.KV{Key: "SessionType", Value: "Normal"})
	}
	digest := func(on bool) string {
		if on {
			return "CRC32C"
		}
		return "None"
	}
	ops := []text.KV{
		{Key: "HeaderDigest", Value: digest(o.HeaderDigest)},
		{Key: "DataDigest", Value: digest(o.DataDigest)},
		{Key: "MaxRecvDataSegmentLength", Value: strconv.Itoa(o.MaxRecvDataSegmentLength)},
		{Key: "DefaultTime2Wait", Value: "0"},
		{Key: "DefaultTime2Retain", Value: "0"},
		{Key: "ErrorRecoveryLevel", Value: "0"},
		{Key: "IFMarker", Value: "No"},
		{Key: "OFMarker", Value: "No"},
	}
	s.mu.Lock()
	l.leading = s.tsih == 0
	tsih := s.tsih
	s.mu.Unlock()
	if !discovery && l.leading {
		ops = append(ops,
			text.KV{Key: "InitialR2T", Value: "No"},
			text.KV{Key: "ImmediateData", Value: "Yes"},
			text.KV{Key: "MaxBurstLength", Value: "16776192"},
			text.KV{Key: "FirstBurstLength", Value: "262144"},
			text.KV{Key: "MaxOutstandingR2T", Value: "1"},
			text.KV{Key: "MaxConnections", Value: strconv.Itoa(max(s.opts.Connections, 1))},
			text.KV{Key: "DataPDUInOrder", Value: "Yes"},
			text.KV{Key: "DataSequenceInOrder", Value: "Yes"},
		)
	}
	if l.rdma && !discovery {
		// RFC 5046 §6: RDMA extensions, and the data segment sizes of
		// control-type PDUs in each direction (our receive buffers hold
		// iser.Options.RecvDataSize bytes).
		if l.leading {
			ops = append(ops, text.KV{Key: "RDMAExtensions", Value: "Yes"})
		}
		ops = append(ops, text.KV{Key: "InitiatorRecvDataSegmentLength", Value: "8192"},
			text.KV{Key: "TargetRecvDataSegmentLength", Value: "8192"})
		if rb, ok := l.dm.(datamover.ReceiveBudget); ok {
			// RFC 5046 §6.7, §8.1.2: how many unexpected PDUs (Async
			// Messages, Rejects, pings) our receive buffers take.
			ops = append(ops, text.KV{Key: "MaxOutstandingUnexpectedPDUs", Value: strconv.Itoa(rb.MaxOutstandingUnexpectedPDUs())})
		}
	}
	l.offers = map[string]string{}
	for _, kv := range ops {
		l.offers[kv.Key] = kv.Value
	}
	stage := byte(pdu.StageOperational)
	if o.CHAP != nil {
		stage = pdu.StageSecurity
	}
	itt := uint32(0)
	var send []text.KV
	send = append(send, decl...)
	var chapID byte
	var chapChallenge []byte
	chapStep := 0
	if stage == pdu.StageSecurity {
		send = append(send, text.KV{Key: "AuthMethod", Value: "CHAP,None"})
	} else {
		send = append(send, ops...)
	}
	neg := text.NewNegotiator(map[string]string{"HeaderDigest": digest(o.HeaderDigest), "DataDigest": digest(o.DataDigest)}, true)
	for round := 0; round < 16; round++ {
		req := pdu.LoginReq{
			Transit: true, CSG: stage, NSG: pdu.StageFullFeature, ISID: s.isid,
			TSIH: tsih, CID: l.cid, ITT: itt, CmdSN: s.cmdSN,
		}
		if stage == pdu.StageSecurity {
			req.NSG = pdu.StageOperational
			if chapStep < 2 {
				req.Transit = false
			}
		}
		resp, kvs, err := l.exchange(ctx, &req, send)
		if err != nil {
			return err
		}
		if resp.StatusClass != 0 {
			return &LoginError{resp.StatusClass, resp.StatusDetail}
		}
		get := func(k string) string {
			for _, kv := range kvs {
				if kv.Key == k {
					return kv.Value
				}
			}
			return ""
		}
		send = nil
		// Keys the target offers on its own are answered next round.
		var theirs []text.KV
		for _, kv := range kvs {
			if _, mine := l.offers[kv.Key]; !mine && !strings.HasPrefix(kv.Key, "CHAP_") && kv.Key != "AuthMethod" {
				theirs = append(theirs, kv)
			}
		}
		if ans, err := neg.Respond(theirs, text.Context{Login: true}); err == nil {
			send = append(send, ans...)
		}
		if stage == pdu.StageSecurity {
			switch chapStep {
			case 0:
				switch get("AuthMethod") {
				case "CHAP":
					send = append(send, text.KV{Key: "CHAP_A", Value: "7,5"})
					chapStep = 1
				case "None":
					chapStep = 2
				default:
					return fmt.Errorf("iscsi: target answered AuthMethod=%q", get("AuthMethod"))
				}
			case 1:
				alg, _ := strconv.Atoi(get("CHAP_A"))
				id, err1 := strconv.Atoi(get("CHAP_I"))
				c, err2 := auth.DecodeBinary(get("CHAP_C"))
				if (alg != auth.MD5 && alg != auth.SHA256) || err1 != nil || err2 != nil {
					return fmt.Errorf("iscsi: target sent a malformed CHAP challenge")
				}
				send = append(send,
					text.KV{Key: "CHAP_N", Value: o.CHAP.User},
					text.KV{Key: "CHAP_R", Value: auth.EncodeBinary(auth.Response(alg, byte(id), o.CHAP.Secret, c))})
				if o.TargetCHAP != nil {
					chapChallenge = make([]byte, len(c))
					var idb [1]byte
					randRead(idb[:])
					randRead(chapChallenge)
					chapID = idb[0]
					send = append(send, text.KV{Key: "CHAP_I", Value: strconv.Itoa(int(chapID))},
						text.KV{Key: "CHAP_C", Value: auth.EncodeBinary(chapChallenge)})
				}
				l.chapAlg = alg
				chapStep = 2
			case 2:
				if o.TargetCHAP != nil {
					r, err := auth.DecodeBinary(get("CHAP_R"))
					want := auth.Response(l.chapAlg, chapID, o.TargetCHAP.Secret, chapChallenge)
					if err != nil || get("CHAP_N") != o.TargetCHAP.User || !equal(r, want) {
						return ErrTargetAuth
					}
				}
			}
			if resp.Transit && resp.NSG == pdu.StageOperational {
				stage = pdu.StageOperational
				send = append(send, ops...)
			}
			continue
		}
		if resp.Transit && resp.NSG == pdu.StageFullFeature {
			// RFC 7143 §6.2: the target chooses from what we offered.
			for _, k := range []string{"HeaderDigest", "DataDigest"} {
				if v, ok := l.keys[k]; ok && v != l.offers[k] {
					return fmt.Errorf("iscsi: the target chose %s=%s; we offered %s", k, v, l.offers[k])
				}
			}
			// Every answer to an offer of ours must be one the key's
			// function could give (RFC 7143 §6.2.2).
			for k, offer := range l.offers {
				v, ok := l.keys[k]
				if !ok {
					continue
				}
				if key, known := neg.Lookup(k); known {
					if _, err := text.Settle(*key, offer, v); err != nil {
						return err
					}
				}
			}
			if !discovery {
				if err := l.params.check(); err != nil {
					return err
				}
			}
			s.mu.Lock()
			if l.leading {
				s.tsih = resp.TSIH
				s.params = l.params
				s.exp, s.max = l.finalExp, l.finalMax
			} else if serial.GreaterThan(l.finalMax, s.max) {
				s.max = l.finalMax
			}
			s.mu.Unlock()
			return nil
		}
	}
	return errors.New("iscsi: login did not finish in 16 exchanges")
}

func equal(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	var d byte
	for i := range a {
		d |= a[i] ^ b[i]
	}
	return d == 0
}

// exchange sends one login request and returns the complete response,
// following the target's C bit (RFC 7143 §11.13.2).
func (l *link) exchange(ctx context.Context, req *pdu.LoginReq, kvs []text.KV) (*pdu.LoginResp, []text.KV, error) {
	var p datamover.PDU
	req.Encode(&p.BHS)
	p.Data = text.Append(nil, kvs...)
	var all []byte
	for {
		if err := l.dm.SendControl(&p, false); err != nil {
			return nil, nil, err
		}
		var rp *datamover.PDU
		select {
		case rp = <-l.loginCh:
		case <-l.done:
			// A target that refuses a login answers and then closes: the
			// answer may be queued behind the close.
			select {
			case rp = <-l.loginCh:
			default:
				return nil, nil, errors.New("iscsi: connection closed during login")
			}
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		if rp.BHS.Opcode() != pdu.OpLoginResp {
			return nil, nil, fmt.Errorf("iscsi: %s during login", rp.BHS.Opcode())
		}
		var resp pdu.LoginResp
		if err := resp.Decode(&rp.BHS); err != nil {
			return nil, nil, err
		}
		if len(all)+len(rp.Data) > text.MaxTextLen {
			// A target whose text never ends is given up on (RFC 7143
			// §6.1 bounds a negotiation's text; we hold no more).
			return nil, nil, fmt.Errorf("iscsi: the target's login text exceeds %d bytes", text.MaxTextLen)
		}
		all = append(all, rp.Data...)
		if !resp.Continue || resp.StatusClass != 0 {
			kv, err := text.Parse(all)
			return &resp, kv, err
		}
		// More text follows: an empty request asks for it.
		r2 := *req
		r2.Transit = false
		r2.Encode(&p.BHS)
		p.Data = nil
	}
}

func newCond(s *Session) *sync.Cond { return sync.NewCond(&s.mu) }
