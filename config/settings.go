package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Setting declares one node-wide setting — a key at the top of the file
// or in its [limits] table — in the one place where its flag, default,
// meaning, bounds and reload behaviour are written. From it come serve's
// flag of the same meaning (cmd/blockwire), the range checks of Validate
// (and so of config check), blockwire config keys' defaults (and so the
// man page's CONFIGURATION section), the defaults the node applies
// (WithDefaults), and the agreement tests that hold docs/configuration.md
// and the iSCSI target's own defaults to it. Config's field is where a
// value is kept: Key names it by its toml tag.
//
// Per-target and per-LUN keys ([[target]], [[target.lun]]) are not
// settings of the node: Validate checks them, and a reload applies them
// to what runs.
type Setting struct {
	// Key is the key as the file writes it: "poll", "limits.nop_timeout".
	Key string
	// Flag is serve's flag for it, without dashes; a flag given wins over
	// the file. A list's flag is repeated, and its values replace the
	// file's list.
	Flag string
	// Default is the value that applies when the file and the flags leave
	// the setting unset (its zero value), as the file would write it; ""
	// when unset means off or none.
	Default string
	// Usage says what it does in one line: the flag's help.
	Usage string
	// Min and Max bound an integer, a duration (in nanoseconds) or a size
	// (in bytes) when Range is set; Range says the bounds in words for
	// the error, with the specification that sets them where one does.
	// The zero value (unset) is always taken: it means the default.
	Min, Max int64
	Range    string
	// Reload says when a change takes effect.
	Reload Reload
}

// Reload says when a change to a setting takes effect.
type Reload uint8

const (
	// AtStart: the value is read when serve starts. A reload that
	// changes it in the file leaves it as it runs and names it among the
	// changes that wait for a restart.
	AtStart Reload = iota
	// Live: a reload applies it to what runs.
	Live
)

func (r Reload) String() string {
	if r == Live {
		return "live"
	}
	return "restart"
}

// Settings returns every node-wide setting, in the order the file's
// schema declares them.
func Settings() []Setting {
	const (
		forever = 1<<63 - 1
		mib     = 1 << 20
	)
	return []Setting{
		{Key: "listen", Flag: "listen", Default: "127.0.0.1:3260", Usage: "iSCSI/TCP portal address host:port (repeatable; the default when no portal is given)"},
		{Key: "metrics", Flag: "metrics", Usage: "serve Prometheus metrics on host:port (GET /metrics)"},
		{Key: "admin_socket", Flag: "admin-socket", Usage: "serve the administration API on this Unix socket (blockwire admin)"},
		{Key: "admin_dirs", Flag: "admin-dir", Usage: "a directory in which the administration API may name LUN files and save destinations (repeatable; none: no paths)"},
		{Key: "isns", Flag: "isns", Usage: "register the targets and portals with this iSNS server (host[:port], RFC 4171)"},
		{Key: "iser", Flag: "iser", Default: "true", Usage: "also serve iSER (software iWARP, connection-first as Linux ib_iser, or RFC 5046's upgrade) on every iSCSI portal"},
		{Key: "srp_listen", Flag: "srp-listen", Usage: "also serve every target over SRP (software iWARP, as Linux ib_srp reaches it through RDMA/CM) on host:port (repeatable)"},
		{Key: "nvme_listen", Flag: "nvme-listen", Usage: "also serve every target over NVMe/TCP on host:port (repeatable; 4420 is NVMe/TCP's port): each target an NVM subsystem, each LUN N its namespace N+1"},
		{Key: "srp_id_ext", Flag: "srp-id-ext", Usage: "the first target's SRP target port: ID_EXT[:IOC_GUID] in hex (default: derived from the target name)"},
		{Key: "roce_listen", Flag: "roce-listen", Usage: "also serve iSER through RDMA/CM on address:port (IPv4 or [IPv6]), the port being the one the service ID names, on the RDMA device --rdma-device picks for that address (repeatable)"},
		{Key: "srp_roce_listen", Flag: "srp-roce-listen", Usage: "also serve every target over SRP through RDMA/CM on address:port (IPv4 or [IPv6]), the login in the connection request as Linux ib_srp sends it, on the RDMA device --rdma-device picks for that address (repeatable)"},
		{Key: "roce_udp_port", Flag: "roce-udp-port", Default: "4791", Min: 1, Max: 65535, Range: "a UDP port, 1 to 65535",
			Usage: "UDP port of the software RoCEv2 device (4791 is RoCEv2's; a kernel rxe on the same address owns it)"},
		{Key: "roce_gso", Flag: "roce-gso", Default: "true", Usage: "the software RoCEv2 device sends runs of packets as UDP GSO datagrams; false: one datagram per packet (packet captures on this host then show packets)"},
		{Key: "poll", Flag: "poll", Default: "0s", Min: 0, Max: int64(time.Millisecond), Range: "0 to 1ms",
			Usage: "the target's receivers (each iSCSI/TCP and NVMe/TCP connection's reader — one a core at a time, none while another has just gone to sleep — each software RoCEv2 device's) poll their sockets, and an I/O alone on a file LUN's io_uring its completion, up to this long before they sleep, each adapting within it to how long its peer takes to answer: lower latency at low queue depths for the CPU the polling takes while traffic flows; 0: off"},
		{Key: "rdma_device", Flag: "rdma-device", Default: "auto", Usage: "the RDMA device under the RoCE portals: auto (the kernel RDMA device of each address — an RDMA NIC, rxe, siw — in a build with verbs support, else the software RoCEv2 device), soft, or a device name as \"blockwire rdma\" lists it"},
		{Key: "rdma_memory", Flag: "rdma-memory", Default: "256MiB", Min: 4 * mib, Max: forever, Range: "4MiB or more",
			Usage: "memory registered with a kernel RDMA device at most (the locked-memory limit must allow it)"},

		{Key: "limits.login_timeout", Flag: "login-timeout", Default: "15s", Min: 0, Max: forever, Range: "not negative",
			Usage: "drop a connection whose login has not finished after this long"},
		{Key: "limits.nop_interval", Flag: "nop-interval", Default: "10s", Usage: "ping idle connections after this long (negative: never)"},
		{Key: "limits.nop_timeout", Flag: "nop-timeout", Default: "15s", Min: 0, Max: forever, Range: "not negative",
			Usage: "drop a connection whose ping goes unanswered, or whose peer stops reading, this long"},
		{Key: "limits.max_sessions", Flag: "max-sessions", Default: "1024", Min: 0, Max: forever, Range: "not negative",
			Usage: "sessions allowed at once (logins beyond it fail with out of resources)"},
		{Key: "limits.max_sessions_per_source", Flag: "max-sessions-per-source", Default: "128", Min: 0, Max: forever, Range: "not negative",
			Usage: "sessions one address may hold (of --max-sessions; raise it for a host with a session to each of many targets); also the NVMe controllers one address may hold"},
		{Key: "limits.max_working_per_source", Flag: "max-working-per-source", Default: "256", Min: 0, Max: forever, Range: "not negative",
			Usage: "commands of one address on LU workers, executing or waiting for it to take their answers, across its connections; past it they stop being read"},
		{Key: "limits.max_discovery_sessions", Flag: "max-discovery-sessions", Default: "16", Min: 0, Max: forever, Range: "not negative",
			Usage: "discovery sessions allowed at once (not counted in --max-sessions)"},
		{Key: "limits.max_logins_per_source", Flag: "max-logins-per-source", Default: "8", Min: 0, Max: forever, Range: "not negative",
			Usage: "connections from one address still logging in; more are closed"},
		{Key: "limits.source_prefix_v6", Flag: "source-prefix-v6", Default: "128", Min: 1, Max: 128, Range: "1 to 128 bits of an IPv6 address",
			Usage: "what one address is to the per-source bounds when it is IPv6: its network of this many bits (64 where peers with a routed /64 reach a portal)"},
		{Key: "limits.max_connections", Flag: "max-connections", Default: "8", Min: 1, Max: 65535, Range: "1 to 65535, RFC 7143 §13.2",
			Usage: "connections per session"},
		{Key: "limits.cmd_window", Flag: "cmd-window", Default: "128", Min: 1, Max: 1 << 20, Range: "1 to 1048576",
			Usage: "commands a session may have outstanding (the CmdSN window)"},
		{Key: "limits.max_recv_data_segment_length", Flag: "max-recv-data-segment-length", Default: "262144", Min: 512, Max: 1<<24 - 1, Range: "512 to 16777215, RFC 7143 §13.12",
			Usage: "largest data segment accepted"},
		{Key: "limits.io_budget", Flag: "io-budget", Default: "1GiB", Min: 64 * mib, Max: forever, Range: "at least 64MiB, the largest transfer of one command",
			Usage: "I/O buffers all sessions may hold together; commands beyond get TASK SET FULL"},
		{Key: "limits.session_io_budget", Flag: "session-io-budget", Default: "128MiB", Min: mib, Max: forever, Range: "at least 1MiB",
			Usage: "I/O buffers one session may hold; commands beyond get TASK SET FULL"},
	}
}

// LookupSetting returns the declaration of the setting with this key.
func LookupSetting(key string) (Setting, bool) {
	for _, s := range Settings() {
		if s.Key == key {
			return s, true
		}
	}
	return Setting{}, false
}

// Set gives the setting key the value written as text (a list takes one
// string per item and replaces the list), checked as Validate checks the
// file: a value it refuses changes nothing.
func (c *Config) Set(key string, values ...string) error {
	s, ok := LookupSetting(key)
	if !ok {
		return fmt.Errorf("%s: not a setting of the node", key)
	}
	f, err := settingField(reflect.ValueOf(c).Elem(), key)
	if err != nil {
		return err
	}
	v := reflect.New(f.Type()).Elem()
	if f.Kind() == reflect.Slice {
		v.Set(reflect.ValueOf(append([]string(nil), values...)))
	} else {
		if len(values) != 1 {
			return fmt.Errorf("%s: takes one value, not %d", key, len(values))
		}
		if err := parseInto(v, values[0]); err != nil {
			return err
		}
	}
	if err := s.check(v); err != nil {
		return err
	}
	f.Set(v)
	return nil
}

// Get returns the value c has for the setting key, of its field's type
// ([]string, *bool, string, int, time.Duration).
func (c *Config) Get(key string) (any, error) {
	if _, ok := LookupSetting(key); !ok {
		return nil, fmt.Errorf("%s: not a setting of the node", key)
	}
	f, err := settingField(reflect.ValueOf(c).Elem(), key)
	if err != nil {
		return nil, err
	}
	return f.Interface(), nil
}

// WithDefaults returns a copy of c in which every setting c leaves unset
// has its declared default.
func (c *Config) WithDefaults() *Config {
	out := c.Clone()
	root := reflect.ValueOf(out).Elem()
	for _, s := range Settings() {
		f, err := settingField(root, s.Key)
		if err != nil || !f.IsZero() || s.Default == "" {
			continue
		}
		v := reflect.New(f.Type()).Elem()
		if f.Kind() == reflect.Slice {
			v.Set(reflect.ValueOf([]string{s.Default}))
		} else if parseInto(v, s.Default) != nil {
			continue // a test holds every default to its setting's type
		}
		f.Set(v)
	}
	return out
}

// checkSettings is Validate's part for the node-wide settings: each
// value set within its declared range.
func (c *Config) checkSettings() []error {
	var errs []error
	root := reflect.ValueOf(c).Elem()
	for _, s := range Settings() {
		f, err := settingField(root, s.Key)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := s.check(f); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// check reports whether v, a value of the setting's field, is one it
// takes: a size parses, a number is within the range.
func (s Setting) check(v reflect.Value) error {
	if v.IsZero() {
		return nil
	}
	var n int64
	switch {
	case v.Kind() == reflect.String && sizeKey(s.Key[strings.LastIndexByte(s.Key, '.')+1:]):
		b, err := ParseSize(v.String())
		if err != nil {
			return fmt.Errorf("%s: %w", s.Key, err)
		}
		n = b
	case v.CanInt():
		n = v.Int()
	case v.CanUint():
		n = int64(v.Uint())
	default:
		return nil
	}
	if s.Range != "" && (n < s.Min || n > s.Max) {
		return fmt.Errorf("%s: %v (%s)", s.Key, v.Interface(), s.Range)
	}
	return nil
}

// settingField is the field of Config (root) that keeps the setting
// key: a top-level field, or one of a table's.
func settingField(root reflect.Value, key string) (reflect.Value, error) {
	v := root
	for part := range strings.SplitSeq(key, ".") {
		if v.Kind() != reflect.Struct {
			return reflect.Value{}, fmt.Errorf("%s: not a setting of the node", key)
		}
		found := false
		for i := range v.NumField() {
			if name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("toml"), ","); name == part {
				v, found = v.Field(i), true
				break
			}
		}
		if !found {
			return reflect.Value{}, fmt.Errorf("%s: no such key", key)
		}
	}
	return v, nil
}

// parseInto sets v, a setting's field, from text as a flag or a default
// writes it.
func parseInto(v reflect.Value, text string) error {
	switch {
	case v.Type() == reflect.TypeFor[time.Duration]():
		d, err := time.ParseDuration(text)
		if err != nil {
			return err
		}
		v.SetInt(int64(d))
	case v.Kind() == reflect.Pointer && v.Type().Elem().Kind() == reflect.Bool:
		b, err := strconv.ParseBool(text)
		if err != nil {
			return err
		}
		v.Set(reflect.ValueOf(&b))
	case v.Kind() == reflect.String:
		v.SetString(text)
	case v.CanInt():
		n, err := strconv.ParseInt(text, 0, v.Type().Bits())
		if err != nil {
			return fmt.Errorf("%q is not a whole number", text)
		}
		v.SetInt(n)
	default:
		return fmt.Errorf("%s: no text form", v.Type())
	}
	return nil
}
