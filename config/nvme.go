package config

import (
	"fmt"
	"net"
	"regexp"
	"strings"

	"github.com/blockwire/blockwire/nvme/dhchap"
)

// NVMeTCP is NVMe over Fabrics on TCP (the NVMe/TCP transport binding):
// every target a portal of it serves is an NVM subsystem (Target.NQN)
// whose namespaces are its LUNs, namespace ID = LUN + 1.
const NVMeTCP = "nvme-tcp"

// NQNPrefix is what a target's subsystem NQN is made of when the target
// names none and its name is not an NQN: NQNPrefix + the name.
const NQNPrefix = "nqn.2026-11.io.blockwire:"

// nqnRE is an NQN as NVMe Base 2.0 §4.5 writes it: "nqn.yyyy-mm." and a
// reverse domain name, then ":" and a string of the owner's choosing —
// or the UUID form "nqn.2014-08.org.nvmexpress:uuid:…".
var nqnRE = regexp.MustCompile(`^nqn\.[0-9]{4}-[0-9]{2}\.[A-Za-z0-9][A-Za-z0-9.-]*(:.+)?$`)

// ValidNQN checks an NVMe Qualified Name: its form and at most 223 bytes.
func ValidNQN(n string) error {
	switch {
	case n == "":
		return fmt.Errorf("empty NQN")
	case len(n) > 223:
		return fmt.Errorf("NQN of %d bytes exceeds 223", len(n))
	case !nqnRE.MatchString(n):
		return fmt.Errorf("%q is not an NQN (nqn.yyyy-mm.reverse.domain:name)", n)
	case n == "nqn.2014-08.org.nvmexpress.discovery":
		return fmt.Errorf("%q is the discovery subsystem's NQN", n)
	}
	return nil
}

// SubsystemNQN is the NQN the target is served under over NVMe: its nqn,
// else its name when that is an NQN, else NQNPrefix + its name.
func (t *Target) SubsystemNQN() string {
	switch {
	case t.NQN != "":
		return t.NQN
	case strings.HasPrefix(t.Name, "nqn."):
		return t.Name
	}
	return NQNPrefix + t.Name
}

// NVMeListed reports whether the target lists NVMe hosts (hosts, or
// acl entries with a host).
func (t *Target) NVMeListed() bool {
	if len(t.Hosts) > 0 {
		return true
	}
	for _, a := range t.ACL {
		if a.Host != "" {
			return true
		}
	}
	return false
}

// HostEntry returns the ACL entry of an NVMe host.
func (t *Target) HostEntry(host string) (ACL, bool) {
	for _, a := range t.ACL {
		if a.Host != "" && a.Host == host {
			return a, true
		}
	}
	return ACL{}, false
}

// NVMeAllows reports whether an NVMe host (its NQN) may connect from
// remote. As with SRP, a target with an ACL or CHAP admits only the
// hosts it lists (and a host whose entry has a dhchap secret must then
// authenticate: NVMeAuth); one without either admits every host unless
// it lists some.
func (t *Target) NVMeAllows(host string, remote net.Addr) bool {
	if !t.NVMeListed() {
		return !t.Protected()
	}
	if a, ok := t.HostEntry(host); ok {
		return a.admitsFrom(remote)
	}
	for _, h := range t.Hosts {
		if h == host {
			return true
		}
	}
	return false
}

// NVMeTargets returns the indexes of the targets served over NVMe: those
// an nvme-tcp portal serves.
func (c *Config) NVMeTargets() []int {
	var out []int
	portals := c.AllPortals()
	for i, t := range c.Targets {
		for _, p := range portals {
			if p.Transport == NVMeTCP && p.Serves(t.Name) {
				out = append(out, i)
				break
			}
		}
	}
	return out
}

// validateNVMe checks the NVMe side of the configuration: NQNs valid and
// distinct, host entries, and that a protected target served over NVMe
// says which hosts it admits.
func (c *Config) validateNVMe(add func(format string, args ...any)) {
	for i, l := range c.NVMeListen {
		if _, _, err := net.SplitHostPort(l); err != nil {
			add("nvme_listen[%d]: %q is not host:port", i, l)
		}
	}
	seen := map[string]string{}
	for i, t := range c.Targets {
		where := fmt.Sprintf("target[%d]", i)
		if t.NQN != "" {
			if err := ValidNQN(t.NQN); err != nil {
				add("%s.nqn: %v", where, err)
			}
		}
		nqn := t.SubsystemNQN()
		if other, dup := seen[nqn]; dup {
			add("%s: subsystem NQN %s is target %s's too", where, nqn, other)
		}
		seen[nqn] = t.Name
		for j, h := range t.Hosts {
			if err := ValidNQN(h); err != nil {
				add("%s.hosts[%d]: %v", where, j, err)
			}
		}
	}
	nvmeNamed := map[string]bool{}
	for _, p := range c.Portals {
		if p.Transport == NVMeTCP {
			for _, n := range p.Targets {
				nvmeNamed[n] = true
			}
		}
	}
	for _, i := range c.NVMeTargets() {
		t := c.Targets[i]
		if err := ValidNQN(t.SubsystemNQN()); err != nil {
			add("target[%d] (%s) is served over NVMe: %v (set nqn)", i, t.Name, err)
		}
		if t.Protected() && !t.NVMeListed() && (nvmeNamed[t.Name] || len(c.Portals) == 0) {
			add("target[%d] (%s) is served over NVMe and has an ACL or CHAP, which NVMe/TCP cannot check here (no in-band authentication yet): list the host NQNs it admits (hosts) or do not serve it over NVMe", i, t.Name)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// NVMeAuth returns the DH-HMAC-CHAP secrets of host: its own, which it
// must authenticate with (nil: it need not), and the controller's, for a
// host that asks the controller to authenticate (nil: none). A secret
// that cannot be read is an error (validation reports it at load; a file
// changed since fails the host's connections, never admits it without).
func (t *Target) NVMeAuth(host string) (hostKey, ctrlKey *dhchap.Secret, err error) {
	a, ok := t.HostEntry(host)
	if !ok || a.DHCHAP == nil {
		return nil, nil, nil
	}
	read := func(s *Secret) (*dhchap.Secret, error) {
		v, err := s.Value()
		if err != nil {
			return nil, err
		}
		k, err := dhchap.ParseSecret(v)
		return &k, err
	}
	if hostKey, err = read(a.DHCHAP); err != nil {
		return nil, nil, fmt.Errorf("dhchap of %s: %w", host, err)
	}
	if a.DHCHAPCtrl != nil {
		if ctrlKey, err = read(a.DHCHAPCtrl); err != nil {
			return nil, nil, fmt.Errorf("dhchap_ctrl of %s: %w", host, err)
		}
	}
	return hostKey, ctrlKey, nil
}

// validateDHCHAP checks an NVMe host entry's DH-HMAC-CHAP secrets.
func validateDHCHAP(where string, a ACL, add func(format string, args ...any)) {
	if a.DHCHAPCtrl != nil && a.DHCHAP == nil {
		add("%s.dhchap_ctrl: needs dhchap as well (the host authenticates first)", where)
	}
	var vals []string
	for _, s := range []struct {
		name string
		sec  *Secret
	}{{"dhchap", a.DHCHAP}, {"dhchap_ctrl", a.DHCHAPCtrl}} {
		if s.sec == nil {
			continue
		}
		if s.sec.User != "" {
			add("%s.%s.user: DH-HMAC-CHAP has no user (the host NQN names it)", where, s.name)
		}
		v, err := s.sec.Value()
		if err != nil {
			add("%s.%s: %v", where, s.name, err)
			continue
		}
		if _, err := dhchap.ParseSecret(v); err != nil {
			add("%s.%s: %v", where, s.name, err)
			continue
		}
		vals = append(vals, v)
	}
	if len(vals) == 2 && vals[0] == vals[1] {
		add("%s: dhchap and dhchap_ctrl are the same secret (a controller proving itself with the host's own secret proves nothing)", where)
	}
}
