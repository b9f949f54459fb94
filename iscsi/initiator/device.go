package initiator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/blockwire/blockwire/blockdev"
	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/iscsi/auth"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/iscsi/text"
)

// URL is a parsed libiscsi-style iSCSI URL:
// iscsi://[user[%password]@]host[:port]/target-iqn/lun
type URL struct {
	User, Password string
	Portal         string // host:port
	Target         string
	LUN            uint64
	HasLUN         bool
	// ISER: the URL was iser://… (libiscsi's convention): connect with
	// iSER.
	ISER bool
}

// ParseURL parses an iSCSI URL, iscsi://[user[%password]@]host[:port]/
// target/lun, or the same with iser:// for iSER. The target and LUN may be
// omitted (for discovery).
func ParseURL(raw string) (*URL, error) {
	u := &URL{}
	rest, ok := strings.CutPrefix(raw, "iscsi://")
	if !ok {
		rest, ok = strings.CutPrefix(raw, "iser://")
		u.ISER = true
	}
	if !ok {
		return nil, fmt.Errorf("iscsi URL %q: must start with iscsi:// or iser://", raw)
	}
	hostEnd := strings.IndexByte(rest, '/')
	if hostEnd < 0 {
		hostEnd = len(rest)
	}
	if at := strings.LastIndexByte(rest[:hostEnd], '@'); at >= 0 {
		cred := rest[:at]
		rest = rest[at+1:]
		hostEnd -= at + 1
		user, pw, _ := strings.Cut(cred, "%")
		u.User, u.Password = user, pw
		if u.User == "" {
			return nil, fmt.Errorf("iscsi URL %q: empty user name", raw)
		}
	}
	host := rest[:hostEnd]
	if host == "" {
		return nil, fmt.Errorf("iscsi URL %q: no host", raw)
	}
	if strings.Count(host, ":") > 1 && !strings.HasPrefix(host, "[") {
		return nil, fmt.Errorf("iscsi URL %q: an IPv6 address goes in brackets, the port after them (iscsi://[%s]:3260/TARGET/LUN)", raw, host)
	}
	u.Portal = withPort(host)
	if h, port, err := net.SplitHostPort(u.Portal); err != nil {
		return nil, fmt.Errorf("iscsi URL %q: host %q: %v", raw, host, err)
	} else if h == "" {
		return nil, fmt.Errorf("iscsi URL %q: no host", raw)
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return nil, fmt.Errorf("iscsi URL %q: port %q is not 1 to 65535", raw, port)
	}
	path := strings.Trim(rest[hostEnd:], "/")
	if path == "" {
		return u, nil
	}
	tgt, lun, hasLUN := strings.Cut(path, "/")
	u.Target = tgt
	if hasLUN {
		n, err := strconv.ParseUint(lun, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("iscsi URL %q: bad LUN %q", raw, lun)
		}
		u.LUN, u.HasLUN = n, true
	}
	return u, nil
}

// Credentials returns the URL's CHAP credentials, or nil.
func (u *URL) Credentials() *auth.Credentials {
	if u.User == "" {
		return nil
	}
	return &auth.Credentials{User: u.User, Secret: u.Password}
}

// DiscoveredTarget is one SendTargets answer.
type DiscoveredTarget struct {
	Name      string
	Addresses []string // "host:port,tpgt"
}

// Discover runs a discovery session and asks for SendTargets=All.
func Discover(ctx context.Context, portal string, opts Options) ([]DiscoveredTarget, error) {
	opts.defaults()
	s := &Session{opts: opts, portal: withPort(portal), isid: newISID(), log: opts.Logger, discovery: true, stop: make(chan struct{}), tasks: map[uint32]*task{}, tmfs: map[uint32]chan byte{}, cmdSN: 1, nextITT: 1}
	s.cond = newCond(s)
	l, err := s.connect(ctx, true, 0)
	if err != nil {
		return nil, err
	}
	s.install([]*link{l})
	defer s.Close()
	var all []byte
	ttt := uint32(pdu.ReservedTTT)
	kvs := text.Append(nil, text.KV{Key: "SendTargets", Value: "All"})
	for range 1000 {
		req := pdu.TextReq{Immediate: true, Final: true, ITT: 1, TTT: ttt, CmdSN: s.cmdSN}
		var p datamover.PDU
		req.Encode(&p.BHS)
		p.Data = kvs
		kvs = nil
		if err := l.dm.SendControl(&p, false); err != nil {
			return nil, err
		}
		var rp *datamover.PDU
		select {
		case rp = <-l.textCh:
		case <-l.done:
			select {
			case rp = <-l.textCh:
			default:
				return nil, errors.New("iscsi: discovery connection closed")
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		var r pdu.TextResp
		if err := r.Decode(&rp.BHS); err != nil {
			return nil, err
		}
		if len(all)+len(rp.Data) > text.MaxTextLen {
			return nil, fmt.Errorf("iscsi: the target's SendTargets text exceeds %d bytes", text.MaxTextLen)
		}
		all = append(all, rp.Data...)
		if r.Final {
			break
		}
		ttt = r.TTT
	}
	pairs, err := text.Parse(all)
	if err != nil {
		return nil, err
	}
	var out []DiscoveredTarget
	for _, kv := range pairs {
		switch kv.Key {
		case "TargetName":
			out = append(out, DiscoveredTarget{Name: kv.Value})
		case "TargetAddress":
			if len(out) > 0 {
				out[len(out)-1].Addresses = append(out[len(out)-1].Addresses, kv.Value)
			}
		}
	}
	return out, nil
}

// Device is a block-device view of one LUN (package blockdev) with its
// iSCSI session.
type Device struct {
	*blockdev.Device
	s *Session
}

// Open logs in to the target of an iSCSI URL and returns its LUN as a
// block device. The URL's credentials override opts.CHAP.
func Open(ctx context.Context, rawURL string, opts Options) (*Device, error) {
	u, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Target == "" || !u.HasLUN {
		return nil, fmt.Errorf("iscsi URL %q: needs /target-iqn/lun", rawURL)
	}
	if c := u.Credentials(); c != nil {
		if c.Secret == "" && opts.CHAP != nil && opts.CHAP.User == "" {
			c.Secret = opts.CHAP.Secret // the URL names the user, the options hold the secret
		}
		opts.CHAP = c
	}
	if u.ISER {
		opts.ISER = true
	}
	var s *Session
	if opts.Prefer != "" {
		s, err = loginPreferred(ctx, u, &opts)
	} else {
		s, err = Login(ctx, u.Portal, u.Target, opts)
	}
	if err != nil {
		return nil, err
	}
	maxXfer := 1 << 20
	if opts.ISER {
		// 512 KiB per command over iSER, as Linux ib_iser does (its
		// default max_sectors is 1024): tgt's iSER target, for one,
		// registers a new buffer for anything larger and runs out of
		// memory (seen in the guest lab).
		maxXfer = 512 << 10
	}
	bd, err := blockdev.Open(ctx, s, "iscsi", u.LUN, maxXfer)
	if err != nil {
		s.Close()
		return nil, err
	}
	return &Device{Device: bd, s: s}, nil
}

// Session returns the underlying session.
func (d *Device) Session() *Session { return d.s }

// loginPreferred logs in as Options.Prefer says (the iSER-on-InfiniBand draft part III): iSER
// to the preferred kind of node, then the other kind, then iSCSI/TCP, on
// every portal of the target. opts.ISER reports what it got.
func loginPreferred(ctx context.Context, u *URL, opts *Options) (*Session, error) {
	type step struct {
		iser bool
		pref datamover.Preference
	}
	var plan []step
	switch opts.Prefer {
	case "direct":
		plan = []step{{true, datamover.PreferEndNode}, {true, datamover.PreferGateway}, {false, 0}}
	case "gateway":
		plan = []step{{true, datamover.PreferGateway}, {true, datamover.PreferEndNode}, {false, 0}}
	case "any":
		plan = []step{{true, datamover.PreferEither}, {false, 0}}
	default:
		return nil, fmt.Errorf("iscsi: Prefer %q: want direct, gateway or any", opts.Prefer)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	portals := []string{withPort(u.Portal)}
	dopts := *opts
	dopts.ISER, dopts.Prefer = false, ""
	if found, err := Discover(ctx, u.Portal, dopts); err == nil {
		for _, t := range found {
			if t.Name != u.Target {
				continue
			}
			for _, a := range t.Addresses {
				if i := strings.LastIndexByte(a, ','); i >= 0 {
					a = a[:i]
				}
				if a = withPort(a); !slices.Contains(portals, a) {
					portals = append(portals, a)
				}
			}
		}
	}
	var errs []error
	for _, st := range plan {
		for _, p := range portals {
			o := *opts
			o.ISER, o.pref, o.prefSet = st.iser, st.pref, st.iser
			s, err := Login(ctx, p, u.Target, o)
			if err == nil {
				o.Logger.Info("connected", "portal", p, "iser", st.iser, "preference", st.pref.String())
				*opts = o
				return s, nil
			}
			if isLoginError(err) {
				return nil, err // the target answered: another path will not help
			}
			what := "iSCSI/TCP"
			if st.iser {
				what = "iSER (" + st.pref.String() + ")"
			}
			o.Logger.Info("no connection", "portal", p, "via", what, "err", err)
			errs = append(errs, fmt.Errorf("%s via %s: %w", p, what, err))
		}
	}
	return nil, fmt.Errorf("iscsi: no path to %s as %q prefers: %w", u.Target, opts.Prefer, errors.Join(errs...))
}
