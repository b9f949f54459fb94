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
