package node

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/blockwire/blockwire/admin"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/internal/atomicfile"
)

// The administration verbs (package admin's Control): each edits the
// running configuration and goes through commit, as a reload does.

// control is the node as the administration API drives it.
type control struct{ *Node }

// Admin is the node as the administration API (admin.Handler) drives it.
func (n *Node) Admin() admin.Control { return control{n} }

// Reload implements admin.Control.
func (c control) Reload(o admin.ReloadOptions) (admin.ReloadResult, error) {
	ch, err := c.Node.Reload(ReloadOptions{Consent: Consent{Shrink: o.Shrink, Force: o.Force}, DryRun: o.DryRun})
	res := admin.ReloadResult{DryRun: o.DryRun, Changes: ch.Applied, Restart: ch.Restart}
	var r *Refused
	if o.DryRun && errors.As(err, &r) {
		res.Refused, err = r.Reasons, nil
	}
	return res, err
}

// lunConfig is the configuration of a LUN added through the API.
func lunConfig(n admin.NewLU) config.LUN {
	return config.LUN{ID: n.LUN, Size: n.Size, File: n.File, Remote: n.Remote, BlockSize: n.BlockSize, ReadOnly: n.ReadOnly}
}

func targetIndex(c *config.Config, name string) int {
	return slices.IndexFunc(c.Targets, func(t config.Target) bool { return t.Name == name })
}

// targetOf is the named target of c, or an error naming it.
func targetOf(c *config.Config, name string) (*config.Target, error) {
	i := targetIndex(c, name)
	if i < 0 {
		return nil, fmt.Errorf("no target %q", name)
	}
	return &c.Targets[i], nil
}

// lunIndex is the index of a target's LUN (-1: none), or an error when
// there is no such target.
func lunIndex(c *config.Config, target string, lun uint64) (*config.Target, int, error) {
	t, err := targetOf(c, target)
	if err != nil {
		return nil, -1, err
	}
	return t, slices.IndexFunc(t.LUNs, func(l config.LUN) bool { return l.ID == lun }), nil
}

// existingLUN is lunIndex for a LUN that must exist.
func existingLUN(c *config.Config, target string, lun uint64) (*config.Target, int, error) {
	t, j, err := lunIndex(c, target, lun)
	if err == nil && j < 0 {
		err = fmt.Errorf("%s has no LUN %d", target, lun)
	}
	return t, j, err
}

// change is an administration verb: the running configuration with edit
// made, through commit like every change; once made, it is logged as msg
// with args.
func (n *Node) change(c Consent, edit func(c *config.Config) error, msg string, args ...any) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	next := n.cfg.Clone()
	if err := edit(next); err != nil {
		return err
	}
	if _, err := n.commit(next, nil, c, false); err != nil {
		return err
	}
	n.log.Info(msg, args...)
	return nil
}

// changeTarget is a verb that edits one target's settings.
func (n *Node) changeTarget(name string, edit func(t *config.Target), msg string, args ...any) error {
	return n.change(Consent{}, func(c *config.Config) error {
		t, err := targetOf(c, name)
		if err == nil {
			edit(t)
		}
		return err
	}, msg, append([]any{"target", name}, args...)...)
}

// AddLU implements admin.Control.
func (n *Node) AddLU(nl admin.NewLU) error {
	return n.change(Consent{}, func(c *config.Config) error {
		t, j, err := lunIndex(c, nl.Target, nl.LUN)
		switch {
		case err != nil:
			return err
		case j >= 0:
			return fmt.Errorf("%s already has LUN %d", nl.Target, nl.LUN)
		}
		t.LUNs = append(t.LUNs, lunConfig(nl))
		return nil
	}, "admin: LUN added", "target", nl.Target, "lun", nl.LUN)
}

// RemoveLU implements admin.Control.
func (n *Node) RemoveLU(name string, lun uint64, force bool) error {
	return n.change(Consent{Force: force}, func(c *config.Config) error {
		t, j, err := existingLUN(c, name, lun)
		if err != nil {
			return err
		}
		t.LUNs = slices.Delete(t.LUNs, j, j+1)
		return nil
	}, "admin: LUN removed", "target", name, "lun", lun)
}

// ResizeLU implements admin.Control: the new size is kept as an operator
// writes it ("64MiB"). A smaller size needs shrink, and is the one way a
// file LUN's file is truncated.
func (n *Node) ResizeLU(name string, lun uint64, size int64, shrink bool) error {
	return n.change(Consent{Shrink: shrink, truncate: shrink}, func(c *config.Config) error {
		t, j, err := existingLUN(c, name, lun)
		if err != nil {
			return err
		}
		l := &t.LUNs[j]
		if l.Remote != "" || l.RBD != "" {
			return fmt.Errorf("%s LUN %d: its size is the remote LUN's or the image's", name, lun)
		}
		l.Size = config.FormatSize(size)
		return nil
	}, "admin: LUN resized", "target", name, "lun", lun, "size", size)
}

// AddTarget implements admin.Control: the target is served on every
// fabric whose portals serve all targets.
func (n *Node) AddTarget(nt admin.NewTarget) error {
	tc := config.Target{Name: nt.Name, Alias: nt.Alias, Initiators: nt.Initiators}
	for _, x := range nt.LUNs {
		tc.LUNs = append(tc.LUNs, lunConfig(x))
	}
	return n.change(Consent{}, func(c *config.Config) error {
		if targetIndex(c, nt.Name) >= 0 {
			return fmt.Errorf("target %q exists", nt.Name)
		}
		c.Targets = append(c.Targets, tc)
		return nil
	}, "admin: target added", "target", nt.Name, "luns", len(tc.LUNs))
}

// RemoveTarget implements admin.Control: its sessions on every fabric
// end; a target with sessions or commands in progress needs force.
func (n *Node) RemoveTarget(name string, force bool) error {
	return n.change(Consent{Force: force}, func(c *config.Config) error {
		i := targetIndex(c, name)
		if i < 0 {
			return fmt.Errorf("no target %q", name)
		}
		c.Targets = slices.Delete(c.Targets, i, i+1)
		return nil
	}, "admin: target removed", "target", name)
}

// SetInitiators implements admin.Control: the ACL, for sessions logged in
// too (an initiator no longer listed loses its session).
func (n *Node) SetInitiators(name string, initiators []string) error {
	return n.changeTarget(name, func(t *config.Target) { t.Initiators = initiators }, "admin: ACL changed", "initiators", initiators)
}

// Save implements admin.Control: the running configuration, as TOML, to
// path or the configuration file (written to a new file, synced and
// renamed into place, mode 0600), for an operator who wants the live
// changes in the hand-written file — the node's state keeps them without
// it. Secrets stay references (secret_file, secret_env, or an inline
// secret), secret files under the file's directory relative to it; sizes
// as they were written. The file replaced is kept as PATH.bak first:
// TOML's encoder keeps no comments. A saved file that would not load is
// taken back.
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
	old, err := os.ReadFile(path)
	if err == nil {
		backup = path + ".bak"
		if err := atomicfile.WriteFile(backup, old, 0o600); err != nil {
			return "", "", fmt.Errorf("keeping the previous file as %s: %w", backup, err)
		}
		b.WriteString("# (comments of the file it replaced are not kept: that file is " + filepath.Base(backup) + ")\n")
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", "", err
	}
	if err := toml.NewEncoder(&b).Encode(n.cfg.RelativeTo(filepath.Dir(path))); err != nil {
		return "", "", err
	}
	if err := atomicfile.WriteFile(path, b.Bytes(), 0o600); err != nil {
		return "", "", err
	}
	saved, err := config.Load(path)
	if err != nil {
		if backup != "" {
			atomicfile.WriteFile(path, old, 0o600)
		} else {
			atomicfile.Remove(path)
		}
		return "", "", fmt.Errorf("the saved file would not load, so it was taken back: %w", err)
	}
	if same(path, n.opts.ConfigFile) {
		// The file now says what runs: a reload of it changes nothing.
		n.base = saved
		if err := n.record(n.base, n.cfg); err != nil {
			return "", "", err
		}
	}
	n.log.Info("admin: configuration saved", "file", path, "backup", backup)
	return path, backup, nil
}

// same: a and b name one file.
func same(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

var _ admin.Control = control{}

// ChangeACL implements admin.Control.
func (n *Node) ChangeACL(ch admin.ACLChange) error {
	return n.change(Consent{}, func(c *config.Config) error {
		t, err := targetOf(c, ch.Target)
		if err != nil {
			return err
		}
		list := &t.Initiators // the plain list it may be in
		entry := config.ACL{Initiator: ch.Initiator}
		switch {
		case ch.SRP && ch.NVMe:
			return errors.New("an ACL entry is an SRP port or an NVMe host, not both")
		case ch.SRP:
			list, entry = &t.SRPInitiators, config.ACL{SRPInitiator: ch.Initiator}
		case ch.NVMe:
			list, entry = &t.Hosts, config.ACL{Host: ch.Initiator}
		}
		j := slices.IndexFunc(t.ACL, func(a config.ACL) bool {
			return a.Initiator == entry.Initiator && a.SRPInitiator == entry.SRPInitiator && a.Host == entry.Host
		})
		inList := slices.Contains(*list, ch.Initiator)
		dropFromList := func() { *list = slices.DeleteFunc(*list, func(s string) bool { return s == ch.Initiator }) }
		switch {
		case ch.Add && (j >= 0 || inList):
			return fmt.Errorf("%s already admits %s", ch.Target, ch.Initiator)
		case ch.Remove && j < 0 && !inList:
			return fmt.Errorf("%s has no ACL entry for %s", ch.Target, ch.Initiator)
		case ch.Remove:
			if j >= 0 {
				t.ACL = slices.Delete(t.ACL, j, j+1)
			}
			dropFromList()
			return nil
		case j < 0 && !ch.Add && !inList:
			return fmt.Errorf("%s has no ACL entry for %s (add it first)", ch.Target, ch.Initiator)
		case j < 0:
			// New, or a name in the plain list that becomes an entry of
			// its own.
			dropFromList()
			t.ACL = append(t.ACL, entry)
			j = len(t.ACL) - 1
		}
		e := &t.ACL[j]
		if ch.From != nil {
			e.From = slices.Clone(*ch.From)
		}
		e.LUNs = append(e.LUNs, ch.Map...)
		if ch.Unmap != nil {
			m, err := e.LUNMap()
			if err != nil {
				return err
			}
			if _, ok := m[*ch.Unmap]; !ok {
				return fmt.Errorf("%s does not see a LUN %d of %s (its LUNs: %v)", ch.Initiator, *ch.Unmap, ch.Target, e.LUNs)
			}
			e.LUNs = slices.DeleteFunc(e.LUNs, func(s string) bool {
				v, _, _ := strings.Cut(s, "=")
				return strings.TrimSpace(v) == strconv.FormatUint(*ch.Unmap, 10)
			})
			if len(e.LUNs) == 0 {
				return fmt.Errorf("LUN %d is the last LUN %s sees: an entry with no LUN mapped sees every LUN, so remove the entry or map another LUN first", *ch.Unmap, ch.Initiator)
			}
		}
		return nil
	}, "admin: ACL entry changed", "target", ch.Target, "initiator", ch.Initiator, "add", ch.Add, "remove", ch.Remove)
}

// SetCHAP implements admin.Control.
func (n *Node) SetCHAP(ch admin.CHAPChange) error {
	if ch.NVMe {
		return n.setDHCHAP(ch)
	}
	var sec *config.Secret
	if !ch.Clear {
		if ch.User == "" || (ch.Secret == "") == (ch.SecretFile == "") {
			return errors.New("CHAP: a user, and a secret or a secret file (not both)")
		}
		sec = &config.Secret{User: ch.User, Secret: ch.Secret, SecretFile: ch.SecretFile}
	}
	return n.change(Consent{}, func(c *config.Config) error {
		var chap, mutual **config.Secret
		switch {
		case ch.Discovery:
			if c.Discovery == nil {
				c.Discovery = &config.Discovery{}
			}
			chap, mutual = &c.Discovery.CHAP, &c.Discovery.MutualCHAP
		default:
			t, err := targetOf(c, ch.Target)
			if err != nil {
				return err
			}
			chap, mutual = &t.CHAP, &t.MutualCHAP
			if ch.Initiator != "" {
				j := slices.IndexFunc(t.ACL, func(a config.ACL) bool { return a.Initiator == ch.Initiator })
				if j < 0 {
					return fmt.Errorf("%s has no ACL entry for %s (blockwire admin acl-add first)", ch.Target, ch.Initiator)
				}
				if ch.Mutual {
					return errors.New("mutual CHAP is the target's, not an ACL entry's: give no initiator")
				}
				chap = &t.ACL[j].CHAP
			}
		}
		switch {
		case ch.Mutual:
			*mutual = sec
		case ch.Clear && *mutual != nil && ch.Initiator == "":
			return errors.New("clear mutual CHAP first: it needs CHAP")
		default:
			*chap = sec
		}
		return nil
	}, "admin: CHAP changed", "target", ch.Target, "initiator", ch.Initiator, "discovery", ch.Discovery, "mutual", ch.Mutual, "cleared", ch.Clear)
}

// setDHCHAP sets or clears an NVMe host entry's DH-HMAC-CHAP secret (its
// own, or with Mutual the controller's). The new rules hold at once: the
// host's controllers end and it authenticates again (revokeNVMe).
func (n *Node) setDHCHAP(ch admin.CHAPChange) error {
	var sec *config.Secret
	if !ch.Clear {
		if ch.User != "" || (ch.Secret == "") == (ch.SecretFile == "") {
			return errors.New("DH-HMAC-CHAP: a secret or a secret file (not both), and no user (the host NQN names it)")
		}
		sec = &config.Secret{Secret: ch.Secret, SecretFile: ch.SecretFile}
	}
	return n.change(Consent{}, func(c *config.Config) error {
		var acl *[]config.ACL
		switch {
		case ch.Discovery:
			if c.Discovery == nil {
				return errors.New("no [discovery] rules: add the host to them first")
			}
			acl = &c.Discovery.ACL
		default:
			t, err := targetOf(c, ch.Target)
			if err != nil {
				return err
			}
			acl = &t.ACL
		}
		j := slices.IndexFunc(*acl, func(a config.ACL) bool { return a.Host == ch.Initiator })
		if ch.Initiator == "" || j < 0 {
			return fmt.Errorf("%s has no ACL entry for NVMe host %q (blockwire admin acl-add --nvme first)", ch.Target, ch.Initiator)
		}
		e := &(*acl)[j]
		switch {
		case ch.Mutual:
			e.DHCHAPCtrl = sec
		case ch.Clear && e.DHCHAPCtrl != nil:
			return errors.New("clear the controller's secret (--mutual) first: it needs the host's")
		default:
			e.DHCHAP = sec
		}
		return nil
	}, "admin: DH-HMAC-CHAP changed", "target", ch.Target, "host", ch.Initiator, "discovery", ch.Discovery, "controller", ch.Mutual, "cleared", ch.Clear)
}

// SetPortals implements admin.Control.
func (n *Node) SetPortals(name string, portals []string) error {
	return n.changeTarget(name, func(t *config.Target) { t.Portals = portals }, "admin: portals changed", "portals", portals)
}

// Tree implements admin.Control.
func (n *Node) Tree() admin.Tree {
	n.mu.Lock()
	defer n.mu.Unlock()
	tr := admin.Tree{Portals: []string{}, Targets: []admin.TreeTarget{}}
	for _, p := range n.portals {
		tr.Portals = append(tr.Portals, p.Transport+" "+p.Address)
	}
	access := func(t config.Target) admin.TreeAccess {
		a := admin.TreeAccess{Open: !t.Protected() && len(t.SRPInitiators) == 0 && !t.NVMeListed(), Initiators: slices.Concat(t.Initiators, t.SRPInitiators, t.Hosts)}
		if t.CHAP != nil {
			a.CHAPUser = t.CHAP.User
		}
		if t.MutualCHAP != nil {
			a.MutualUser = t.MutualCHAP.User
		}
		for _, e := range t.ACL {
			te := admin.TreeACL{Initiator: cmp.Or(e.Initiator, e.SRPInitiator, e.Host), SRP: e.SRPInitiator != "", NVMe: e.Host != "", From: e.From, LUNs: e.LUNs}
			if e.CHAP != nil {
				te.CHAPUser = e.CHAP.User
			}
			a.ACL = append(a.ACL, te)
		}
		return a
	}
	if d := n.cfg.Discovery; d != nil {
		a := access(d.AsTarget())
		tr.Discovery = &a
	}
	sessions := n.sessionsLocked()
	for _, t := range n.cfg.Targets {
		tt := admin.TreeTarget{Name: t.Name, Alias: t.Alias, TreeAccess: access(t), LUNs: []admin.TreeLUN{}, Sessions: []admin.TreeSession{}}
		tt.Portals = n.iscsiPortals(n.cfg, t)
		if n.nvmeSubs[t.Name] != nil {
			tt.NQN = t.SubsystemNQN()
		}
		if tt.Portals == nil {
			tt.Portals = []string{"every portal"}
		}
		d := n.device(t.Name)
		for _, l := range t.LUNs {
			tl := admin.TreeLUN{LUN: l.ID, Backing: backingOf(l), ReadOnly: l.ReadOnly, Cache: "write-back"}
			if l.WriteCache != nil && !*l.WriteCache {
				tl.Cache = "write-through"
			}
			if d != nil {
				if lu := d.LU(l.ID); lu != nil {
					tl.Size, tl.BlockSize = int64(lu.Blocks())*int64(lu.BlockSize()), lu.BlockSize()
				}
			}
			tt.LUNs = append(tt.LUNs, tl)
		}
		for _, s := range sessions {
			if s.Target == t.Name && !s.Discovery {
				tt.Sessions = append(tt.Sessions, admin.TreeSession{ID: s.ID, Fabric: s.Fabric, Initiator: s.Initiator})
			}
		}
		tr.Targets = append(tr.Targets, tt)
	}
	return tr
}
