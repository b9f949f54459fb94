package config

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// TestEveryNodeSettingIsDeclared: each key at the top of the schema and
// in [limits] that is a value (not a table of targets, portals or
// discovery rules) has exactly one declaration, and each declaration
// names a key of the schema, with a flag of its own, a usage line, and a
// default its key takes.
func TestEveryNodeSettingIsDeclared(t *testing.T) {
	declared := map[string]int{}
	flags := map[string]string{}
	for _, s := range Settings() {
		declared[s.Key]++
		if other, ok := flags[s.Flag]; ok || s.Flag == "" {
			t.Errorf("%s: flag %q (also %s)", s.Key, s.Flag, other)
		}
		flags[s.Flag] = s.Key
		if s.Usage == "" {
			t.Errorf("%s: no usage", s.Key)
		}
		if s.Default != "" {
			var c Config
			if err := c.Set(s.Key, s.Default); err != nil {
				t.Errorf("%s: the default %q is not a value it takes: %v", s.Key, s.Default, err)
			}
		}
		if s.Range != "" && s.Min > s.Max {
			t.Errorf("%s: range %d to %d", s.Key, s.Min, s.Max)
		}
	}
	for _, k := range Keys() {
		top := !strings.Contains(k.Path, ".")
		inLimits := strings.HasPrefix(k.Path, "limits.")
		value := k.Type != "table" && k.Type != "array of tables"
		if (top || inLimits) && value {
			if declared[k.Path] != 1 {
				t.Errorf("%s: declared %d times in Settings", k.Path, declared[k.Path])
			}
			delete(declared, k.Path)
		}
	}
	for k := range declared {
		t.Errorf("Settings declares %s, which is not a node-wide key of the schema", k)
	}
}

// TestSetChecksAsValidateDoes: a value out of its range, or one that does
// not parse, is refused by Set and changes nothing, and Validate refuses
// the same value read from a file — naming the key and the range.
func TestSetChecksAsValidateDoes(t *testing.T) {
	for _, c := range []struct{ key, bad, want string }{
		{"limits.max_connections", "70000", "1 to 65535, RFC 7143 §13.2"},
		{"limits.source_prefix_v6", "129", "1 to 128"},
		{"limits.nop_timeout", "-1s", "not negative"},
		{"limits.io_budget", "16MiB", "at least 64MiB"},
		{"limits.cmd_window", "many", "not a whole number"},
		{"poll", "2ms", "0 to 1ms"},
		{"rdma_memory", "1MiB", "4MiB or more"},
		{"roce_udp_port", "65536", "a UDP port"},
		{"iser", "maybe", "invalid syntax"},
	} {
		var cfg Config
		before := cfg.Clone()
		err := cfg.Set(c.key, c.bad)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Set(%s, %q): %v, want an error saying %q", c.key, c.bad, err, c.want)
		}
		if !reflect.DeepEqual(before, cfg.Clone()) {
			t.Errorf("Set(%s, %q) refused but changed the configuration", c.key, c.bad)
		}
	}
	file := "roce_udp_port = 70000\npoll = \"5ms\"\n[limits]\nmax_connections = 0\ncmd_window = 2000000\nio_budget = \"32MiB\"\n"
	var cfg Config
	_, err := toml.Decode(file, &cfg)
	if err == nil {
		err = cfg.Validate()
	}
	for _, want := range []string{"roce_udp_port: 70000 (a UDP port", "poll: 5ms (0 to 1ms)", "limits.cmd_window: 2000000 (1 to 1048576)", "limits.io_budget: 32MiB (at least 64MiB"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v\nwant it to say %q", err, want)
		}
	}
	if err != nil && strings.Contains(err.Error(), "max_connections") {
		t.Errorf("max_connections = 0 (the default) refused: %v", err)
	}
}

// TestWithDefaults: a setting left unset takes its declared default, one
// set keeps its value, and the configuration itself is not changed (what
// the node records is what was written, not the defaults).
func TestWithDefaults(t *testing.T) {
	cfg := Config{Poll: 50 * time.Microsecond, Limits: Limits{NopTimeout: 3 * time.Second}}
	d := cfg.WithDefaults()
	if d.Poll != 50*time.Microsecond || d.Limits.NopTimeout != 3*time.Second {
		t.Errorf("set values changed: poll %v, nop_timeout %v", d.Poll, d.Limits.NopTimeout)
	}
	if d.Limits.NopInterval != 10*time.Second || d.Limits.IOBudget != "1GiB" || d.ROCEUDPPort != 4791 || d.ISER == nil || !*d.ISER ||
		!reflect.DeepEqual(d.Listen, []string{"127.0.0.1:3260"}) {
		t.Errorf("defaults not applied: %+v", d)
	}
	if cfg.Limits.NopInterval != 0 || cfg.ISER != nil || cfg.Listen != nil {
		t.Errorf("WithDefaults changed its receiver: %+v", cfg)
	}
	empty := (&Config{}).WithDefaults()
	for _, s := range Settings() {
		v, err := empty.Get(s.Key)
		if err != nil {
			t.Fatal(err)
		}
		if s.Default == "" {
			continue
		}
		var want Config
		if err := want.Set(s.Key, s.Default); err != nil {
			t.Fatal(err)
		}
		if w, _ := want.Get(s.Key); !reflect.DeepEqual(v, w) {
			t.Errorf("%s: %v after WithDefaults, want the default %q", s.Key, v, s.Default)
		}
	}
}
