// Command blockwire is the one binary of the project: "blockwire serve"
// runs the iSCSI target. It is the only place where concrete transports
// and backends are chosen.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"reflect"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/blockwire/blockwire/admin"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/node"
	"github.com/blockwire/blockwire/rdma/verbs"
)

const usage = `blockwire: block storage over the wire

Usage:
  blockwire serve [flags]             run the target (iSCSI and iSER; SRP with --srp-listen)
  blockwire config check FILE         validate a configuration file
  blockwire config diff FILE          what a reload or restart with it would change
  blockwire config keys               every configuration key, its type and default
  blockwire discover PORTAL           list the targets a portal offers (SendTargets)
  blockwire inquiry URL               identify a LUN
  blockwire read URL [--offset N] [--length N] [--out FILE [--force]]
  blockwire write URL --in FILE [--offset N] --overwrite
  blockwire copy [--force] SRC DST    file to LUN, LUN to file, LUN to LUN
  blockwire bench URL [--rw randread] [--bs 4k] [--qd 32] [--time 10s] [--verify] [--overwrite]
  blockwire admin [--socket PATH] VERB  runtime administration of a running serve (see "blockwire admin")
  blockwire rdma                      list the kernel RDMA devices (RDMA NICs, rxe, siw) this build can use
  blockwire version                   the version and build
  blockwire completion bash           bash completion (source <(blockwire completion bash))

URL is iscsi://[user[%password]@]host[:port]/target-iqn/lun, as libiscsi writes it,
iser://… (the same over software iWARP), or srp://host[:port]/ID_EXT[:IOC_GUID]/lun.
Run "blockwire VERB -h" for a verb's flags. Initiator verbs exit 0 on success,
2 on a usage error, 3 when the portal is unreachable, 4 when login is refused,
5 on a SCSI error, 6 on a verification mismatch, 1 otherwise.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		io.WriteString(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return serve(args[1:], stderr)
	case "config":
		return configVerb(args[1:], stdout, stderr)
	case "discover":
		return discover(args[1:], stdout, stderr)
	case "inquiry":
		return inquiry(args[1:], stdout, stderr)
	case "read":
		return readVerb(args[1:], stdout, stderr)
	case "write":
		return writeVerb(args[1:], stdout, stderr)
	case "bench":
		return bench(args[1:], stdout, stderr)
	case "copy":
		return copyVerb(args[1:], stdout, stderr)
	case "admin":
		return adminVerb(args[1:], stdout, stderr)
	case "rdma":
		return rdmaDevices(args[1:], stdout, stderr)
	case "version":
		return version(stdout)
	case "completion":
		if len(args) != 2 || args[1] != "bash" {
			io.WriteString(stderr, "usage: blockwire completion bash   (then: source <(blockwire completion bash))\n")
			return 2
		}
		verbs := slices.Sorted(maps.Keys(adminVerbs))
		io.WriteString(stdout, strings.Replace(bashCompletion, "ADMINVERBS", strings.Join(verbs, " "), 1))
		return 0
	case "-h", "--help", "help":
		io.WriteString(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "blockwire: unknown command %q\n\n", args[0])
	io.WriteString(stderr, usage)
	return 2
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// serveFlags are serve's flags: the default target's, the portals', the
// limits' and the surfaces'.
type serveFlags struct {
	fs                                                                          *flag.FlagSet
	listen, portGroups, iserRoce, srp, srpRoce, adminDirs                       listFlag
	iqn, size, file, remote, rbd, cephConf, cephKeyring, cephUser               *string
	rdmaDevice, rdmaMemory, ioEngine                                            *string
	grow, readOnly, removable, iser, writeCache, direct, roceGSO, strictSecrets *bool
	targetReset                                                                 *bool
	tpgt                                                                        *uint
	blockSize, roceUDP                                                          *int
	cfgPath, statePath, logLevel, logFormat, cpuprofile, metrics                *string
	metricsToken, adminSocket, adminHTTP, adminToken, isns                      *string
	hdigest, ddigest, srpID                                                     *string
	nop, nopTimeout, loginTimeout, poll                                         *time.Duration
	maxSessions, maxPerSource, maxConns, maxDiscovery, maxLogins, window, mrdsl *int
	ioBudget, sessionIOBudget                                                   *string
	maxWorking, sourcePrefix                                                    *int
}

func newServeFlags(stderr io.Writer) *serveFlags {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &serveFlags{fs: fs}
	d := node.DefaultLimits()
	fs.Var(&f.listen, "listen", "portal address host:port (repeatable; default 127.0.0.1:3260)")
	f.iqn = fs.String("iqn", "iqn.2026-11.org.blockwire:default", "target name")
	f.size = fs.String("size", "1GiB", "LUN 0 size")
	f.file = fs.String("file", "", "back LUN 0 with this file or block device, served at its own size (a missing file is created sparse, of --size)")
	f.grow = fs.Bool("grow", false, "with --file: grow an existing file to --size (never shrinks)")
	f.ioEngine = fs.String("io-engine", "auto", "with --file: auto (io_uring where the kernel allows it, else pread), io_uring or pread")
	f.direct = fs.Bool("direct", false, "with --file: O_DIRECT, bypassing the page cache (the block size must suit the file's direct-I/O alignment)")
	f.remote = fs.String("remote", "", "back LUN 0 with another target's LUN (iscsi://, iser:// or srp:// URL): serve as a gateway")
	f.rbd = fs.String("rbd", "", "back LUN 0 with a Ceph RBD image, pool/image or pool/namespace/image (a build with -tags rbd)")
	f.cephConf = fs.String("ceph-conf", "", "with --rbd: the cluster's ceph.conf (default: librados's search)")
	f.cephKeyring = fs.String("ceph-keyring", "", "with --rbd: the client's keyring (default: what ceph.conf says)")
	f.cephUser = fs.String("ceph-user", "", "with --rbd: the client name without \"client.\" (default admin)")
	f.tpgt = fs.Uint("tpgt", 1, "target portal group tag, also the relative target port and, with --port-groups, this gateway's ALUA group")
	fs.Var(&f.portGroups, "port-groups", "turn on ALUA: ID=state for every gateway's group (comma-separated or repeated), state active-optimized, active-non-optimized, standby or unavailable")
	f.blockSize = fs.Int("block-size", 512, "logical block size (512 or 4096)")
	f.readOnly = fs.Bool("read-only", false, "write-protect LUN 0 (writes fail with DATA PROTECT)")
	f.removable = fs.Bool("removable", false, "make LUN 0's medium removable (START STOP UNIT ejects and loads it)")
	f.targetReset = fs.Bool("target-reset", false, "let every initiator send TARGET WARM RESET and TARGET COLD RESET, which reach every LU and every initiator of the target (default: refused, \"function authorization failed\")")
	f.writeCache = fs.Bool("write-cache", true, "LUN 0's write cache; false: every write is flushed to stable storage before it is acknowledged (WCE 0)")
	f.cfgPath = fs.String("config", "", "declarative configuration file (TOML); replaces the other target flags")
	f.strictSecrets = fs.Bool("strict-secrets", false, "refuse to start when a CHAP secret is readable by group or others (a secret_file, or the configuration holding one inline); without it that is a warning")
	f.statePath = fs.String("state", "", "where the node records every change it is asked to make, before it takes effect, so that it lasts across restarts (default with --config: beside it, NAME.state.toml; \"none\": changes last until the process ends)")
	f.logLevel = fs.String("log-level", "info", "debug, info, warn or error")
	f.logFormat = fs.String("log-format", "text", "text or json (log/slog, on stderr)")
	f.nop = fs.Duration("nop-interval", d.NopInterval, "ping idle connections after this long (negative: never)")
	f.nopTimeout = fs.Duration("nop-timeout", d.NopTimeout, "drop a connection whose ping goes unanswered, or whose peer stops reading, this long")
	f.loginTimeout = fs.Duration("login-timeout", d.LoginTimeout, "drop a connection whose login has not finished after this long")
	f.maxSessions = fs.Int("max-sessions", d.MaxSessions, "sessions allowed at once (logins beyond it fail with out of resources)")
	f.maxPerSource = fs.Int("max-sessions-per-source", d.MaxSessionsPerSource, "sessions one address may hold (of --max-sessions; raise it for a host with a session to each of many targets)")
	f.maxWorking = fs.Int("max-working-per-source", d.MaxWorkingPerSource, "commands of one address on LU workers, executing or waiting for it to take their answers, across its connections; past it they stop being read")
	f.maxConns = fs.Int("max-connections", d.MaxConnections, "connections per session")
	f.maxDiscovery = fs.Int("max-discovery-sessions", d.MaxDiscoverySessions, "discovery sessions allowed at once (not counted in --max-sessions)")
	f.maxLogins = fs.Int("max-logins-per-source", d.MaxLoginsPerSource, "connections from one address still logging in; more are closed")
	f.sourcePrefix = fs.Int("source-prefix-v6", d.SourcePrefixV6, "what one address is to the per-source bounds when it is IPv6: its network of this many bits (1 to 128; 64 where peers with a routed /64 reach a portal)")
	f.window = fs.Int("cmd-window", d.CmdWindow, "commands a session may have outstanding (the CmdSN window)")
	f.mrdsl = fs.Int("max-recv-data-segment-length", d.MaxRecvDataSegmentLength, "largest data segment accepted (512 to 16777215)")
	f.ioBudget = fs.String("io-budget", d.IOBudget, "I/O buffers all sessions may hold together (at least 64MiB); commands beyond get TASK SET FULL")
	f.sessionIOBudget = fs.String("session-io-budget", d.SessionIOBudget, "I/O buffers one session may hold; commands beyond get TASK SET FULL")
	f.cpuprofile = fs.String("cpuprofile", "", "write a CPU profile (go tool pprof) to this file until shutdown")
	f.metrics = fs.String("metrics", "", "serve Prometheus metrics on host:port (GET /metrics)")
	f.metricsToken = fs.String("metrics-token-file", "", "with --metrics: require the bearer token in this file (Prometheus's authorization credentials_file)")
	f.adminSocket = fs.String("admin-socket", "", "serve the administration API on this Unix socket (blockwire admin)")
	f.adminHTTP = fs.String("admin-http", "", "also serve the administration API over HTTP on this loopback host:port (requests need the token of --admin-http-token)")
	f.adminToken = fs.String("admin-http-token", node.DefaultTokenFile(), "with --admin-http: write the API's per-run bearer token to this file (mode 0600)")
	fs.Var(&f.adminDirs, "admin-dir", "a directory in which the administration API may name LUN files and save destinations (repeatable; none: no paths)")
	f.isns = fs.String("isns", "", "register the targets and portals with this iSNS server (host[:port], RFC 4171)")
	f.hdigest = fs.String("header-digest", "optional", "CRC32C header digest: optional (initiator's choice) or required")
	f.ddigest = fs.String("data-digest", "optional", "CRC32C data digest: optional (initiator's choice) or required")
	f.iser = fs.Bool("iser", true, "also serve iSER (software iWARP, connection-first as Linux ib_iser) on every portal")
	fs.Var(&f.iserRoce, "roce-listen", "also serve iSER through RDMA/CM on address:port (IPv4 or [IPv6]), the port being the one the service ID names, on the RDMA device --rdma-device picks for that address: a kernel device (an RDMA NIC, rxe, siw) in a build with verbs support, else the software RoCEv2 device (InfiniBand RC in UDP) (repeatable)")
	f.roceUDP = fs.Int("roce-udp-port", 4791, "UDP port of the software RoCEv2 device (4791 is RoCEv2's; a kernel rxe on the same address owns it)")
	f.poll = fs.Duration("poll", 0, "the target's receivers (each iSCSI/TCP connection's reader, each software RoCEv2 device's) poll their sockets, and an I/O alone on a file LUN's io_uring its completion, up to this long (such as 1ms, the most) before they sleep, each adapting within it to how long its peer or device takes to answer: lower latency at low queue depths for the CPU the polling takes while traffic flows; 0: off")
	f.roceGSO = fs.Bool("roce-gso", true, "the software RoCEv2 device sends runs of packets as UDP GSO datagrams; false: one datagram per packet (packet captures on this host then show packets)")
	fs.Var(&f.srp, "srp-listen", "also serve every target over SRP (software iWARP, as Linux ib_srp reaches it through RDMA/CM) on host:port (repeatable)")
	fs.Var(&f.srpRoce, "srp-roce-listen", "also serve every target over SRP through RDMA/CM on address:port (IPv4 or [IPv6]) — the login in the connection request, as Linux ib_srp sends it — on the RDMA device --rdma-device picks for that address: a kernel device (an RDMA NIC, rxe, siw) in a build with verbs support, else the software RoCEv2 device, which also takes logins to each target's IOC GUID as service ID (repeatable)")
	f.rdmaDevice = fs.String("rdma-device", "auto", "the RDMA device under --roce-listen and --srp-roce-listen: auto (the kernel RDMA device of each address — an RDMA NIC, rxe, siw — in a build with verbs support, else the software RoCEv2 device), soft, or a device name as \"blockwire rdma\" lists it")
	f.rdmaMemory = fs.String("rdma-memory", "256MiB", "memory registered with a kernel RDMA device at most (the locked-memory limit must allow it)")
	f.srpID = fs.String("srp-id-ext", "", "the first target's SRP target port: ID_EXT[:IOC_GUID] in hex (default: derived from the target name)")
	return f
}

// serve turns the flags and the configuration file into a configuration
// and runs a node until SIGINT or SIGTERM; SIGHUP reloads the file.
func serve(args []string, stderr io.Writer) int {
	f := newServeFlags(stderr)
	cfg, opts, code := f.parse(args, stderr)
	if cfg == nil {
		return code
	}
	log := opts.Logger
	if *f.cpuprofile != "" {
		stop, err := startProfile(*f.cpuprofile)
		if err != nil {
			fmt.Fprintf(stderr, "blockwire: %v\n", err)
			return 1
		}
		defer stop()
	}
	// Signals first: one that arrives while the node starts is handled
	// once it has started. SIGHUP is always caught: without a
	// configuration file there is nothing to reload, and its default
	// action would end the process and lose memory LUNs' data.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	n, err := node.New(cfg, opts)
	if err == nil {
		err = n.Start()
	}
	if err != nil {
		fmt.Fprintf(stderr, "blockwire: %v\n", err)
		return 1
	}
	code = 0
	for code == 0 {
		select {
		case <-hup:
			if opts.ConfigFile == "" {
				log.Warn("SIGHUP ignored: serve was started without --config, so there is no file to reload")
				continue
			}
			log.Info("reloading the configuration", "file", opts.ConfigFile)
			ch, err := n.Reload(node.ReloadOptions{})
			var refused *node.Refused
			switch {
			case errors.As(err, &refused):
				log.Error("reload refused, nothing changed (blockwire admin reload --dry-run shows the whole change; --force, --shrink allow it)", "reasons", refused.Reasons)
			case err != nil:
				log.Error("reload incomplete", "err", err)
			default:
				log.Info("configuration reloaded", "changes", len(ch.Applied), "restart", ch.Restart)
			}
			continue
		case s := <-sig:
			log.Info("shutting down", "signal", s.String())
		case err := <-n.Err():
			log.Error("portal failed", "err", err)
			code = 1
		}
		break
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.Shutdown(ctx); err != nil {
		log.Warn("shutdown incomplete", "err", err)
	}
	log.Info("stopped")
	return code
}

// startProfile writes a CPU profile to path until stop.
func startProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// parse parses serve's arguments into the node's configuration and
// options; a nil configuration comes with the exit code.
func (f *serveFlags) parse(args []string, stderr io.Writer) (*config.Config, node.Options, int) {
	fs := f.fs
	var opts node.Options
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, opts, 0
		}
		return nil, opts, 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "blockwire serve: unexpected argument %q (serve takes only flags; blockwire serve -h lists them)\n", fs.Arg(0))
		return nil, opts, 2
	}
	if *f.cfgPath != "" {
		// The file describes the targets: flags that would describe
		// LUN 0 of a default target are refused, not silently ignored.
		var clash []string
		for _, n := range []string{"iqn", "size", "file", "grow", "io-engine", "direct", "remote", "rbd", "ceph-conf", "ceph-keyring", "ceph-user", "tpgt", "port-groups", "block-size", "read-only", "removable", "target-reset"} {
			if isSet(fs, n) {
				clash = append(clash, "--"+n)
			}
		}
		if len(clash) > 0 {
			fmt.Fprintf(stderr, "blockwire serve: %s describe the default target, which --config replaces: put them in the file instead\n", strings.Join(clash, ", "))
			return nil, opts, 2
		}
	}
	for _, d := range []struct{ name, v string }{{"--header-digest", *f.hdigest}, {"--data-digest", *f.ddigest}} {
		if d.v != "optional" && d.v != "required" {
			fmt.Fprintf(stderr, "blockwire: %s must be optional or required, not %q\n", d.name, d.v)
			return nil, opts, 2
		}
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*f.logLevel)); err != nil {
		fmt.Fprintf(stderr, "blockwire: --log-level: %v\n", err)
		return nil, opts, 2
	}
	var handler slog.Handler
	switch *f.logFormat {
	case "text":
		handler = slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl})
	case "json":
		handler = slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl})
	default:
		fmt.Fprintf(stderr, "blockwire: --log-format must be text or json, not %q\n", *f.logFormat)
		return nil, opts, 2
	}
	state := *f.statePath
	switch state {
	case "":
		state = node.DefaultStateFile(*f.cfgPath)
	case "none":
		state = ""
	}
	opts = node.Options{Logger: slog.New(handler), ConfigFile: *f.cfgPath, StateFile: state, StrictSecrets: *f.strictSecrets, RoCEUDPPort: *f.roceUDP,
		RequireHeaderDigest: *f.hdigest == "required", RequireDataDigest: *f.ddigest == "required",
		AdminHTTP: *f.adminHTTP, AdminTokenFile: *f.adminToken}
	var cfg *config.Config
	if *f.cfgPath != "" {
		var err error
		if cfg, err = config.Load(*f.cfgPath); err != nil {
			fmt.Fprintln(stderr, err)
			return nil, opts, 1
		}
	} else {
		var code int
		if cfg, code = f.defaultTarget(stderr); cfg == nil {
			return nil, opts, code
		}
	}
	// Portals, limits and surfaces: flags given win over the file.
	for _, o := range []struct {
		flag string
		dst  *[]string
		v    []string
	}{{"listen", &cfg.Listen, f.listen}, {"srp-listen", &cfg.SRPListen, f.srp}, {"roce-listen", &cfg.ROCEListen, f.iserRoce},
		{"srp-roce-listen", &cfg.SRPROCEListen, f.srpRoce}, {"admin-dir", &cfg.AdminDirs, f.adminDirs}} {
		if len(o.v) > 0 {
			*o.dst = o.v
		}
	}
	if len(cfg.Listen) == 0 && len(cfg.Portals) == 0 {
		cfg.Listen = []string{"127.0.0.1:3260"}
	}
	for _, o := range []struct {
		flag string
		dst  *string
		v    string
	}{{"srp-id-ext", &cfg.SRPIDExt, *f.srpID}, {"admin-socket", &cfg.AdminSocket, *f.adminSocket}, {"metrics", &cfg.Metrics, *f.metrics},
		{"isns", &cfg.ISNS, *f.isns}, {"rdma-device", &cfg.RDMADevice, *f.rdmaDevice}, {"rdma-memory", &cfg.RDMAMemory, *f.rdmaMemory}, {"io-budget", &cfg.Limits.IOBudget, *f.ioBudget}, {"session-io-budget", &cfg.Limits.SessionIOBudget, *f.sessionIOBudget}} {
		if isSet(fs, o.flag) {
			*o.dst = o.v
		}
	}
	if isSet(fs, "roce-udp-port") {
		cfg.ROCEUDPPort = *f.roceUDP
	}
	if isSet(fs, "iser") {
		cfg.ISER = f.iser
	}
	if isSet(fs, "roce-gso") {
		cfg.ROCEGSO = f.roceGSO
	}
	if isSet(fs, "poll") {
		cfg.Poll = *f.poll
	}
	lim := &cfg.Limits
	for _, o := range []struct {
		flag string
		dst  *time.Duration
		v    time.Duration
	}{{"nop-interval", &lim.NopInterval, *f.nop}, {"nop-timeout", &lim.NopTimeout, *f.nopTimeout}, {"login-timeout", &lim.LoginTimeout, *f.loginTimeout}} {
		if isSet(fs, o.flag) {
			*o.dst = o.v
		}
	}
	for _, o := range []struct {
		flag string
		dst  *int
		v    int
	}{{"max-sessions", &lim.MaxSessions, *f.maxSessions}, {"max-sessions-per-source", &lim.MaxSessionsPerSource, *f.maxPerSource},
		{"max-working-per-source", &lim.MaxWorkingPerSource, *f.maxWorking},
		{"max-connections", &lim.MaxConnections, *f.maxConns},
		{"max-discovery-sessions", &lim.MaxDiscoverySessions, *f.maxDiscovery}, {"max-logins-per-source", &lim.MaxLoginsPerSource, *f.maxLogins},
		{"source-prefix-v6", &lim.SourcePrefixV6, *f.sourcePrefix},
		{"cmd-window", &lim.CmdWindow, *f.window}, {"max-recv-data-segment-length", &lim.MaxRecvDataSegmentLength, *f.mrdsl}} {
		if isSet(fs, o.flag) {
			*o.dst = o.v
		}
	}
	if err := lim.Validate("--"); err != nil {
		fmt.Fprintln(stderr, err)
		return nil, opts, 2
	}
	if err := cfg.Validate(); err != nil { // again, with the portals the flags gave
		fmt.Fprintln(stderr, err)
		return nil, opts, 2
	}
	if *f.metricsToken != "" {
		b, err := os.ReadFile(*f.metricsToken)
		if opts.MetricsToken = strings.TrimSpace(string(b)); err != nil || opts.MetricsToken == "" {
			fmt.Fprintf(stderr, "blockwire: --metrics-token-file: %v (the file must hold the token)\n", err)
			return nil, opts, 1
		}
	}
	return cfg, opts, 0
}

// defaultTarget is the configuration of the flags' one target with LUN 0.
func (f *serveFlags) defaultTarget(stderr io.Writer) (*config.Config, int) {
	size := *f.size
	if *f.remote != "" || *f.rbd != "" {
		size = "" // the remote LUN and the image have their own
	}
	if *f.file != "" && !isSet(f.fs, "size") {
		if _, err := os.Stat(*f.file); err == nil {
			size = "" // an existing file or device: its own size
		}
	}
	var groups []string
	for _, g := range f.portGroups {
		groups = append(groups, strings.Split(g, ",")...)
	}
	if *f.tpgt == 0 || *f.tpgt > 65535 {
		fmt.Fprintln(stderr, "--tpgt: 1 to 65535")
		return nil, 2
	}
	cfg := &config.Config{
		Targets: []config.Target{{
			Name: *f.iqn, TPGT: uint16(*f.tpgt), PortGroups: groups, TargetReset: *f.targetReset,
			LUNs: []config.LUN{{ID: 0, Size: size, File: *f.file, Remote: *f.remote, RBD: *f.rbd, CephConf: *f.cephConf,
				CephKeyring: *f.cephKeyring, CephUser: *f.cephUser, BlockSize: *f.blockSize, ReadOnly: *f.readOnly, Removable: *f.removable, Grow: *f.grow,
				Direct: *f.direct, IOEngine: fileEngine(*f.file, *f.ioEngine)}},
		}},
	}
	if !*f.writeCache {
		cfg.Targets[0].LUNs[0].WriteCache = f.writeCache
	}
	if err := cfg.Validate(); err != nil {
		// Name the flags, not the places in a file the user has not
		// written.
		fmt.Fprintln(stderr, flagNames.Replace(err.Error()))
		return nil, 2
	}
	return cfg, 0
}

// flagNames turns the places of the default target's configuration into
// the serve flags that set them.
var flagNames = strings.NewReplacer(
	"target[0].lun[0].size", "--size", "target[0].lun[0].block_size", "--block-size", "target[0].lun[0].file", "--file",
	"target[0].lun[0].remote", "--remote", "target[0].lun[0].rbd", "--rbd", "target[0].lun[0]", "LUN 0 (--size, --file, --remote, --rbd)",
	"target[0].name", "--iqn", "target[0].tpgt", "--tpgt", "target[0].port_groups", "--port-groups", "target[0]", "the target (--iqn)")

// buildVersion is the version a package build names
// (-ldflags "-X main.buildVersion=1.2.3", packaging/deb.sh); empty: the
// module's version as Go recorded it.
var buildVersion string

// version prints the version and the VCS revision it was built from.
func version(stdout io.Writer) int {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		fmt.Fprintln(stdout, "blockwire (no build information)")
		return 0
	}
	rev, dirty, when := "", "", ""
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+modified"
			}
		case "vcs.time":
			when = s.Value
		}
	}
	v := bi.Main.Version
	if buildVersion != "" {
		v = buildVersion
	}
	parts := []string{"blockwire", v}
	if rev != "" {
		parts = append(parts, rev+dirty, when)
	}
	fmt.Fprintln(stdout, strings.Join(append(parts, bi.GoVersion), " "))
	return 0
}

// bashCompletion completes verbs, admin sub-verbs (ADMINVERBS: adminVerbs,
// filled in when printed) and each verb's flags, which it reads from the
// verb's own -h output (package flag's usage).
const bashCompletion = `# bash completion for blockwire: source <(blockwire completion bash)
_blockwire() {
	local cur=${COMP_WORDS[COMP_CWORD]}
	if [ "$COMP_CWORD" -eq 1 ]; then
		COMPREPLY=($(compgen -W "serve config discover inquiry read write copy bench admin rdma version completion" -- "$cur"))
		return
	fi
	local verb=${COMP_WORDS[1]}
	if [ "$verb" = admin ] && [ "$COMP_CWORD" -eq 2 ] && [[ $cur != -* ]]; then
		COMPREPLY=($(compgen -W "ADMINVERBS" -- "$cur"))
		return
	fi
	if [ "$verb" = config ] && [ "$COMP_CWORD" -eq 2 ]; then
		COMPREPLY=($(compgen -W "check diff keys" -- "$cur"))
		return
	fi
	if [[ $cur == -* ]]; then
		local flags=$(blockwire "$verb" -h 2>&1 | sed -n 's/^  \(-[a-z0-9-]*\).*/-\1/p')
		COMPREPLY=($(compgen -W "$flags" -- "$cur"))
		return
	fi
	COMPREPLY=($(compgen -f -- "$cur"))
}
complete -F _blockwire blockwire
`

// isSet reports whether a flag was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// rdmaDevices lists the kernel RDMA devices rdma-core reports.
func rdmaDevices(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "--help" {
			io.WriteString(stdout, "usage: blockwire rdma   list the kernel RDMA devices (name, kind, port 1 state, MTU, node GUID, network device)\n")
			return 0
		}
		io.WriteString(stderr, "usage: blockwire rdma\n")
		return 2
	}
	const soft = "the built-in software devices (iWARP on every --listen portal, RoCEv2 with --roce-listen) need none"
	if !verbs.Supported {
		_, err := verbs.Devices()
		fmt.Fprintln(stderr, "blockwire:", err)
		fmt.Fprintln(stderr, "blockwire: "+soft)
		return 1
	}
	devs, err := verbs.Devices()
	if err != nil || len(devs) == 0 {
		// rdma-core answers a host without RDMA devices (or without
		// the rdma_cm module) with an error: it is the same answer.
		why := ""
		if err != nil {
			why = " (" + err.Error() + ")"
		}
		fmt.Fprintf(stdout, "no kernel RDMA device%s: rdma link add rxe0 type rxe netdev ETH (or type siw) makes a software one over a network device; %s\n", why, soft)
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tKIND\tSTATE\tMTU\tNODE GUID\tNETDEV")
	for _, d := range devs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%016x\t%s\n", d.Name, d.Kind, d.State, d.MTU, d.NodeGUID, d.Netdev)
	}
	tw.Flush()
	return 0
}

// fileEngine is --io-engine as LUN 0's io_engine: its default says
// nothing for a LUN without a file.
func fileEngine(file, engine string) string {
	if file == "" && engine == "auto" {
		return ""
	}
	return engine
}

const configUsage = `usage: blockwire config check [--strict] FILE
                                    validate a configuration file (TOML) and report every error with
                                    its place; warn of CHAP secrets group or others can read (a
                                    secret_file, or FILE holding one inline): --strict refuses them
       blockwire config diff FILE [--state STATE]
                                    what a start or reload with FILE would change from what the
                                    node last recorded serving (its state: default beside FILE),
                                    and what of it would be refused
       blockwire config keys        every configuration key with its type and default
`

// configVerb is blockwire config: check, diff and keys.
func configVerb(args []string, stdout, stderr io.Writer) int {
	if len(args) >= 1 && (args[len(args)-1] == "-h" || args[len(args)-1] == "--help") {
		io.WriteString(stdout, configUsage)
		return 0
	}
	switch {
	case (len(args) == 2 || len(args) == 3 && args[1] == "--strict") && args[0] == "check":
		file := args[len(args)-1]
		c, err := config.Load(file)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		exposed := c.SecretExposure(file)
		for _, w := range exposed {
			fmt.Fprintln(stderr, "warning:", w)
		}
		if len(exposed) > 0 && len(args) == 3 {
			fmt.Fprintf(stderr, "%s: refused (--strict): secrets others can read\n", file)
			return 1
		}
		fmt.Fprintf(stdout, "%s: ok\n", file)
		return 0
	case len(args) >= 2 && args[0] == "diff":
		state := node.DefaultStateFile(args[1])
		switch {
		case len(args) == 4 && args[2] == "--state":
			state = args[3]
		case len(args) != 2:
			io.WriteString(stderr, configUsage)
			return 2
		}
		changes, refused, err := node.ConfigDiff(args[1], state)
		if err != nil {
			fmt.Fprintln(stderr, "blockwire config diff:", err)
			return 1
		}
		printPlan(stdout, admin.ReloadResult{Changes: changes, Refused: refused})
		return 0
	case len(args) == 1 && args[0] == "keys":
		printKeys(stdout)
		return 0
	}
	io.WriteString(stderr, configUsage)
	return 2
}

// printKeys prints every configuration key with its type and, where the
// node has one, its default (the man page's CONFIGURATION section).
func printKeys(w io.Writer) {
	defaults := map[string]string{"listen": `["127.0.0.1:3260"] (serve --listen)`}
	// Keys whose default is their serve flag's (the flag of the same
	// name, the default target's for a LUN's): read from the flag.
	fs := newServeFlags(io.Discard).fs
	for _, k := range []string{"iser", "roce_gso", "roce_udp_port", "rdma_device", "rdma_memory", "poll",
		"target.tpgt", "target.lun.block_size", "target.lun.io_engine", "target.lun.write_cache"} {
		defaults[k] = fs.Lookup(strings.ReplaceAll(k[strings.LastIndexByte(k, '.')+1:], "_", "-")).DefValue
	}
	lim := reflect.ValueOf(node.DefaultLimits())
	for i := range lim.NumField() {
		name, _, _ := strings.Cut(lim.Type().Field(i).Tag.Get("toml"), ",")
		defaults["limits."+name] = fmt.Sprint(lim.Field(i).Interface())
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tTYPE\tDEFAULT")
	for _, k := range config.Keys() {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", k.Path, k.Type, cmp.Or(defaults[k.Path], "-"))
	}
	tw.Flush()
}
