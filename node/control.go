package node

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	"github.com/blockwire/blockwire/admin"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/scsitarget"
	"github.com/blockwire/blockwire/srp"
)

// srpAllows reports whether an SRP initiator port may log in to the named
// target under the running configuration.
func (n *Node) srpAllows(name string, id srp.PortID, remote net.Addr) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	i := targetIndex(n.cfg, name)
	return i >= 0 && n.cfg.Targets[i].SRPAllows(id, remote)
}

// srpLUNMap is an SRP initiator port's view of the named target's LUNs.
func (n *Node) srpLUNMap(name string, id srp.PortID) map[uint64]uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	if i := targetIndex(n.cfg, name); i >= 0 {
		return n.cfg.Targets[i].SRPLUNMap(id)
	}
	return nil
}

func (n *Node) device(name string) *scsitarget.Device {
	for _, d := range n.devices {
		if d.Name() == name {
			return d
		}
	}
	return nil
}

// Changes is what a change did (or, in a dry run, would do): the changes
// made live, and those that wait for a restart.
type Changes struct {
	Applied []string
	Restart []string
}

// Consent is what an operator allows a change to cost: without it a change
// that would lose data or cut initiators off is refused whole.
type Consent struct {
	// Shrink lets a LUN become smaller than it is: the data past the new
	// end is lost. A reload never truncates a file even so: a file LUN
	// shrinks only through ResizeLU.
	Shrink bool
	// Force lets a change remove or replace a LUN or target that has
	// sessions or commands in progress, replace an in-memory LUN (its
	// data is discarded) or point a LUN at another file, and resolves a
	// reload's conflicts with what runs to the file's side.
	Force bool
	// truncate lets a file LUN shrink (ResizeLU with Shrink only).
	truncate bool
}

// Refused is a change refused for what it would cost; nothing changed.
type Refused struct{ Reasons []string }

func (r *Refused) Error() string {
	return "refused, nothing changed: " + strings.Join(r.Reasons, "; ")
}

// Unwrap makes a refusal admin.ErrRefused to the administration API.
func (r *Refused) Unwrap() error { return admin.ErrRefused }

// Apply brings the running node to cfg: targets added and removed, LUNs
// added, removed, resized or replaced, ACL, CHAP and discovery changes, on
// every fabric — access changes reach sessions already logged in: those
// the new rules would not admit, or whose view of the LUNs changed, end.
// A configuration with errors changes nothing, and so does one that would
// cost data or sessions without the consent c gives (Refused). Portals,
// limits and the API, metrics and iSNS surfaces need a restart:
// Changes.Restart names them.
// Initiators see LUN changes through the unit attentions the SCSI core
// queues. The change is recorded in the node's state file first
// (Options.StateFile).
func (n *Node) Apply(ncfg *config.Config, c Consent) (Changes, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.commit(ncfg, nil, c, false)
}

// commit is the one path every change takes (Apply, Reload, each
// administration verb), with mu held: validate, refuse what the consent
// does not cover (and the caller's own refusals, also), record the new
// state, apply it, record what runs if that differs. base, when not nil,
// is the configuration file the change came from (a reload): the state's
// new Base. With dryRun it stops after the refusals, returning the plan.
func (n *Node) commit(ncfg, base *config.Config, c Consent, dryRun bool, also ...string) (Changes, error) {
	if err := ncfg.Validate(); err != nil {
		return Changes{}, fmt.Errorf("%w (nothing changed)", err)
	}
	plan, refused := n.plan(ncfg, c)
	refused = append(refused, also...)
	var err error
	if len(refused) > 0 {
		err = &Refused{refused}
	}
	if dryRun || err != nil {
		if !dryRun {
			plan = nil
		}
		return Changes{Applied: plan}, err
	}
	nbase := n.base
	if base != nil {
		nbase = base
	}
	if err := n.record(nbase, ncfg); err != nil {
		return Changes{}, fmt.Errorf("%w; nothing changed", err)
	}
	ch, err := n.apply(ncfg)
	n.base = nbase
	if rerr := n.record(nbase, recorded(n.cfg, ncfg)); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return ch, err
}

// recorded is what the state keeps after a change: the targets and
// discovery as applied, and what only a restart applies (portals, limits)
// as wanted — so that the next start serves it.
func recorded(applied, wanted *config.Config) *config.Config {
	r := wanted.Clone()
	a := applied.Clone()
	r.Targets, r.Discovery = a.Targets, a.Discovery
	return r
}

// record writes the node's state, where it keeps one.
func (n *Node) record(base, running *config.Config) error {
	if n.opts.StateFile == "" {
		return nil
	}
	return storeState(n.opts.StateFile, state{Base: base, Running: running})
}

// apply brings the running node to ncfg (commit's last step), mu held.
func (n *Node) apply(ncfg *config.Config) (Changes, error) {
	var ch Changes
	ncfg = ncfg.Clone()
	var errs []error
	did := func(format string, a ...any) { ch.Applied = append(ch.Applied, fmt.Sprintf(format, a...)) }
	old := map[string]config.Target{}
	for _, t := range n.cfg.Targets {
		old[t.Name] = t
	}
	applied := *n.cfg // what cannot change live stays as it runs
	applied.Targets = nil
	prev := n.cfg
	var accessChanged []string
	for _, nt := range ncfg.Targets {
		ot, exists := old[nt.Name]
		delete(old, nt.Name)
		if !exists {
			// Build it against the new configuration (its index there
			// names its SRP port), keep it in the running one.
			trial := applied
			trial.Targets = append(slices.Clone(applied.Targets), nt)
			if err := n.addTarget(&trial, len(trial.Targets)-1); err != nil {
				errs = append(errs, fmt.Errorf("adding target %s: %w", nt.Name, err))
				continue
			}
			n.log.Info("change: target added", "target", nt.Name, "luns", len(nt.LUNs))
			did("target %s added", nt.Name)
			applied.Targets = append(applied.Targets, nt)
			continue
		}
		kept := ot
		var err error
		if kept.LUNs, err = n.updateLUNs(ot, nt, did); err != nil {
			errs = append(errs, err)
		}
		n.syncNVMe(nt.Name, n.device(nt.Name))
		if !reflect.DeepEqual(accessOf(ot), accessOf(nt)) {
			t, err := targetAccess(nt, n.iscsiPortals(n.cfg, nt))
			if err == nil {
				err = n.iscsi.UpdateTarget(t)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("target %s: %w", nt.Name, err))
			} else {
				luns := kept.LUNs
				kept = accessOf(nt)
				kept.LUNs, kept.TPGT, kept.PortGroups, kept.SRPIDExt, kept.NQN = luns, ot.TPGT, ot.PortGroups, ot.SRPIDExt, ot.NQN
				n.log.Info("change: access rules changed", "target", nt.Name)
				did("target %s: access rules changed", nt.Name)
				accessChanged = append(accessChanged, nt.Name)
				n.revokeNVMe(kept)
			}
		}
		if nt.TPGT != ot.TPGT || !slices.Equal(nt.PortGroups, ot.PortGroups) || nt.SRPIDExt != ot.SRPIDExt || nt.NQN != ot.NQN {
			ch.Restart = append(ch.Restart, fmt.Sprintf("target %s: tpgt, port_groups, srp_id_ext or nqn", nt.Name))
		}
		applied.Targets = append(applied.Targets, kept)
	}
	for _, t := range n.cfg.Targets { // in the running order
		name := t.Name
		if _, gone := old[name]; !gone {
			continue
		}
		if err := n.removeTarget(name); err != nil {
			errs = append(errs, err)
			applied.Targets = append(applied.Targets, old[name])
			continue
		}
		n.log.Info("change: target removed", "target", name)
		did("target %s removed", name)
	}
	if !reflect.DeepEqual(ncfg.Discovery, n.cfg.Discovery) {
		if err := setDiscovery(n.iscsi, ncfg.Discovery); err != nil {
			errs = append(errs, fmt.Errorf("discovery: %w", err))
		} else {
			applied.Discovery = ncfg.Discovery
			n.setNVMeDiscovery(ncfg.Discovery)
			n.log.Info("change: discovery access rules changed")
			did("discovery access rules changed")
		}
	}
	if a, b := rest(*ncfg), rest(*n.cfg); !reflect.DeepEqual(a, b) {
		ch.Restart = append(ch.Restart, restartFields(a, b)...)
		n.log.Warn("change: portals, limits, metrics, admin socket and iSNS changes take effect at the next start", "changed", ch.Restart)
	}
	n.cfg = &applied
	n.revokeSRP(prev, accessChanged)
	return ch, errors.Join(errs...)
}

// revokeSRP ends the SRP sessions of the named targets that their new
// access rules would not admit now, or whose view of the LUNs changed —
// as the iSCSI server does for its own (iscsi/iscsitarget UpdateTarget). mu
// held.
func (n *Node) revokeSRP(prev *config.Config, names []string) {
	for _, name := range names {
		s := n.srp[name]
		i, j := targetIndex(n.cfg, name), targetIndex(prev, name)
		if s == nil || i < 0 || j < 0 {
			continue
		}
		now, was := n.cfg.Targets[i], prev.Targets[j]
		for _, si := range s.Sessions() {
			id, err := srp.ParsePortID(si.Initiator)
			if err != nil {
				continue
			}
			why := ""
			for _, c := range si.Conns {
				var remote net.Addr // as the login saw it: an IP address, where there is one
				if ap, err := netip.ParseAddrPort(c.Remote); err == nil {
					remote = net.TCPAddrFromAddrPort(ap)
				}
				if !now.SRPAllows(id, remote) {
					why = "the target's ACL no longer admits it from " + c.Remote
				}
			}
			if why != "" {
				if s.DropSession(si.ID) {
					n.log.Info("change: SRP session ended", "target", name, "session", si.ID, "initiator", si.Initiator, "why", why)
				}
				continue
			}
			// A new view of the LUNs holds at once, told by a unit
			// attention (and an SRP_AER_REQ).
			if view := now.SRPLUNMap(id); !reflect.DeepEqual(view, was.SRPLUNMap(id)) && s.Remap(id, view) {
				n.log.Info("change: SRP initiator's view of the LUNs changed", "target", name, "session", si.ID, "initiator", si.Initiator)
			}
		}
	}
}

// rest is what only a restart changes: the configuration without its
// targets and discovery.
func rest(c config.Config) config.Config { c.Targets, c.Discovery = nil, nil; return c }

// plan says what bringing the node to ncfg would change, and what of it
// the consent does not cover (mu held). It reads the LUNs as they run:
// their sizes, sessions and commands in progress.
func (n *Node) plan(ncfg *config.Config, c Consent) (changes, refused []string) {
	return planChange(n.cfg, ncfg, c, nodeView{n})
}

// view is what planChange knows of the LUNs as they run.
type view interface {
	// size is the LUN's size in bytes (0: unknown).
	size(target string, lun config.LUN) int64
	// inUse says why removing or replacing a LUN (lun nil: the whole
	// target) would hurt initiators, or "".
	inUse(target string, lun *uint64) string
}

// nodeView is the running node's view (mu held).
type nodeView struct{ n *Node }

func (v nodeView) size(target string, l config.LUN) int64 {
	if d := v.n.device(target); d != nil {
		if lu := d.LU(l.ID); lu != nil {
			return int64(lu.Blocks()) * int64(lu.BlockSize())
		}
	}
	return 0
}

func (v nodeView) inUse(target string, lun *uint64) string {
	n := v.n
	sessions := 0
	for _, s := range n.sessionsLocked() {
		if !s.Discovery && s.Target == target {
			sessions++
		}
	}
	var why []string
	if sessions > 0 {
		why = append(why, fmt.Sprintf("%d session(s) logged in to the target", sessions))
	}
	if d := n.device(target); d != nil {
		busy := 0
		for _, id := range d.LUNs() {
			if lu := d.LU(id); lu != nil && (lun == nil || *lun == id) {
				busy += lu.InProgress()
			}
		}
		if busy > 0 {
			why = append(why, fmt.Sprintf("%d command(s) in progress", busy))
		}
	}
	return strings.Join(why, ", ")
}

// configView is a configuration's view alone (config diff): sizes as it
// says them, nothing in use.
type configView struct{}

func (configView) size(_ string, l config.LUN) int64 { return sizeOf(l.Size) }
func (configView) inUse(string, *uint64) string      { return "" }

// planChange says what bringing cfg to ncfg would change, and what of it
// the consent does not cover, as seen through v.
func planChange(cfg, ncfg *config.Config, c Consent, v view) (changes, refused []string) {
	say := func(format string, a ...any) { changes = append(changes, fmt.Sprintf(format, a...)) }
	refuse := func(format string, a ...any) { refused = append(refused, fmt.Sprintf(format, a...)) }
	old := byName(cfg.Targets)
	for _, nt := range ncfg.Targets {
		ot, ok := old[nt.Name]
		delete(old, nt.Name)
		if !ok {
			say("target %s: add, with %d LUN(s)", nt.Name, len(nt.LUNs))
			continue
		}
		if !reflect.DeepEqual(accessOf(ot), accessOf(nt)) {
			say("target %s: change its access rules (ACL, CHAP, portals, redirect)", nt.Name)
		}
		if nt.TPGT != ot.TPGT || !slices.Equal(nt.PortGroups, ot.PortGroups) || nt.SRPIDExt != ot.SRPIDExt || nt.NQN != ot.NQN {
			say("target %s: tpgt, port_groups, srp_id_ext or nqn (at the next start)", nt.Name)
		}
		was := map[uint64]config.LUN{}
		for _, l := range ot.LUNs {
			was[l.ID] = l
		}
		for _, l := range nt.LUNs {
			p, ok := was[l.ID]
			delete(was, l.ID)
			where := fmt.Sprintf("target %s LUN %d", nt.Name, l.ID)
			switch {
			case !ok:
				say("%s: add (%s)", where, describeLUN(l))
			case sameLUN(p, l):
			case onlySize(p, l):
				live := v.size(nt.Name, p)
				to := sizeOf(l.Size)
				if to == 0 || to == live {
					continue
				}
				say("%s: resize from %s to %s", where, config.HumanSize(live), config.HumanSize(to))
				switch {
				case to > live:
				case l.File != "" && !c.truncate:
					refuse("%s: %s holds %s, the change says %s — blockwire never truncates a file on a reload or start (shrink it on purpose with blockwire admin resize --shrink, or make the file say %s)",
						where, l.File, config.FormatSize(live), config.FormatSize(to), config.FormatSize(live))
				case !c.Shrink:
					refuse("%s: it holds %s, the change says %s: the data past %s would be lost (--shrink if that is meant, or make the file say %s)",
						where, config.FormatSize(live), config.FormatSize(to), config.FormatSize(to), config.FormatSize(live))
				}
			default:
				say("%s: replace (%s, was %s)", where, describeLUN(l), describeLUN(p))
				if c.Force {
					continue
				}
				id := l.ID
				switch {
				case p.File == "" && p.Remote == "" && p.RBD == "":
					refuse("%s: replacing an in-memory LUN discards its data (--force if that is meant)", where)
				case p.File != l.File:
					refuse("%s: it would serve %s instead of %s (--force if that is meant)", where, cmp.Or(l.File, "another backend"), p.File)
				default:
					if why := v.inUse(nt.Name, &id); why != "" {
						refuse("%s: replacing it cuts off its initiators: %s (--force)", where, why)
					}
				}
			}
		}
		for _, l := range ot.LUNs {
			if _, gone := was[l.ID]; !gone {
				continue
			}
			where := fmt.Sprintf("target %s LUN %d", nt.Name, l.ID)
			say("%s: remove (%s)", where, describeLUN(l))
			id := l.ID
			if why := v.inUse(nt.Name, &id); why != "" && !c.Force {
				refuse("%s: removing it cuts off its initiators: %s (--force)", where, why)
			}
		}
	}
	for _, t := range cfg.Targets {
		if _, gone := old[t.Name]; !gone {
			continue
		}
		say("target %s: remove, with its %d LUN(s)", t.Name, len(t.LUNs))
		if why := v.inUse(t.Name, nil); why != "" && !c.Force {
			refuse("target %s: removing it ends its sessions: %s (--force)", t.Name, why)
		}
	}
	if !reflect.DeepEqual(ncfg.Discovery, cfg.Discovery) {
		say("discovery: change its access rules")
	}
	if a, b := rest(*ncfg), rest(*cfg); !reflect.DeepEqual(a, b) {
		for _, f := range restartFields(a, b) {
			say("%s (at the next start)", f)
		}
	}
	return changes, refused
}

// backingOf names a LUN's storage: "memory", its file, "remote URL" or
// "rbd IMAGE".
func backingOf(l config.LUN) string {
	switch {
	case l.Remote != "":
		return "remote " + config.RedactURL(l.Remote)
	case l.RBD != "":
		return "rbd " + l.RBD
	case l.File != "":
		return l.File
	}
	return "memory"
}

// describeLUN names a LUN's storage and size for a person.
func describeLUN(l config.LUN) string {
	what := backingOf(l)
	if l.Size != "" {
		what += ", " + config.HumanSize(sizeOf(l.Size))
	}
	if l.ReadOnly {
		what += ", read-only"
	}
	return what
}

// onlySize: a and b differ in their sizes alone, and the LUN can be
// resized in place.
func onlySize(a, b config.LUN) bool {
	a.Size = b.Size
	return reflect.DeepEqual(a, b) && b.Remote == "" && b.RBD == ""
}

// sessionsLocked is Sessions with mu held.
func (n *Node) sessionsLocked() []scsitarget.SessionInfo {
	out := n.iscsi.Sessions()
	for _, s := range n.srpServersLocked() {
		out = append(out, s.Sessions()...)
	}
	return out
}

// restartFields names the top-level settings that differ between a and b.
func restartFields(a, b config.Config) []string {
	var out []string
	va, vb, t := reflect.ValueOf(a), reflect.ValueOf(b), reflect.TypeOf(a)
	for i := range t.NumField() {
		if !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("toml"), ",")
			out = append(out, name)
		}
	}
	return out
}

// ReloadOptions say how a reload is made.
type ReloadOptions struct {
	Consent
	// DryRun only says what the reload would change (Changes.Applied)
	// and what it would refuse (the Refused error): nothing changes.
	DryRun bool
}

// Reload applies the changes the configuration file made since it was
// last applied (SIGHUP, the administration API), merged with what runs:
// a LUN resized, added or removed live keeps that unless the file changes
// the same LUN (merge). A file with errors changes nothing; so does a
// reload that would lose data or cut initiators off without consent, or
// whose changes conflict with the running ones without Force.
func (n *Node) Reload(o ReloadOptions) (Changes, error) {
	if n.opts.ConfigFile == "" {
		return Changes{}, errors.New("started without a configuration file: nothing to reload")
	}
	file, err := config.Load(n.opts.ConfigFile)
	if err != nil {
		return Changes{}, fmt.Errorf("%w (nothing changed)", err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	next, conflicts := merge(n.base, n.cfg, file)
	var refused []string
	if !o.Force {
		for _, c := range conflicts {
			refused = append(refused, c+" (--force takes the file's; or make the file say what runs)")
		}
	}
	return n.commit(next, file, o.Consent, o.DryRun, refused...)
}

// accessOf is what UpdateTarget changes: the target without its LUNs
// (updateLUNs' part) and without what needs a restart (its portal group
// and SRP port ID).
func accessOf(t config.Target) config.Target {
	t.LUNs, t.TPGT, t.PortGroups, t.SRPIDExt, t.NQN = nil, 0, nil, "", ""
	return t
}

// updateLUNs brings a target's LUNs from ot to nt: a LUN whose only
// change is a larger or smaller size is resized in place (CAPACITY DATA HAS
// CHANGED); any other change replaces it. It returns the LUNs now in
// place, which differ from nt's where a change failed.
func (n *Node) updateLUNs(ot, nt config.Target, did func(string, ...any)) ([]config.LUN, error) {
	d := n.device(nt.Name)
	if d == nil {
		return ot.LUNs, fmt.Errorf("target %s: no device", nt.Name)
	}
	was := map[uint64]config.LUN{}
	now := map[uint64]config.LUN{}
	for _, lc := range ot.LUNs {
		was[lc.ID], now[lc.ID] = lc, lc
	}
	var errs []error
	for _, lc := range nt.LUNs {
		prev, ok := was[lc.ID]
		delete(was, lc.ID)
		if ok && sameLUN(prev, lc) {
			continue
		}
		if ok {
			if onlySize(prev, lc) {
				size, err := config.ParseSize(lc.Size)
				if err == nil {
					err = d.LU(lc.ID).Resize(size)
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("target %s LUN %d: resize: %w", nt.Name, lc.ID, err))
				} else {
					now[lc.ID] = lc
					n.log.Info("change: LUN resized", "target", nt.Name, "lun", lc.ID, "size", lc.Size)
					did("target %s LUN %d resized to %s", nt.Name, lc.ID, lc.Size)
				}
				continue
			}
			if err := d.RemoveLU(lc.ID); err != nil {
				errs = append(errs, err)
				continue
			}
			delete(now, lc.ID)
		}
		lu, err := buildLU(nt.Name, lc, n.opts.Backend, n.cfg.Poll, n.log)
		if err == nil {
			if err = d.AddLU(lu); err != nil {
				lu.Close()
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("target %s LUN %d: %w", nt.Name, lc.ID, err))
			continue
		}
		now[lc.ID] = lc
		n.log.Info("change: LUN added", "target", nt.Name, "lun", lc.ID, "replaced", ok)
		did("target %s LUN %d added", nt.Name, lc.ID)
	}
	for id := range was {
		if err := d.RemoveLU(id); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(now, id)
		n.log.Info("change: LUN removed", "target", nt.Name, "lun", id)
		did("target %s LUN %d removed", nt.Name, id)
	}
	out := make([]config.LUN, 0, len(now))
	for _, lc := range now {
		out = append(out, lc)
	}
	slices.SortFunc(out, func(a, b config.LUN) int { return int(a.ID) - int(b.ID) })
	return out, errors.Join(errs...)
}
