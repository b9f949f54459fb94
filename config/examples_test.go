package config

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/blockwire/blockwire/srp"
)

// TestExamplesValidateAsShipped: every configuration in examples/ passes
// validation as it is — no environment prepared, from any working
// directory (its example secrets are files beside it).
func TestExamplesValidateAsShipped(t *testing.T) {
	files, err := filepath.Glob("../examples/*.toml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples found: %v", err)
	}
	for _, v := range []string{"BLOCKWIRE_CHAP_SECRET", "BLOCKWIRE_MUTUAL_CHAP_SECRET", "BLOCKWIRE_BACKUP_CHAP_SECRET", "BLOCKWIRE_DISCOVERY_CHAP_SECRET"} {
		t.Setenv(v, "")
	}
	for _, f := range files {
		abs, _ := filepath.Abs(f)
		t.Chdir(t.TempDir())
		if _, err := Load(abs); err != nil {
			t.Errorf("%s does not validate as shipped:\n%v", f, err)
		}
	}
}

// TestSecretFileBesideTheConfiguration: a relative secret_file is read from
// the configuration file's directory, not the working directory.
func TestSecretFileBesideTheConfiguration(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "chap"), []byte("a-secret-of-sixteen\n"), 0o600)
	p := filepath.Join(dir, "c.toml")
	os.WriteFile(p, []byte(`[[target]]
name = "iqn.2026-11.org.example:t"
[target.chap]
user = "u"
secret_file = "chap"
[[target.lun]]
id = 0
size = "1MiB"
`), 0o600)
	t.Chdir(t.TempDir())
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := c.Targets[0].CHAP.Value(); err != nil || v != "a-secret-of-sixteen" {
		t.Fatalf("secret %q, %v", v, err)
	}
}

// TestExampleShowsEveryKey: examples/blockwire.toml shows every key of the
// schema (Keys), set or commented out, and every table's header: a key
// added to Config without an example fails here.
func TestExampleShowsEveryKey(t *testing.T) {
	b, err := os.ReadFile("../examples/blockwire.toml")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range Keys() {
		leaf := k.Path[strings.LastIndexByte(k.Path, '.')+1:]
		re := `(?m)^\s*#?\s*` + regexp.QuoteMeta(leaf) + `\s*=`
		if k.Type == "table" || k.Type == "array of tables" {
			re = `(?m)^\s*#?\s*\[\[?` + regexp.QuoteMeta(k.Path) + `\]\]?`
		}
		if !regexp.MustCompile(re).Match(b) {
			t.Errorf("examples/blockwire.toml does not show %s (%s)", k.Path, k.Type)
		}
	}
}

// TestRelativePathsBesideTheFile: every relative path a file names is
// found beside it, from any working directory; RelativeTo writes the paths
// under a directory relative to it again, so a saved file loads the same.
func TestRelativePathsBesideTheFile(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "chap"), []byte("a-secret-of-sixteen\n"), 0o600)
	p := filepath.Join(dir, "c.toml")
	os.WriteFile(p, []byte("[[target]]\nname = \"iqn.2026-11.org.example:t\"\n[target.chap]\nuser = \"u\"\nsecret_file = \"chap\"\n"+
		"[[target.lun]]\nid = 0\nfile = \"images/disk.img\"\nsize = \"1MiB\"\n[[target.lun]]\nid = 1\nfile = \"/dev/null\"\n"), 0o600)
	t.Chdir(t.TempDir())
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Targets[0].LUNs[0].File; got != filepath.Join(dir, "images", "disk.img") {
		t.Errorf("a relative LUN file: %q", got)
	}
	if got := c.Targets[0].LUNs[1].File; got != "/dev/null" {
		t.Errorf("an absolute LUN file: %q", got)
	}
	r := c.RelativeTo(dir)
	if r.Targets[0].LUNs[0].File != filepath.Join("images", "disk.img") || r.Targets[0].CHAP.SecretFile != "chap" || r.Targets[0].LUNs[1].File != "/dev/null" {
		t.Errorf("RelativeTo: %q %q %q", r.Targets[0].LUNs[0].File, r.Targets[0].CHAP.SecretFile, r.Targets[0].LUNs[1].File)
	}
	if c.Targets[0].LUNs[0].File != filepath.Join(dir, "images", "disk.img") {
		t.Error("RelativeTo changed the configuration it was called on")
	}
}

// TestCloneIsDeep: nothing a clone holds is shared with the original: a
// change anywhere in the clone (a list, a table, a pointer) leaves the
// original as it was.
func TestCloneIsDeep(t *testing.T) {
	t.Chdir("../examples")
	c, err := Load("blockwire.toml")
	if err != nil {
		t.Fatal(err)
	}
	wc := false
	c.Targets[1].LUNs[0].WriteCache = &wc
	c.Discovery = &Discovery{Initiators: []string{"a"}, CHAP: &Secret{User: "d"}}
	before := fmt.Sprintf("%#v", *c)
	d := c.Clone()
	// Change every shared place a shallow copy would have.
	*d.Targets[1].LUNs[0].WriteCache = true
	d.Targets[1].LUNs[0].Size = "x"
	d.Targets[1].Initiators[0] = "x"
	d.Targets[1].ACL[0].LUNs[0] = "x"
	d.Targets[1].ACL[0].From[0] = "x"
	d.Targets[1].ACL[1].CHAP.User = "x"
	d.Targets[1].CHAP.User = "x"
	d.Targets[1].MutualCHAP.User = "x"
	d.Discovery.Initiators[0] = "x"
	d.Discovery.CHAP.User = "x"
	d.Listen[0] = "x"
	after := fmt.Sprintf("%#v", *c)
	if before != after || *c.Targets[1].LUNs[0].WriteCache || c.Targets[1].ACL[0].LUNs[0] == "x" || c.Targets[1].CHAP.User == "x" || c.Discovery.CHAP.User == "x" {
		t.Error("a change to the clone reached the original")
	}
}

// TestSRPFromHoldsForListedPorts: an SRP port listed in srp_initiators and
// in an ACL entry with from is admitted only from those networks, as an
// iSCSI name listed both ways is.
func TestSRPFromHoldsForListedPorts(t *testing.T) {
	const port = "0x0000000000000001:0x00000000000000aa"
	id, err := srp.ParsePortID(port)
	if err != nil {
		t.Fatal(err)
	}
	tg := Target{Name: "iqn.2026-11.org.example:t", SRPInitiators: []string{port},
		ACL: []ACL{{SRPInitiator: port, From: []string{"192.0.2.0/24"}}}}
	inside := &net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 1}
	outside := &net.TCPAddr{IP: net.ParseIP("198.51.100.7"), Port: 1}
	if !tg.SRPAllows(id, inside) {
		t.Error("the port from inside its from: refused")
	}
	if tg.SRPAllows(id, outside) {
		t.Error("the port from outside its from: admitted (srp_initiators escaped the entry's from)")
	}
	tg.ACL = nil
	if !tg.SRPAllows(id, outside) {
		t.Error("a port listed without an entry: refused")
	}
}

// TestSizesAsWritten: FormatSize writes what ParseSize reads back, in the
// largest unit that holds the size exactly; HumanSize rounds to one
// decimal where no unit does.
func TestSizesAsWritten(t *testing.T) {
	for n, want := range map[int64]string{64 << 20: "64MiB", 1 << 30: "1GiB", 3<<20 + 512<<10: "3584KiB", 1000: "1000", 512: "512"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
		if back, err := ParseSize(FormatSize(n)); err != nil || back != n {
			t.Errorf("ParseSize(FormatSize(%d)) = %d, %v", n, back, err)
		}
	}
	for n, want := range map[int64]string{64 << 20: "64MiB", 3<<20 + 512<<10: "3.5MiB", 1000: "1000", 1536: "1.5KiB"} {
		if got := HumanSize(n); got != want {
			t.Errorf("HumanSize(%d) = %q, want %q", n, got, want)
		}
	}
}
