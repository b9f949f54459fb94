package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunTellsTheKinds: a bench --json result, a harness comparison and a
// queue-depth sweep each come out as an SVG of their own kind; anything
// else is an error.
func TestRunTellsTheKinds(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ name, in, want string }{
		{"run", `{"rw":"randread","bs":4096,"qd":1,"iops":100,"ios_by_second":[100],"latency_distribution_us":[{"percentile":50,"us":80}]}`, "latency distribution"},
		{"compare", `{"title":"per core","targets":["spdk","blockwire"],"rows":[{"workload":"4k","unit":"IOPS","higher_is_better":true,"runs":{"spdk":[2],"blockwire":[1]}}]}`, "relative to spdk"},
		{"sweep", `{"title":"sweep","workload":"4k randread","targets":["spdk","blockwire"],"depths":[1,32],"iops":{"spdk":[[13000],[71000]],"blockwire":[[9000],[60000]]},
			"latency_distribution_us":{"spdk":[[{"percentile":50,"us":70}],[{"percentile":50,"us":400}]],"blockwire":[[{"percentile":50,"us":100}],[{"percentile":50,"us":500}]]}}`, "latency distribution at QD 32"},
	} {
		in, out := filepath.Join(dir, c.name+".json"), filepath.Join(dir, c.name+".svg")
		os.WriteFile(in, []byte(c.in), 0o600)
		if err := run(out, []string{in}); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if b, _ := os.ReadFile(out); !strings.Contains(string(b), c.want) {
			t.Errorf("%s: the SVG lacks %q", c.name, c.want)
		}
	}
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"nothing":1}`), 0o600)
	if err := run(filepath.Join(dir, "bad.svg"), []string{bad}); err == nil {
		t.Error("a file of neither kind was drawn")
	}
}
