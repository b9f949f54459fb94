package node

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/blockwire/blockwire/admin"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/internal/atomicfile"
	"github.com/blockwire/blockwire/scsitarget"
	"github.com/blockwire/blockwire/srp"
)

// srpAllows reports whether an SRP initiator port may log in to the named
// target under the running configuration.
func (n *Node) srpAllows(name string, id srp.PortID, remote net.Addr) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	i := n.targetIndex(name)
	return i >= 0 && n.cfg.Targets[i].SRPAllows(id, remote)
}

// srpLUNMap is an SRP initiator port's view of the named target's LUNs.
func (n *Node) srpLUNMap(name string, id srp.PortID) map[uint64]uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	if i := n.targetIndex(name); i >= 0 {
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

// Changes is what Apply did: the changes made live, those that failed,
// and those that wait for a restart.
type Changes struct {
	Applied []string
	Restart []string
}

// Apply brings the running node to cfg: targets added and removed, LUNs
// added, removed, resized or replaced, ACL, CHAP and discovery changes (for
// logins from now on), on every fabric. A configuration with errors
// changes nothing. Portals, limits and the API, metrics and iSNS surfaces
// need a restart: Changes.Restart names them. Initiators see LUN changes
// through the unit attentions the SCSI core queues.
func (n *Node) Apply(ncfg *config.Config) (Changes, error) {
	var ch Changes
	if err := ncfg.Validate(); err != nil {
		return ch, fmt.Errorf("%w (nothing changed)", err)
	}
	ncfg = clone(ncfg)
	n.mu.Lock()
	defer n.mu.Unlock()
	var errs []error
	did := func(format string, a ...any) { ch.Applied = append(ch.Applied, fmt.Sprintf(format, a...)) }
	old := map[string]config.Target{}
	for _, t := range n.cfg.Targets {
		old[t.Name] = t
	}
	applied := *n.cfg // what cannot change live stays as it runs
	applied.Targets = nil
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
			n.log.Info("reload: target added", "target", nt.Name, "luns", len(nt.LUNs))
			did("target %s added", nt.Name)
			applied.Targets = append(applied.Targets, nt)
			continue
		}
		kept := ot
		var err error
		if kept.LUNs, err = n.updateLUNs(ot, nt, did); err != nil {
			errs = append(errs, err)
		}
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
				kept.LUNs, kept.TPGT, kept.PortGroups, kept.SRPIDExt = luns, ot.TPGT, ot.PortGroups, ot.SRPIDExt
				n.log.Info("reload: access rules changed", "target", nt.Name)
				did("target %s: access rules changed", nt.Name)
			}
		}
		if nt.TPGT != ot.TPGT || !slices.Equal(nt.PortGroups, ot.PortGroups) || nt.SRPIDExt != ot.SRPIDExt {
			ch.Restart = append(ch.Restart, fmt.Sprintf("target %s: tpgt, port_groups or srp_id_ext", nt.Name))
		}
		applied.Targets = append(applied.Targets, kept)
	}
	for name := range old {
		if err := n.removeTarget(name); err != nil {
			errs = append(errs, err)
			applied.Targets = append(applied.Targets, old[name])
			continue
		}
		n.log.Info("reload: target removed", "target", name)
		did("target %s removed", name)
	}
	if !reflect.DeepEqual(ncfg.Discovery, n.cfg.Discovery) {
		if err := setDiscovery(n.iscsi, ncfg.Discovery); err != nil {
			errs = append(errs, fmt.Errorf("discovery: %w", err))
		} else {
			applied.Discovery = ncfg.Discovery
			n.log.Info("reload: discovery access rules changed")
			did("discovery access rules changed")
		}
	}
	rest := func(c config.Config) config.Config { c.Targets, c.Discovery = nil, nil; return c }
	if a, b := rest(*ncfg), rest(*n.cfg); !reflect.DeepEqual(a, b) {
		ch.Restart = append(ch.Restart, restartFields(a, b)...)
		n.log.Warn("reload: portals, limits, metrics, admin socket and iSNS changes take effect at the next start", "changed", ch.Restart)
	}
	n.cfg = &applied
	return ch, errors.Join(errs...)
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

// Reload applies the configuration file's changes (SIGHUP, the
// administration API): a file with errors changes nothing.
func (n *Node) Reload() error {
	if n.opts.ConfigFile == "" {
		return errors.New("started without a configuration file: nothing to reload")
	}
	ncfg, err := config.Load(n.opts.ConfigFile)
	if err != nil {
		return fmt.Errorf("%w (nothing changed)", err)
	}
	_, err = n.Apply(ncfg)
	return err
}

// accessOf is what UpdateTarget changes: the target without its LUNs
// (updateLUNs' part) and without what needs a restart (its portal group
// and SRP port ID).
func accessOf(t config.Target) config.Target {
	t.LUNs, t.TPGT, t.PortGroups, t.SRPIDExt = nil, 0, nil, ""
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
		if ok && prev == lc {
			continue
		}
		if ok {
			sized := prev
			sized.Size = lc.Size
			if sized == lc && lc.Remote == "" {
				size, err := config.ParseSize(lc.Size)
				if err == nil {
					err = d.LU(lc.ID).Resize(size)
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("target %s LUN %d: resize: %w", nt.Name, lc.ID, err))
				} else {
					now[lc.ID] = lc
					n.log.Info("reload: LUN resized", "target", nt.Name, "lun", lc.ID, "size", lc.Size)
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
		n.log.Info("reload: LUN added", "target", nt.Name, "lun", lc.ID, "replaced", ok)
		did("target %s LUN %d added", nt.Name, lc.ID)
	}
	for id := range was {
		if err := d.RemoveLU(id); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(now, id)
		n.log.Info("reload: LUN removed", "target", nt.Name, "lun", id)
		did("target %s LUN %d removed", nt.Name, id)
	}
	out := make([]config.LUN, 0, len(now))
	for _, lc := range now {
		out = append(out, lc)
	}
	slices.SortFunc(out, func(a, b config.LUN) int { return int(a.ID) - int(b.ID) })
	return out, errors.Join(errs...)
}

// lunConfig is the configuration of a LUN added through the API.
func lunConfig(n admin.NewLU) config.LUN {
	return config.LUN{ID: n.LUN, Size: n.Size, File: n.File, Remote: n.Remote, BlockSize: n.BlockSize, ReadOnly: n.ReadOnly}
}

func (n *Node) targetIndex(name string) int {
	return slices.IndexFunc(n.cfg.Targets, func(t config.Target) bool { return t.Name == name })
}

// check validates the configuration with one change made.
func (n *Node) check(change func(c *config.Config)) error {
	c := *n.cfg
	c.Targets = slices.Clone(n.cfg.Targets)
	for i := range c.Targets {
		c.Targets[i].LUNs = slices.Clone(c.Targets[i].LUNs)
	}
	change(&c)
	return c.Validate()
}

// AddLU implements admin.Control.
func (n *Node) AddLU(nl admin.NewLU) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	i, d := n.targetIndex(nl.Target), n.device(nl.Target)
	if i < 0 || d == nil {
		return fmt.Errorf("no target %q", nl.Target)
	}
	if d.LU(nl.LUN) != nil {
		return fmt.Errorf("%s already has LUN %d", nl.Target, nl.LUN)
	}
	lc := lunConfig(nl)
	if err := n.check(func(c *config.Config) { c.Targets[i].LUNs = append(c.Targets[i].LUNs, lc) }); err != nil {
		return err
	}
	lu, err := buildLU(nl.Target, lc, n.opts.Backend, n.cfg.Poll, n.log)
	if err == nil {
		if err = d.AddLU(lu); err != nil {
			lu.Close()
		}
	}
	if err != nil {
		return err
	}
	n.cfg.Targets[i].LUNs = append(n.cfg.Targets[i].LUNs, lc)
	n.log.Info("admin: LUN added", "target", nl.Target, "lun", nl.LUN)
	return nil
}

// RemoveLU implements admin.Control.
func (n *Node) RemoveLU(name string, lun uint64) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	i, d := n.targetIndex(name), n.device(name)
	if i < 0 || d == nil {
		return fmt.Errorf("no target %q", name)
	}
	if err := d.RemoveLU(lun); err != nil {
		return err
	}
	n.cfg.Targets[i].LUNs = slices.DeleteFunc(n.cfg.Targets[i].LUNs, func(c config.LUN) bool { return c.ID == lun })
	n.log.Info("admin: LUN removed", "target", name, "lun", lun)
	return nil
}

// ResizeLU implements admin.Control.
func (n *Node) ResizeLU(name string, lun uint64, size int64) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	i, d := n.targetIndex(name), n.device(name)
	if i < 0 || d == nil || d.LU(lun) == nil {
		return fmt.Errorf("%s has no LUN %d", name, lun)
	}
	if err := d.LU(lun).Resize(size); err != nil {
		return err
	}
	for j := range n.cfg.Targets[i].LUNs {
		if n.cfg.Targets[i].LUNs[j].ID == lun {
			n.cfg.Targets[i].LUNs[j].Size = strconv.FormatInt(size, 10)
		}
	}
	n.log.Info("admin: LUN resized", "target", name, "lun", lun, "size", size)
	return nil
}

// AddTarget implements admin.Control: the target is served on every
// fabric whose portals serve all targets.
func (n *Node) AddTarget(nt admin.NewTarget) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	tc := config.Target{Name: nt.Name, Alias: nt.Alias, Initiators: nt.Initiators}
	for _, x := range nt.LUNs {
		tc.LUNs = append(tc.LUNs, lunConfig(x))
	}
	if err := n.check(func(c *config.Config) { c.Targets = append(c.Targets, tc) }); err != nil {
		return err
	}
	trial := *n.cfg
	trial.Targets = append(slices.Clone(n.cfg.Targets), tc)
	if err := n.addTarget(&trial, len(trial.Targets)-1); err != nil {
		return err
	}
	n.cfg.Targets = append(n.cfg.Targets, tc)
	n.log.Info("admin: target added", "target", nt.Name, "luns", len(tc.LUNs))
	return nil
}

// RemoveTarget implements admin.Control: its sessions on every fabric end.
func (n *Node) RemoveTarget(name string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.removeTarget(name); err != nil {
		return err
	}
	n.cfg.Targets = slices.DeleteFunc(n.cfg.Targets, func(t config.Target) bool { return t.Name == name })
	n.log.Info("admin: target removed", "target", name)
	return nil
}

// SetInitiators implements admin.Control: the ACL for logins from now on.
func (n *Node) SetInitiators(name string, initiators []string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	i := n.targetIndex(name)
	if i < 0 {
		return fmt.Errorf("no target %q", name)
	}
	if err := n.check(func(c *config.Config) { c.Targets[i].Initiators = initiators }); err != nil {
		return err
	}
	tc := n.cfg.Targets[i]
	tc.Initiators = initiators
	t, err := targetAccess(tc, n.iscsiPortals(n.cfg, tc))
	if err == nil {
		err = n.iscsi.UpdateTarget(t)
	}
	if err != nil {
		return err
	}
	n.cfg.Targets[i] = tc
	n.log.Info("admin: ACL changed", "target", name, "initiators", initiators)
	return nil
}

// Save implements admin.Control: the running configuration, as TOML, to
// path or the file it was read from (written to a new file, synced and
// renamed into place, mode 0600). Secrets stay references: what the file
// had (secret_file, secret_env, or an inline secret). The file replaced is
// kept as PATH.bak first: TOML's encoder keeps no comments.
func (n *Node) Save(path string) (string, string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if path == "" {
		path = n.opts.ConfigFile
	}
	if path == "" {
		return "", "", errors.New("started without --config: give a path")
	}
	var b bytes.Buffer
	b.WriteString("# blockwire configuration, saved by blockwire admin save\n")
	backup := ""
	if old, err := os.ReadFile(path); err == nil {
		backup = path + ".bak"
		if err := atomicfile.WriteFile(backup, old, 0o600); err != nil {
			return "", "", fmt.Errorf("keeping the previous file as %s: %w", backup, err)
		}
		b.WriteString("# (comments of the file it replaced are not kept: that file is " + filepath.Base(backup) + ")\n")
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", "", err
	}
	if err := toml.NewEncoder(&b).Encode(n.cfg); err != nil {
		return "", "", err
	}
	if err := atomicfile.WriteFile(path, b.Bytes(), 0o600); err != nil {
		return "", "", err
	}
	n.log.Info("admin: configuration saved", "file", path, "backup", backup)
	return path, backup, nil
}

var _ admin.Control = (*Node)(nil)
