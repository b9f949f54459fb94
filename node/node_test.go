package node

import (
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/blockwire/blockwire/config"
)

func TestMetricsExposedWarning(t *testing.T) {
	for _, c := range []struct {
		ip    string
		token string
		want  bool
	}{
		{"127.0.0.1", "", false}, {"::1", "", false}, {"0.0.0.0", "", true}, {"::", "", true},
		{"192.0.2.7", "", true}, {"192.0.2.7", "t", false},
	} {
		if got := metricsExposed(&net.TCPAddr{IP: net.ParseIP(c.ip), Port: 9100}, c.token); got != c.want {
			t.Errorf("%s token %q: %v", c.ip, c.token, got)
		}
	}
}

// TestTargetResetFromTheACL: target_reset on an ACL entry allows that
// initiator alone, on the target every initiator; SRP entries cannot have
// it.
func TestTargetResetFromTheACL(t *testing.T) {
	const a, b = "iqn.2026-11.org.example:a", "iqn.2026-11.org.example:b"
	tc := config.Target{Name: "iqn.2026-11.org.example:t", ACL: []config.ACL{{Initiator: a, TargetReset: true}, {Initiator: b}},
		LUNs: []config.LUN{{ID: 0, Size: "1MiB"}}}
	it, err := targetAccess(tc, nil)
	if err != nil || !slices.Equal(it.TargetResets, []string{a}) || it.AnyTargetReset {
		t.Errorf("an entry with target_reset: %v %v %v", err, it.TargetResets, it.AnyTargetReset)
	}
	tc.TargetReset = true
	if it, _ = targetAccess(tc, nil); !it.AnyTargetReset {
		t.Error("target_reset on the target does not allow every initiator")
	}
	c := &config.Config{Targets: []config.Target{{Name: tc.Name,
		ACL: []config.ACL{{SRPInitiator: "0x1:0x2", TargetReset: true}}, LUNs: tc.LUNs}}}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "target_reset") {
		t.Errorf("target_reset on an SRP entry: %v", err)
	}
}

// TestMergeConflicts: the three-way merge of the file's changes with the
// live ones, element by element. A side's own change is taken; a removal
// against a change on the other side, or two different changes, is a
// conflict naming the LUN or target.
func TestMergeConflicts(t *testing.T) {
	lun := func(id uint64, size string) config.LUN { return config.LUN{ID: id, Size: size} }
	tg := func(name string, luns ...config.LUN) config.Target { return config.Target{Name: name, LUNs: luns} }
	cfg := func(ts ...config.Target) *config.Config { return &config.Config{Targets: ts} }
	base := cfg(tg("a", lun(0, "8MiB"), lun(1, "8MiB")), tg("b", lun(0, "1MiB")))
	for _, c := range []struct {
		what        string
		ours, file  *config.Config
		want        *config.Config
		conflicting string
	}{
		{"the file adds, live resizes", cfg(tg("a", lun(0, "16MiB"), lun(1, "8MiB")), tg("b", lun(0, "1MiB"))),
			cfg(tg("a", lun(0, "8MiB"), lun(1, "8MiB"), lun(2, "1MiB")), tg("b", lun(0, "1MiB"))),
			cfg(tg("a", lun(0, "16MiB"), lun(1, "8MiB"), lun(2, "1MiB")), tg("b", lun(0, "1MiB"))), ""},
		{"the file removes a LUN resized live", cfg(tg("a", lun(0, "16MiB"), lun(1, "8MiB")), tg("b", lun(0, "1MiB"))),
			cfg(tg("a", lun(1, "8MiB")), tg("b", lun(0, "1MiB"))), nil, "target a LUN 0: removed from the file, but changed live"},
		{"live removes a target the file changed", cfg(tg("a", lun(0, "8MiB"), lun(1, "8MiB"))),
			cfg(tg("a", lun(0, "8MiB"), lun(1, "8MiB")), tg("b", lun(0, "2MiB"))), nil, "target b: removed live, but changed in the file"},
		{"both resize differently", cfg(tg("a", lun(0, "16MiB"), lun(1, "8MiB")), tg("b", lun(0, "1MiB"))),
			cfg(tg("a", lun(0, "32MiB"), lun(1, "8MiB")), tg("b", lun(0, "1MiB"))), nil, "target a LUN 0: changed live and in the file"},
		{"the file removes what nobody changed", cfg(tg("a", lun(0, "8MiB"), lun(1, "8MiB")), tg("b", lun(0, "1MiB"))),
			cfg(tg("a", lun(0, "8MiB"), lun(1, "8MiB"))), cfg(tg("a", lun(0, "8MiB"), lun(1, "8MiB"))), ""},
	} {
		got, conflicts := merge(base, c.ours, c.file)
		switch {
		case c.conflicting != "":
			if len(conflicts) != 1 || !strings.HasPrefix(conflicts[0], c.conflicting) {
				t.Errorf("%s: conflicts %q, want %q", c.what, conflicts, c.conflicting)
			}
		case len(conflicts) > 0:
			t.Errorf("%s: conflicts %q", c.what, conflicts)
		case !slices.EqualFunc(got.Targets, c.want.Targets, equalTarget):
			t.Errorf("%s: merged %+v, want %+v", c.what, got.Targets, c.want.Targets)
		}
	}
}
