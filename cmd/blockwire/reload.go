package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"sync"

	"github.com/BurntSushi/toml"

	"github.com/blockwire/blockwire/admin"
	"github.com/blockwire/blockwire/internal/atomicfile"
	"github.com/blockwire/blockwire/config"
	iscsitarget "github.com/blockwire/blockwire/iscsi/target"
	"github.com/blockwire/blockwire/srp"
	"github.com/blockwire/blockwire/scsitarget"
)

// live is the running configuration: the targets' devices as built from
// cfg. SIGHUP re-reads the file and applies only the difference.
type live struct {
	mu      sync.Mutex
	cfg     *config.Config
	devices []*scsitarget.Device
	path    string
	srv     *iscsitarget.Server
	log     *slog.Logger
}

// Devices returns the devices (for the metrics and admin APIs).
func (l *live) Devices() []*scsitarget.Device {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.devices)
}

// srpAllows reports whether an SRP initiator port may log in to the named
// target under the running configuration.
func (l *live) srpAllows(name string, id srp.PortID, remote net.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := l.targetIndex(name)
	return i >= 0 && l.cfg.Targets[i].SRPAllows(id, remote)
}

// srpLUNMap is an SRP initiator port's view of the named target's LUNs.
func (l *live) srpLUNMap(name string, id srp.PortID) map[uint64]uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i := l.targetIndex(name); i >= 0 {
		return l.cfg.Targets[i].SRPLUNMap(id)
	}
	return nil
}

func (l *live) device(name string) *scsitarget.Device {
	for _, d := range l.devices {
		if d.Name() == name {
			return d
		}
	}
	return nil
}

// reload applies the configuration file's changes: targets added and
// removed, LUNs added, removed, resized or replaced, ACL and CHAP changes
// (for logins from now on). A file with errors changes nothing. Portals
// and limits need a restart. Initiators see LUN changes through the unit
// attentions the SCSI core queues.
func (l *live) reload() error {
	ncfg, err := config.Load(l.path)
	if err != nil {
		return fmt.Errorf("%w (nothing changed)", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	old := map[string]config.Target{}
	for _, t := range l.cfg.Targets {
		old[t.Name] = t
	}
	applied := *l.cfg // what cannot change live stays as it runs
	applied.Targets = nil
	for _, nt := range ncfg.Targets {
		ot, exists := old[nt.Name]
		delete(old, nt.Name)
		if !exists {
			dev, t, err := buildTarget(nt, l.log)
			if err == nil {
				if err = l.srv.AddTarget(t); err != nil {
					dev.Close()
				}
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("adding target %s: %w", nt.Name, err))
				continue
			}
			l.devices = append(l.devices, dev)
			l.log.Info("reload: target added", "target", nt.Name, "luns", len(nt.LUNs))
			applied.Targets = append(applied.Targets, nt)
			continue
		}
		kept := ot
		var err error
		if kept.LUNs, err = l.updateLUNs(ot, nt); err != nil {
			errs = append(errs, err)
		}
		if !reflect.DeepEqual(accessOf(ot), accessOf(nt)) {
			t, err := targetAccess(nt)
			if err == nil {
				err = l.srv.UpdateTarget(t)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("target %s: %w", nt.Name, err))
			} else {
				luns := kept.LUNs
				kept = accessOf(nt)
				kept.LUNs, kept.TPGT, kept.PortGroups = luns, ot.TPGT, ot.PortGroups
				l.log.Info("reload: access rules changed", "target", nt.Name)
			}
		}
		applied.Targets = append(applied.Targets, kept)
	}
	for name := range old {
		if err := l.srv.RemoveTarget(name); err != nil {
			errs = append(errs, err)
			continue
		}
		if d := l.device(name); d != nil {
			d.Close()
			l.devices = slices.DeleteFunc(l.devices, func(x *scsitarget.Device) bool { return x == d })
		}
		l.log.Info("reload: target removed", "target", name)
	}
	if !reflect.DeepEqual(ncfg.Discovery, l.cfg.Discovery) {
		if err := setDiscovery(l.srv, ncfg.Discovery); err != nil {
			errs = append(errs, fmt.Errorf("discovery: %w", err))
		} else {
			applied.Discovery = ncfg.Discovery
			l.log.Info("reload: discovery access rules changed")
		}
	}
	rest := func(c config.Config) config.Config { c.Targets, c.Discovery = nil, nil; return c }
	if !reflect.DeepEqual(rest(*ncfg), rest(*l.cfg)) {
		l.log.Warn("reload: portals, limits, metrics, admin socket and iSNS changes take effect at the next start")
	}
	l.cfg = &applied
	return errors.Join(errs...)
}

// accessOf is what UpdateTarget changes: the target without its LUNs
// (updateLUNs' part) and without what needs a restart (its portal group).
func accessOf(t config.Target) config.Target {
	t.LUNs, t.TPGT, t.PortGroups = nil, 0, nil
	return t
}

// updateLUNs brings a target's LUNs from ot to nt: a LUN whose only
// change is a larger or smaller size is resized in place (CAPACITY DATA HAS
// CHANGED); any other change replaces it. It returns the LUNs now in
// place, which differ from nt's where a change failed.
func (l *live) updateLUNs(ot, nt config.Target) ([]config.LUN, error) {
	d := l.device(nt.Name)
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
				n, err := config.ParseSize(lc.Size)
				if err == nil {
					err = d.LU(lc.ID).Resize(n)
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("target %s LUN %d: resize: %w", nt.Name, lc.ID, err))
				} else {
					now[lc.ID] = lc
					l.log.Info("reload: LUN resized", "target", nt.Name, "lun", lc.ID, "size", lc.Size)
				}
				continue
			}
			if err := d.RemoveLU(lc.ID); err != nil {
				errs = append(errs, err)
				continue
			}
			delete(now, lc.ID)
		}
		lu, err := buildLU(nt.Name, lc, l.log)
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
		l.log.Info("reload: LUN added", "target", nt.Name, "lun", lc.ID, "replaced", ok)
	}
	for id := range was {
		if err := d.RemoveLU(id); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(now, id)
		l.log.Info("reload: LUN removed", "target", nt.Name, "lun", id)
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

func (l *live) targetIndex(name string) int {
	return slices.IndexFunc(l.cfg.Targets, func(t config.Target) bool { return t.Name == name })
}

// check validates the configuration with one change made.
func (l *live) check(change func(c *config.Config)) error {
	c := *l.cfg
	c.Targets = slices.Clone(l.cfg.Targets)
	for i := range c.Targets {
		c.Targets[i].LUNs = slices.Clone(c.Targets[i].LUNs)
	}
	change(&c)
	return c.Validate()
}

// AddLU implements admin.Control.
func (l *live) AddLU(n admin.NewLU) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, d := l.targetIndex(n.Target), l.device(n.Target)
	if i < 0 || d == nil {
		return fmt.Errorf("no target %q", n.Target)
	}
	if d.LU(n.LUN) != nil {
		return fmt.Errorf("%s already has LUN %d", n.Target, n.LUN)
	}
	lc := lunConfig(n)
	if err := l.check(func(c *config.Config) { c.Targets[i].LUNs = append(c.Targets[i].LUNs, lc) }); err != nil {
		return err
	}
	lu, err := buildLU(n.Target, lc, l.log)
	if err == nil {
		if err = d.AddLU(lu); err != nil {
			lu.Close()
		}
	}
	if err != nil {
		return err
	}
	l.cfg.Targets[i].LUNs = append(l.cfg.Targets[i].LUNs, lc)
	l.log.Info("admin: LUN added", "target", n.Target, "lun", n.LUN)
	return nil
}

// RemoveLU implements admin.Control.
func (l *live) RemoveLU(name string, lun uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, d := l.targetIndex(name), l.device(name)
	if i < 0 || d == nil {
		return fmt.Errorf("no target %q", name)
	}
	if err := d.RemoveLU(lun); err != nil {
		return err
	}
	l.cfg.Targets[i].LUNs = slices.DeleteFunc(l.cfg.Targets[i].LUNs, func(c config.LUN) bool { return c.ID == lun })
	l.log.Info("admin: LUN removed", "target", name, "lun", lun)
	return nil
}

// ResizeLU implements admin.Control.
func (l *live) ResizeLU(name string, lun uint64, size int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, d := l.targetIndex(name), l.device(name)
	if i < 0 || d == nil || d.LU(lun) == nil {
		return fmt.Errorf("%s has no LUN %d", name, lun)
	}
	if err := d.LU(lun).Resize(size); err != nil {
		return err
	}
	for j := range l.cfg.Targets[i].LUNs {
		if l.cfg.Targets[i].LUNs[j].ID == lun {
			l.cfg.Targets[i].LUNs[j].Size = strconv.FormatInt(size, 10)
		}
	}
	l.log.Info("admin: LUN resized", "target", name, "lun", lun, "size", size)
	return nil
}

// AddTarget implements admin.Control.
func (l *live) AddTarget(n admin.NewTarget) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	tc := config.Target{Name: n.Name, Alias: n.Alias, Initiators: n.Initiators}
	for _, x := range n.LUNs {
		tc.LUNs = append(tc.LUNs, lunConfig(x))
	}
	if err := l.check(func(c *config.Config) { c.Targets = append(c.Targets, tc) }); err != nil {
		return err
	}
	dev, t, err := buildTarget(tc, l.log)
	if err != nil {
		return err
	}
	if err := l.srv.AddTarget(t); err != nil {
		dev.Close()
		return err
	}
	l.devices = append(l.devices, dev)
	l.cfg.Targets = append(l.cfg.Targets, tc)
	l.log.Info("admin: target added", "target", n.Name, "luns", len(tc.LUNs))
	return nil
}

// RemoveTarget implements admin.Control.
func (l *live) RemoveTarget(name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.srv.RemoveTarget(name); err != nil {
		return err
	}
	if d := l.device(name); d != nil {
		d.Close()
		l.devices = slices.DeleteFunc(l.devices, func(x *scsitarget.Device) bool { return x == d })
	}
	l.cfg.Targets = slices.DeleteFunc(l.cfg.Targets, func(t config.Target) bool { return t.Name == name })
	l.log.Info("admin: target removed", "target", name)
	return nil
}

// SetInitiators implements admin.Control: the ACL for logins from now on.
func (l *live) SetInitiators(name string, initiators []string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := l.targetIndex(name)
	if i < 0 {
		return fmt.Errorf("no target %q", name)
	}
	if err := l.check(func(c *config.Config) { c.Targets[i].Initiators = initiators }); err != nil {
		return err
	}
	tc := l.cfg.Targets[i]
	tc.Initiators = initiators
	t, err := targetAccess(tc)
	if err == nil {
		err = l.srv.UpdateTarget(t)
	}
	if err != nil {
		return err
	}
	l.cfg.Targets[i] = tc
	l.log.Info("admin: ACL changed", "target", name, "initiators", initiators)
	return nil
}

// Reload implements admin.Control.
func (l *live) Reload() error {
	if l.path == "" {
		return errors.New("started without --config: no file to reload")
	}
	return l.reload()
}

// Save implements admin.Control: the running configuration, as TOML, to
// path or the file it was read from (written to a new file, synced and
// renamed into place, mode 0600). Secrets stay references: what the file
// had (secret_file, secret_env, or an inline secret). The file replaced is
// kept as PATH.bak first: TOML's encoder keeps no comments.
func (l *live) Save(path string) (string, string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if path == "" {
		path = l.path
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
	if err := toml.NewEncoder(&b).Encode(l.cfg); err != nil {
		return "", "", err
	}
	if err := atomicfile.WriteFile(path, b.Bytes(), 0o600); err != nil {
		return "", "", err
	}
	l.log.Info("admin: configuration saved", "file", path, "backup", backup)
	return path, backup, nil
}

var _ admin.Control = (*live)(nil)
