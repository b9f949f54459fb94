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
  blockwire config keys               every configuration key: type, default, flag, when it applies
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

// serveFlags are serve's flags: the node-wide settings' (declared in
// config.Settings, applied over the file's), the default target's, and
// the process's own.
type serveFlags struct {
	fs                                                            *flag.FlagSet
	settings                                                      []*settingFlag
	portGroups                                                    listFlag
	iqn, size, file, remote, rbd, cephConf, cephKeyring, cephUser *string
	ioEngine                                                      *string
	grow, readOnly, removable, writeCache, direct, strictSecrets  *bool
	targetReset                                                   *bool
	tpgt                                                          *uint
	blockSize                                                     *int
	cfgPath, statePath, logLevel, logFormat, cpuprofile           *string
	metricsToken, adminHTTP, adminToken                           *string
	hdigest, ddigest                                              *string
}

// settingFlag is the flag of a node-wide setting: the values given, set
// over the file's once it is read (config.Config.Set); each is checked
// as it is given, as the file's would be.
type settingFlag struct {
	s      config.Setting
	values []string
	list   bool
	bool   bool
}

func (f *settingFlag) String() string {
	if f == nil || len(f.values) == 0 {
		if f == nil {
			return ""
		}
		return f.s.Default
	}
	return strings.Join(f.values, ",")
}

func (f *settingFlag) Set(v string) error {
	var c config.Config
	if err := c.Set(f.s.Key, v); err != nil {
		_, why, _ := strings.Cut(err.Error(), ": ") // the flag names itself
		return errors.New(why)
	}
	if f.list {
		f.values = append(f.values, v)
	} else {
		f.values = []string{v}
	}
	return nil
}

func (f *settingFlag) IsBoolFlag() bool { return f.bool }

func newServeFlags(stderr io.Writer) *serveFlags {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &serveFlags{fs: fs}
	var zero config.Config
	for _, st := range config.Settings() {
		sf := &settingFlag{s: st}
		if fv, err := zero.Get(st.Key); err == nil {
			_, sf.list = fv.([]string)
			_, sf.bool = fv.(*bool)
		}
		f.settings = append(f.settings, sf)
		fs.Var(sf, st.Flag, st.Usage)
	}
	f.iqn = fs.String("iqn", "iqn.2026-11.org.blockwire:default", "target name")
	f.size = fs.String("size", "1GiB", "LUN 0 size")
	f.file = fs.String("file", "", "back LUN 0 with this file or block device, served at its own size (a missing file is created sparse, of --size)")
	f.grow = fs.Bool("grow", false, "with --file: grow an existing file to --size (never shrinks)")
	f.ioEngine = fs.String("io-engine", "auto", "with --file: auto (io_uring where the kernel allows it, else pread), io_uring or pread")
	f.direct = fs.Bool("direct", false, "with --file: O_DIRECT, bypassing the page cache (the block size must suit the file's direct-I/O alignment)")
	f.remote = fs.String("remote", "", "back LUN 0 with another target's LUN (iscsi://, iser://, srp:// or nvme+tcp:// URL): serve as a gateway")
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
	f.cpuprofile = fs.String("cpuprofile", "", "write a CPU profile (go tool pprof) to this file until shutdown")
	f.metricsToken = fs.String("metrics-token-file", "", "with --metrics: require the bearer token in this file (Prometheus's authorization credentials_file)")
	f.adminHTTP = fs.String("admin-http", "", "also serve the administration API over HTTP on this loopback host:port (requests need the token of --admin-http-token)")
	f.adminToken = fs.String("admin-http-token", node.DefaultTokenFile(), "with --admin-http: write the API's per-run bearer token to this file (mode 0600)")
	f.hdigest = fs.String("header-digest", "optional", "CRC32C header digest: optional (initiator's choice) or required")
	f.ddigest = fs.String("data-digest", "optional", "CRC32C data digest: optional (initiator's choice) or required")
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
	opts = node.Options{Logger: slog.New(handler), ConfigFile: *f.cfgPath, StateFile: state, StrictSecrets: *f.strictSecrets,
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
	// The node-wide settings: flags given win over the file.
	for _, sf := range f.settings {
		if len(sf.values) > 0 {
			if err := cfg.Set(sf.s.Key, sf.values...); err != nil {
				fmt.Fprintf(stderr, "blockwire serve: --%s: %v\n", sf.s.Flag, err)
				return nil, opts, 2
			}
		}
	}
	if len(cfg.Listen) == 0 && len(cfg.Portals) == 0 {
		cfg.Listen = cfg.WithDefaults().Listen
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
       blockwire config keys        every configuration key: type, default, flag, when it applies
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
// node has one, its default, serve's flag and when a change takes effect
// (the man page's CONFIGURATION section): the node-wide settings' from
// their declarations (config.Settings), the per-target and per-LUN keys'
// defaults from the default target's flags of the same name.
func printKeys(w io.Writer) {
	type row struct{ def, flag, reload string }
	rows := map[string]row{}
	for _, s := range config.Settings() {
		rows[s.Key] = row{s.Default, "--" + s.Flag, s.Reload.String()}
	}
	fs := newServeFlags(io.Discard).fs
	for _, k := range []string{"target.tpgt", "target.lun.block_size", "target.lun.io_engine", "target.lun.write_cache"} {
		fl := fs.Lookup(strings.ReplaceAll(k[strings.LastIndexByte(k, '.')+1:], "_", "-"))
		rows[k] = row{def: fl.DefValue}
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tTYPE\tDEFAULT\tFLAG\tCHANGES")
	for _, k := range config.Keys() {
		r := rows[k.Path]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.Path, k.Type, cmp.Or(r.def, "-"), cmp.Or(r.flag, "-"), cmp.Or(r.reload, "-"))
	}
	tw.Flush()
	fmt.Fprintln(w, "\nCHANGES says when a node-wide setting changed in the file takes effect: at the next start (restart; a reload names\n"+
		"it and leaves it) or at the reload (live). A reload applies [[target]], [[target.lun]] and [discovery] changes at\n"+
		"once, except a target's tpgt, port_groups and srp_id_ext, and [[portal]] changes, which wait for the next start.")
}
