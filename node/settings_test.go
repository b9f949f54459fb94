package node

import (
	"testing"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/internal/persource"
	"github.com/blockwire/blockwire/iscsi/iscsitarget"
)

// TestDeclaredDefaultsAreTheLayersOwn: the defaults config.Settings
// declares are those the layers below apply to a zero option when used as
// libraries (iscsitarget.DefaultOptions, the I/O budgets, the IPv6 source
// prefix), and config's largest memory LUN is the memory backend's: the
// node passes the declared values down, so the two must not drift.
func TestDeclaredDefaultsAreTheLayersOwn(t *testing.T) {
	d := (&config.Config{}).WithDefaults()
	lim := d.Limits
	o := iscsitarget.DefaultOptions()
	ioB, sessB, err := lim.Budgets()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key           string
		declared, own any
	}{
		{"limits.login_timeout", lim.LoginTimeout, o.LoginTimeout},
		{"limits.nop_interval", lim.NopInterval, o.NopInterval},
		{"limits.nop_timeout", lim.NopTimeout, o.NopTimeout},
		{"limits.max_sessions", lim.MaxSessions, o.MaxSessions},
		{"limits.max_sessions_per_source", lim.MaxSessionsPerSource, o.MaxSessionsPerSource},
		{"limits.max_working_per_source", lim.MaxWorkingPerSource, o.MaxWorkingPerSource},
		{"limits.max_discovery_sessions", lim.MaxDiscoverySessions, o.MaxDiscoverySessions},
		{"limits.max_logins_per_source", lim.MaxLoginsPerSource, o.MaxLoginsPerSource},
		{"limits.max_connections", lim.MaxConnections, o.MaxConnections},
		{"limits.cmd_window", uint32(lim.CmdWindow), o.CmdWindow},
		{"limits.max_recv_data_segment_length", lim.MaxRecvDataSegmentLength, o.MaxRecvDataSegmentLength},
		{"limits.source_prefix_v6", lim.SourcePrefixV6, persource.DefaultV6Bits},
		{"limits.io_budget", ioB, int64(iscsitarget.DefaultIOBudget)},
		{"limits.session_io_budget", sessB, int64(iscsitarget.DefaultSessionIOBudget)},
		{"config.MaxMemoryLUN", int64(config.MaxMemoryLUN), int64(mem.MaxSize)},
	} {
		if c.declared != c.own {
			t.Errorf("%s: declared %v, the layer's own default %v", c.key, c.declared, c.own)
		}
	}
}
