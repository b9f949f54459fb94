package main

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestServeFlagsBecomeConfig: serve only turns flags and the file into a
// configuration for the node: the default target from the LUN flags,
// portals and limits from the flags, and a flag given on the command line
// wins over the file while the file's other settings stay.
func TestServeFlagsBecomeConfig(t *testing.T) {
	f := newServeFlags(io.Discard)
	cfg, opts, code := f.parse([]string{"--listen", "127.0.0.1:3333", "--srp-listen", "127.0.0.1:5555", "--size", "64MiB",
		"--nop-timeout", "3s", "--io-budget", "256MiB", "--iser=false", "--header-digest", "required", "--iqn", "iqn.2026-11.org.example:x"}, io.Discard)
	if cfg == nil {
		t.Fatalf("parse: exit %d", code)
	}
	if !slices.Equal(cfg.Listen, []string{"127.0.0.1:3333"}) || !slices.Equal(cfg.SRPListen, []string{"127.0.0.1:5555"}) {
		t.Errorf("portals: listen %v srp %v", cfg.Listen, cfg.SRPListen)
	}
	if cfg.Limits.NopTimeout != 3*time.Second || cfg.Limits.IOBudget != "256MiB" || cfg.Limits.MaxSessions != 0 {
		t.Errorf("limits %+v: want the two flags given and the rest left to the node's defaults", cfg.Limits)
	}
	if cfg.ISER == nil || *cfg.ISER || !opts.RequireHeaderDigest || opts.RequireDataDigest {
		t.Errorf("iser %v, digests %v/%v", cfg.ISER, opts.RequireHeaderDigest, opts.RequireDataDigest)
	}
	if len(cfg.Targets) != 1 || cfg.Targets[0].Name != "iqn.2026-11.org.example:x" || cfg.Targets[0].LUNs[0].Size != "64MiB" {
		t.Errorf("default target %+v", cfg.Targets)
	}

	// --poll becomes poll; more than a millisecond is refused.
	if cfg, _, _ := newServeFlags(io.Discard).parse([]string{"--poll", "50us"}, io.Discard); cfg == nil || cfg.Poll != 50*time.Microsecond {
		t.Errorf("--poll 50us: %+v", cfg)
	}
	if cfg, _, code := newServeFlags(io.Discard).parse([]string{"--poll", "5ms"}, io.Discard); cfg != nil || code != 2 {
		t.Errorf("--poll 5ms: exit %d, want 2", code)
	}

	file := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(file, []byte(`listen = ["127.0.0.1:4444"]
metrics = "127.0.0.1:9999"
[limits]
cmd_window = 64
nop_timeout = "20s"
[[target]]
name = "iqn.2026-11.org.example:file"
[[target.lun]]
id = 0
size = "8MiB"
`), 0o600)
	cfg, opts, code = newServeFlags(io.Discard).parse([]string{"--config", file, "--nop-timeout", "5s"}, io.Discard)
	if cfg == nil {
		t.Fatalf("parse with --config: exit %d", code)
	}
	if cfg.Limits.NopTimeout != 5*time.Second || cfg.Limits.CmdWindow != 64 {
		t.Errorf("limits %+v: want the flag's nop_timeout and the file's cmd_window", cfg.Limits)
	}
	if !slices.Equal(cfg.Listen, []string{"127.0.0.1:4444"}) || cfg.Metrics != "127.0.0.1:9999" || opts.ConfigFile != file {
		t.Errorf("listen %v metrics %q config file %q: want the file's", cfg.Listen, cfg.Metrics, opts.ConfigFile)
	}
	if cfg, _, code := newServeFlags(io.Discard).parse([]string{"--config", file, "--size", "1GiB"}, io.Discard); cfg != nil || code != 2 {
		t.Errorf("--config with --size: exit %d, want 2 (the file describes the targets)", code)
	}
}
