package config

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// FuzzParseSize: a size it accepts is a positive byte count no larger than
// 2^62, and that count written plainly parses to itself.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"1GiB", "512MiB", "4k", "1G", "1048576", "2TiB", " 7 M ", "0", "-1", "1.5G", "GiB", "4611686018427387904", "4194304T"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			return
		}
		if n <= 0 || n > 1<<62 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
		if m, err := ParseSize(strconv.FormatInt(n, 10)); err != nil || m != n {
			t.Fatalf("ParseSize(%q) = %d, but %d parses to %d, %v", s, n, n, m, err)
		}
	})
}

// FuzzLoad: any file either loads or is refused with an error — never a
// panic — and what loads validates again as it is.
func FuzzLoad(f *testing.F) {
	if b, err := os.ReadFile("../examples/blockwire.toml"); err == nil {
		f.Add(b)
	}
	f.Add([]byte("listen = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.example:t\"\n[[target.lun]]\nsize = \"64MiB\"\n"))
	f.Add([]byte("[[target]]\nname = \"iqn.2026-11.org.example:t\"\n[target.chap]\nuser = \"u\"\nsecret = \"0123456789abcdef\"\n[[target.acl]]\ninitiator = \"iqn.x\"\n[[target.lun]]\nfile = \"/nonexistent\"\nsize = 1\n"))
	f.Add([]byte("[discovery]\nredirect = \"10.0.0.1:3260\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), "c.toml")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(p)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Load accepted a configuration that Validate then refuses: %v", err)
		}
	})
}
