package config

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/blockwire/blockwire/nvme/dhchap"
	"github.com/blockwire/blockwire/srp"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"1GiB": 1 << 30, "512MiB": 512 << 20, "4k": 4096, "1G": 1 << 30, "1048576": 1 << 20, "2TiB": 2 << 40} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "0", "-1", "1.5G", "GiB", "9999999999999999999"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) accepted", in)
		}
	}
}

func TestValidName(t *testing.T) {
	for _, n := range []string{"iqn.2026-11.org.blockwire:default", "eui.02004567A425678D", "naa.52004567BA64678D"} {
		if err := ValidName(n); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
	for _, n := range []string{"", "blockwire", "iqn.2026-11.org.blockwire:with space", "iqn." + strings.Repeat("a", 223)} {
		if err := ValidName(n); err == nil {
			t.Errorf("%q accepted", n)
		}
	}
}

func TestLoadReportsEveryError(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(p, []byte(`
listen = ["127.0.0.1:3260", "nohostport"]
roce_listen = ["192.0.2.1:3260", "192.0.2.1"]
srp_roce_listen = ["[2001:db8::1]:5555"]
roce_udp_port = 70000
[limits]
source_prefix_v6 = 129
[[target]]
name = "iqn.2026-11.org.blockwire:a"
[target.chap]
user = "u"
secret = "s1"
secret_env = "ALSO"
[[target.lun]]
id = 0
[[target.lun]]
id = 0
size = "1G"
block_size = 1024
direct = true
[[target.lun]]
id = 2
file = "/dev/null"
io_engine = "aio"
[[target]]
name = "iqn.2026-11.org.blockwire:a"
unknown_key = true
[[target.acl]]
initiator = "not-a-name"
[target.acl.chap]
user = "n"
secret = "too-short"
`), 0o600)
	_, err := Load(p)
	if err == nil {
		t.Fatal("invalid file accepted")
	}
	for _, want := range []string{"listen[1]", "target[0].chap: exactly one of", "target[0].lun[0]: an in-memory LUN needs a size",
		"target[0].lun[1].id: duplicate LUN 0", "target[0].lun[1].block_size",
		"target[0].lun[1]: direct and io_engine are for a file LUN", "target[0].lun[2].io_engine: \"aio\"", "target[1].name: duplicate", "unknown_key",
		"target[1].acl[0].initiator", "target[1]: no lun", "target[1].acl[0].chap: a 9-byte secret is too short",
		"roce_listen[1]", "roce_udp_port: 70000", "limits.source_prefix_v6: 129"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "srp_roce_listen") {
		t.Errorf("a valid [IPv6]:port portal reported:\n%v", err)
	}
}

func TestSecretSources(t *testing.T) {
	f := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(f, []byte("from-file-secret\n"), 0o600)
	t.Setenv("BW_TEST_SECRET", "from-env-secret")
	for _, s := range []Secret{{Secret: "inline-secret"}, {SecretFile: f}, {SecretEnv: "BW_TEST_SECRET"}} {
		v, err := s.Value()
		if err != nil || v == "" || strings.HasSuffix(v, "\n") {
			t.Errorf("%+v: %q %v", s, v, err)
		}
	}
	if _, err := (&Secret{SecretEnv: "BW_TEST_UNSET_VARIABLE"}).Value(); err == nil {
		t.Error("unset environment variable accepted")
	}
}

func TestRemoteLUN(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(p, []byte(`
[[target]]
name = "iqn.2026-11.org.blockwire:gw"
[[target.lun]]
id = 0
remote = "iscsi://u%hunter2hunter2@192.0.2.1/iqn.2026-11.org.example:a/0"
[[target.lun]]
id = 1
remote = "nfs://192.0.2.1/x"
[[target.lun]]
id = 2
remote = "iser://192.0.2.1/iqn.2026-11.org.example:a/1"
size = "1GiB"
`), 0o600)
	_, err := Load(p)
	if err == nil {
		t.Fatal("invalid remote LUNs accepted")
	}
	for _, want := range []string{"lun[1].remote: \"nfs://", "lun[2]: remote excludes file and size"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Errorf("a password in an error:\n%v", err)
	}
	if got := RedactURL("iscsi://u%hunter2@h/t/0"); got != "iscsi://u%(secret)@h/t/0" {
		t.Errorf("RedactURL: %s", got)
	}
}

func TestRBDLUNAndPortGroups(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(p, []byte(`
[[target]]
name = "iqn.2026-11.org.example:gw"
tpgt = 2
port_groups = ["1=active-optimized", "2=ano"]
[[target.lun]]
id = 0
rbd = "rbd/disk"
ceph_conf = "/etc/ceph/ceph.conf"
[[target.lun]]
id = 1
rbd = "rbd/ns/disk"
`), 0o600)
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Targets[0].TPGT != 2 || c.Targets[0].LUNs[0].RBD != "rbd/disk" || c.Targets[0].LUNs[0].CephConf != "/etc/ceph/ceph.conf" {
		t.Fatalf("%+v", c.Targets[0])
	}
	os.WriteFile(p, []byte(`
[[target]]
name = "iqn.2026-11.org.example:gw"
port_groups = ["2=active-optimized", "3=fast", "x"]
[[target.lun]]
id = 0
rbd = "rbd"
[[target.lun]]
id = 1
rbd = "rbd/disk"
size = "1GiB"
`), 0o600)
	_, err = Load(p)
	if err == nil {
		t.Fatal("invalid RBD LUNs and port groups accepted")
	}
	for _, want := range []string{`lun[0].rbd: "rbd" is not pool/image`, "lun[1]: rbd excludes remote, file and size",
		`port group "3=fast"`, `port group "x"`, "none is this target's own group 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// TestSRPNeedsItsOwnACLForAProtectedTarget: a target with an ACL or CHAP
// served over SRP, which can check neither, is refused unless its SRP
// initiators are listed (SRP served a target whose ACL refused
// the same initiator over iSCSI).
func TestSRPNeedsItsOwnACLForAProtectedTarget(t *testing.T) {
	base := func() *Config {
		return &Config{SRPListen: []string{"127.0.0.1:5555"}, Targets: []Target{{
			Name: "iqn.2026-11.org.blockwire:a", Initiators: []string{"iqn.2026-11.org.example:x"},
			LUNs: []LUN{{ID: 0, Size: "1MiB"}}}}}
	}
	c := base()
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "srp_initiators") {
		t.Fatalf("protected target on SRP without srp_initiators: %v", err)
	}
	c.Targets[0].SRPInitiators = []string{"0x0000000000000001c8995efffe09646d"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	id, _ := srp.ParsePortID("1:c8995efffe09646d")
	other, _ := srp.ParsePortID("2:c8995efffe09646d")
	if !c.Targets[0].SRPAllows(id, nil) || c.Targets[0].SRPAllows(other, nil) {
		t.Fatal("SRPAllows does not follow srp_initiators")
	}
	c.Targets[0].SRPInitiators = []string{"nonsense"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "srp_initiators[0]") {
		t.Fatalf("bad port ID: %v", err)
	}
	c = base()
	c.SRPListen = nil
	if err := c.Validate(); err != nil {
		t.Fatalf("not on SRP: %v", err)
	}
	c = base()
	c.Targets[0].Initiators = nil
	if err := c.Validate(); err != nil || !c.Targets[0].SRPAllows(other, nil) {
		t.Fatalf("an open target admits every SRP port: %v", err)
	}
	c.Targets[0].CHAP = &Secret{User: "u", Secret: "0123456789abcdef"}
	if c.Targets[0].SRPAllows(other, nil) {
		t.Fatal("a CHAP-protected target admitted an SRP port without srp_initiators")
	}
}

func TestDiscoveryAndRedirect(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(p, []byte(`
[discovery]
initiators = ["not-a-name"]
[discovery.chap]
user = "d"
secret = "short"
[[target]]
name = "iqn.2026-11.org.blockwire:moved"
redirect = "192.0.2.7"
[[target]]
name = "iqn.2026-11.org.blockwire:b"
redirect_permanent = true
[[target.lun]]
id = 0
size = "1MiB"
`), 0o600)
	_, err := Load(p)
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"discovery.initiators[0]", "discovery.chap: a 5-byte secret is too short", "target[0].redirect: \"192.0.2.7\"", "target[1].redirect_permanent: needs redirect"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "target[0]: no lun") {
		t.Errorf("a redirecting target needs no LUN:\n%v", err)
	}
	os.WriteFile(p, []byte(`
[discovery]
[discovery.chap]
user = "d"
secret = "discovery-secret"
[[target]]
name = "iqn.2026-11.org.blockwire:moved"
redirect = "[::1]:3261,2"
redirect_permanent = true
`), 0o600)
	if _, err := Load(p); err != nil {
		t.Fatal(err)
	}
}

func TestACLEntriesAndPortals(t *testing.T) {
	c := &Config{Targets: []Target{{Name: "iqn.2026-11.org.blockwire:a", Portals: []string{"nohostport"},
		ACL: []ACL{
			{Initiator: "iqn.2026-11.org.example:x", From: []string{"10.0.0.0/8", "not-an-address"}, LUNs: []string{"0=7", "1=0", "1=0"}},
			{Initiator: "iqn.2026-11.org.example:y", SRPInitiator: "1:2"},
			{SRPInitiator: "1:2", CHAP: &Secret{User: "u", Secret: "0123456789abcdef"}},
		},
		LUNs: []LUN{{ID: 0, Size: "1MiB"}}}}}
	err := c.Validate()
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"portals[0]", "acl[0].from", "acl[0].luns: LUN 1 mapped twice", "acl[1]: more than one of initiator, srp_initiator and host set", "acl[2].chap: SRP has no CHAP"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	c.Targets[0].ACL = []ACL{{Initiator: "iqn.2026-11.org.example:x", LUNs: []string{"0=7"}}}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "LUN 7 (seen as 0) is not a LUN of the target") {
		t.Fatalf("a map to a missing LUN: %v", err)
	}
	a := ACL{From: []string{"10.0.0.0/8", "192.0.2.7", "fd00::/8"}}
	src, err := a.Sources()
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]bool{"10.1.2.3:1": true, "192.0.2.7:3260": true, "192.0.2.8:3260": false, "[fd00::1]:5": true, "[::ffff:10.0.0.1]:1": true} {
		ap := netip.MustParseAddrPort(addr)
		if got := AdmitsFrom(src, net.TCPAddrFromAddrPort(ap)); got != want {
			t.Errorf("%s: %v", addr, got)
		}
	}
	// Only SRP initiators listed: no iSCSI initiator is admitted.
	only := Target{ACL: []ACL{{SRPInitiator: "1:2"}}}
	if got := only.AllowedInitiators(); got == nil || len(got) != 0 || !only.Protected() {
		t.Fatalf("SRP-only ACL: %v", got)
	}
}

// RedactURL hides the password wherever the URL came from (the node's
// logs, the client verbs' messages): one rule, the last @ ends the
// user information (RFC 3986 §3.2.1; a password may hold an @).
func TestRedactURLForms(t *testing.T) {
	for in, want := range map[string]string{
		"iscsi://u%p@h/t/0":         "iscsi://u%(secret)@h/t/0",
		"iser://u%p@ss@h:3260/t/1":  "iser://u%(secret)@h:3260/t/1",
		"srp://h/t/0":               "srp://h/t/0",
		"iscsi://u@h/t/0":           "iscsi://u@h/t/0",
		"/var/lib/images/a%b@c.img": "/var/lib/images/a%b@c.img",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestDHCHAPValidation: DH-HMAC-CHAP secrets are an NVMe host entry's,
// in the DHHC-1 form, without a user; the controller's needs the host's
// and differs from it; a host's secret protects the target.
func TestDHCHAPValidation(t *testing.T) {
	good := dhchap.NewSecret(32, dhchap.SHA256).String()
	other := dhchap.NewSecret(32, 0).String()
	base := func(acl ...ACL) *Config {
		return &Config{Targets: []Target{{Name: "iqn.2026-11.org.blockwire:a", ACL: acl, LUNs: []LUN{{ID: 0, Size: "1MiB"}}}}}
	}
	const host = "nqn.2014-08.org.nvmexpress:uuid:0000000a-0000-4000-8000-000000000000"
	ok := base(ACL{Host: host, DHCHAP: &Secret{Secret: good}, DHCHAPCtrl: &Secret{Secret: other}})
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	if !ok.Targets[0].Protected() {
		t.Error("a target whose host must authenticate is not protected")
	}
	h, c, err := ok.Targets[0].NVMeAuth(host)
	if err != nil || h == nil || c == nil || h.String() != good || c.String() != other {
		t.Fatalf("NVMeAuth: %v", err)
	}
	for want, cfg := range map[string]*Config{
		"DHHC-1":                      base(ACL{Host: host, DHCHAP: &Secret{Secret: "not a secret"}}),
		"has no user":                 base(ACL{Host: host, DHCHAP: &Secret{User: "u", Secret: good}}),
		"needs dhchap as well":        base(ACL{Host: host, DHCHAPCtrl: &Secret{Secret: good}}),
		"the same secret":             base(ACL{Host: host, DHCHAP: &Secret{Secret: good}, DHCHAPCtrl: &Secret{Secret: good}}),
		"DH-HMAC-CHAP is NVMe's":      base(ACL{Initiator: "iqn.2026-11.org.blockwire:i", DHCHAP: &Secret{Secret: good}}),
		"authenticates with dhchap":   base(ACL{Host: host, CHAP: &Secret{User: "u", Secret: "0123456789abcdef"}}),
		"exactly one of secret, secr": base(ACL{Host: host, DHCHAP: &Secret{}}),
	} {
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want an error with %q, got %v", want, err)
		}
	}
}
