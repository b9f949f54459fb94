package main

import (
	"flag"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestFlagsTableAgreesWithServe: docs/configuration.md's table of serve's
// flags has a row for every flag serve takes and none for a flag it does
// not, and each row's default is the flag's own (for the node-wide
// settings, the one config.Settings declares).
func TestFlagsTableAgreesWithServe(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	fs := newServeFlags(io.Discard).fs
	row := regexp.MustCompile("(?m)^\\| (`--[^|]*) \\|([^|]*)\\|")
	name := regexp.MustCompile("`--([a-z0-9-]+)")
	documented := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(string(b), -1) {
		names := name.FindAllStringSubmatch(m[1], -1)
		defaults := strings.Split(m[2], ", ")
		for i, n := range names {
			fl := fs.Lookup(n[1])
			if fl == nil {
				t.Errorf("docs/configuration.md documents --%s, which serve does not take", n[1])
				continue
			}
			documented[n[1]] = true
			def := strings.TrimSpace(m[2])
			if len(defaults) == len(names) {
				def = strings.TrimSpace(defaults[i])
			}
			switch fl.DefValue {
			case "", "false":
			default:
				if n[1] == "admin-http-token" { // under the user's runtime directory
					continue
				}
				if def != "`"+fl.DefValue+"`" {
					t.Errorf("docs/configuration.md gives --%s the default %s; serve's is %q", n[1], def, fl.DefValue)
				}
			}
		}
	}
	fs.VisitAll(func(fl *flag.Flag) {
		if !documented[fl.Name] {
			t.Errorf("docs/configuration.md has no row for --%s", fl.Name)
		}
	})
}
