package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestExamplesValidateAsShipped: every configuration in examples/ passes
// validation as it is — no environment prepared, from any working
// directory (its example secrets are files beside it) (issue 25).
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
