// Command blockwire is the one binary of the project: "blockwire serve"
// runs the iSCSI target. It is the only place where concrete transports
// and backends are chosen.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/blockwire/blockwire/datamover/iser"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/roce"
	"github.com/blockwire/blockwire/rdma/siw"
	"github.com/blockwire/blockwire/srp"
	srptarget "github.com/blockwire/blockwire/srp/target"

	"github.com/blockwire/blockwire/admin"
	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/backend/file"
	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/backend/remote"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/iscsi/auth"
	"github.com/blockwire/blockwire/iscsi/initiator"
	iscsitarget "github.com/blockwire/blockwire/iscsi/target"
	"github.com/blockwire/blockwire/isns"
	"github.com/blockwire/blockwire/metrics"
	"github.com/blockwire/blockwire/scsitarget"
)

const usage = `blockwire: block storage over the wire

Usage:
  blockwire serve [flags]             run the target (iSCSI and iSER; SRP with --srp-listen)
  blockwire config check FILE         validate a configuration file
  blockwire discover PORTAL           list the targets a portal offers (SendTargets)
  blockwire inquiry URL               identify a LUN
  blockwire read URL [--offset N] [--length N] [--out FILE]
  blockwire write URL --in FILE [--offset N]
  blockwire copy SRC DST              file to LUN, LUN to file, LUN to LUN
  blockwire bench URL [--rw randread] [--bs 4k] [--qd 32] [--time 10s] [--verify]
  blockwire admin [--socket PATH] VERB  runtime administration of a running serve (see "blockwire admin")
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
		const configUsage = "usage: blockwire config check FILE   validate a configuration file (TOML) and report every error with its place\n"
		if len(args) >= 2 && (args[len(args)-1] == "-h" || args[len(args)-1] == "--help") {
			io.WriteString(stdout, configUsage)
			return 0
		}
		if len(args) != 3 || args[1] != "check" {
			io.WriteString(stderr, configUsage)
			return 2
		}
		if _, err := config.Load(args[2]); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		fmt.Fprintf(stdout, "%s: ok\n", args[2])
		return 0
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
	case "version":
		return version(stdout)
	case "completion":
		if len(args) != 2 || args[1] != "bash" {
			io.WriteString(stderr, "usage: blockwire completion bash   (then: source <(blockwire completion bash))\n")
			return 2
		}
		io.WriteString(stdout, bashCompletion)
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

func serve(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var listen listFlag
	fs.Var(&listen, "listen", "portal address host:port (repeatable; default 127.0.0.1:3260)")
	iqn := fs.String("iqn", "iqn.2026-11.org.blockwire:default", "target name")
	size := fs.String("size", "1GiB", "LUN 0 size")
	path := fs.String("file", "", "back LUN 0 with this file or block device, served at its own size (a missing file is created sparse, of --size)")
	grow := fs.Bool("grow", false, "with --file: grow an existing file to --size (never shrinks)")
	remoteURL := fs.String("remote", "", "back LUN 0 with another target's LUN (iscsi://, iser:// or srp:// URL): serve as a gateway")
	rbdSpec := fs.String("rbd", "", "back LUN 0 with a Ceph RBD image, pool/image or pool/namespace/image (a build with -tags rbd)")
	cephConf := fs.String("ceph-conf", "", "with --rbd: the cluster's ceph.conf (default: librados's search)")
	cephKeyring := fs.String("ceph-keyring", "", "with --rbd: the client's keyring (default: what ceph.conf says)")
	cephUser := fs.String("ceph-user", "", "with --rbd: the client name without \"client.\" (default admin)")
	tpgt := fs.Uint("tpgt", 1, "target portal group tag, also the relative target port and, with --port-groups, this gateway's ALUA group")
	var portGroups listFlag
	fs.Var(&portGroups, "port-groups", "turn on ALUA: ID=state for every gateway's group (comma-separated or repeated), state active-optimized, active-non-optimized, standby or unavailable")
	blockSize := fs.Int("block-size", 512, "logical block size (512 or 4096)")
	readOnly := fs.Bool("read-only", false, "write-protect LUN 0 (writes fail with DATA PROTECT)")
	removable := fs.Bool("removable", false, "make LUN 0's medium removable (START STOP UNIT ejects and loads it)")
	cfgPath := fs.String("config", "", "declarative configuration file (TOML); replaces the other target flags")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "text", "text or json (log/slog, on stderr)")
	nop := fs.Duration("nop-interval", 10*time.Second, "ping idle connections after this long (negative: never)")
	nopTimeout := fs.Duration("nop-timeout", 15*time.Second, "drop a connection whose ping goes unanswered this long")
	loginTimeout := fs.Duration("login-timeout", 15*time.Second, "drop a connection whose login has not finished after this long")
	maxSessions := fs.Int("max-sessions", 1024, "sessions allowed at once (logins beyond it fail with out of resources)")
	maxConns := fs.Int("max-connections", 8, "connections per session")
	maxDiscovery := fs.Int("max-discovery-sessions", 16, "discovery sessions allowed at once (not counted in --max-sessions)")
	maxLoginsPerSource := fs.Int("max-logins-per-source", 8, "connections from one address still logging in; more are closed")
	cmdWindow := fs.Int("cmd-window", 128, "commands a session may have outstanding (the CmdSN window)")
	mrdsl := fs.Int("max-recv-data-segment-length", 262144, "largest data segment accepted (512 to 16777215)")
	ioBudget := fs.String("io-budget", "1GiB", "I/O buffers all sessions may hold together (at least 64MiB); commands beyond get TASK SET FULL")
	sessionIOBudget := fs.String("session-io-budget", "128MiB", "I/O buffers one session may hold; commands beyond get TASK SET FULL")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile (go tool pprof) to this file until shutdown")
	metricsAddr := fs.String("metrics", "", "serve Prometheus metrics on host:port (GET /metrics)")
	metricsToken := fs.String("metrics-token-file", "", "with --metrics: require the bearer token in this file (Prometheus's authorization credentials_file)")
	adminSocket := fs.String("admin-socket", "", "serve the administration API on this Unix socket (blockwire admin)")
	adminHTTP := fs.String("admin-http", "", "also serve the administration API over HTTP on this loopback host:port (requests need the token of --admin-http-token)")
	adminToken := fs.String("admin-http-token", defaultTokenFile(), "with --admin-http: write the API's per-run bearer token to this file (mode 0600)")
	var adminDirs listFlag
	fs.Var(&adminDirs, "admin-dir", "a directory in which the administration API may name LUN files and save destinations (repeatable; none: no paths)")
	isnsServer := fs.String("isns", "", "register the targets and portals with this iSNS server (host[:port], RFC 4171)")
	hdigest := fs.String("header-digest", "optional", "CRC32C header digest: optional (initiator's choice) or required")
	ddigest := fs.String("data-digest", "optional", "CRC32C data digest: optional (initiator's choice) or required")
	iserOn := fs.Bool("iser", true, "also serve iSER (software iWARP, connection-first as Linux ib_iser) on every portal")
	var iserRoceListen listFlag
	fs.Var(&iserRoceListen, "roce-listen", "also serve iSER over the software RoCEv2 device (InfiniBand RC in UDP, connection management as Linux's RDMA/CM) on address:port (IPv4 or [IPv6]), the port being the one the service ID names (repeatable)")
	roceUDP := fs.Int("roce-udp-port", 4791, "UDP port of the software RoCEv2 device (4791 is RoCEv2's; a kernel rxe on the same address owns it)")
	var srpListen listFlag
	fs.Var(&srpListen, "srp-listen", "also serve the first target over SRP (software iWARP, as Linux ib_srp reaches it through RDMA/CM) on host:port (repeatable)")
	var srpRoceListen listFlag
	fs.Var(&srpRoceListen, "srp-roce-listen", "also serve the first target over SRP on the software RoCEv2 device (the login in an InfiniBand CM REQ, as Linux ib_srp sends it through RDMA/CM over rxe, and to the IOC GUID as service ID with the whole login) on address:port (IPv4 or [IPv6]) (repeatable)")
	srpID := fs.String("srp-id-ext", "", "SRP target port: ID_EXT[:IOC_GUID] in hex (default: derived from the target name)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "blockwire serve: unexpected argument %q (serve takes only flags; blockwire serve -h lists them)\n", fs.Arg(0))
		return 2
	}
	if *cfgPath != "" {
		// The file describes the targets: flags that would describe
		// LUN 0 of a default target are refused, not silently ignored.
		var clash []string
		for _, n := range []string{"iqn", "size", "file", "grow", "remote", "rbd", "ceph-conf", "ceph-keyring", "ceph-user", "tpgt", "port-groups", "block-size", "read-only", "removable"} {
			if isSet(fs, n) {
				clash = append(clash, "--"+n)
			}
		}
		if len(clash) > 0 {
			fmt.Fprintf(stderr, "blockwire serve: %s describe the default target, which --config replaces: put them in the file instead\n", strings.Join(clash, ", "))
			return 2
		}
	}
	for _, d := range []struct{ name, v string }{{"--header-digest", *hdigest}, {"--data-digest", *ddigest}} {
		if d.v != "optional" && d.v != "required" {
			fmt.Fprintf(stderr, "blockwire: %s must be optional or required, not %q\n", d.name, d.v)
			return 2
		}
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "blockwire: --log-level: %v\n", err)
		return 2
	}
	var handler slog.Handler
	switch *logFormat {
	case "text":
		handler = slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl})
	case "json":
		handler = slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl})
	default:
		fmt.Fprintf(stderr, "blockwire: --log-format must be text or json, not %q\n", *logFormat)
		return 2
	}
	log := slog.New(handler)

	var cfg *config.Config
	if *cfgPath != "" {
		var err error
		if cfg, err = config.Load(*cfgPath); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		if len(listen) > 0 {
			cfg.Listen = listen
		}
	} else {
		if *remoteURL != "" || *rbdSpec != "" {
			*size = "" // the remote LUN and the image have their own
		}
		if *path != "" && !isSet(fs, "size") {
			if _, err := os.Stat(*path); err == nil {
				*size = "" // an existing file or device: its own size
			}
		}
		var groups []string
		for _, g := range portGroups {
			groups = append(groups, strings.Split(g, ",")...)
		}
		if *tpgt == 0 || *tpgt > 65535 {
			fmt.Fprintln(stderr, "--tpgt: 1 to 65535")
			return 2
		}
		cfg = &config.Config{
			Listen: listen,
			Targets: []config.Target{{
				Name: *iqn, TPGT: uint16(*tpgt), PortGroups: groups,
				LUNs: []config.LUN{{ID: 0, Size: *size, File: *path, Remote: *remoteURL, RBD: *rbdSpec, CephConf: *cephConf,
					CephKeyring: *cephKeyring, CephUser: *cephUser, BlockSize: *blockSize, ReadOnly: *readOnly, Removable: *removable, Grow: *grow}},
			}},
		}
		if err := cfg.Validate(); err != nil {
			// Name the flags, not the places in a file the user has not
			// written.
			fmt.Fprintln(stderr, flagNames.Replace(err.Error()))
			return 2
		}
	}
	if len(cfg.Listen) == 0 {
		cfg.Listen = []string{"127.0.0.1:3260"}
	}
	// Portals per transport: flags given win over the file.
	if len(srpListen) > 0 {
		cfg.SRPListen = srpListen
	}
	if *srpID != "" {
		cfg.SRPIDExt = *srpID
	}
	if len(iserRoceListen) > 0 {
		cfg.ROCEListen = iserRoceListen
	}
	if len(srpRoceListen) > 0 {
		cfg.SRPROCEListen = srpRoceListen
	}
	if isSet(fs, "roce-udp-port") {
		cfg.ROCEUDPPort = *roceUDP
	}
	if err := cfg.Validate(); err != nil { // again, with the portals the flags gave
		fmt.Fprintln(stderr, err)
		return 2
	}
	roceUDPPort := cfg.ROCEUDPPort
	if roceUDPPort == 0 {
		roceUDPPort = *roceUDP // the flag's default, 4791
	}
	iserWanted := *iserOn
	if cfg.ISER != nil && !isSet(fs, "iser") {
		iserWanted = *cfg.ISER
	}
	// Limits: the configuration file's, then flags given on the command
	// line, then the defaults.
	lim := &cfg.Limits
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, o := range []struct {
		flag string
		dst  any
		v    any
	}{
		{"nop-interval", &lim.NopInterval, *nop}, {"nop-timeout", &lim.NopTimeout, *nopTimeout},
		{"login-timeout", &lim.LoginTimeout, *loginTimeout}, {"max-sessions", &lim.MaxSessions, *maxSessions},
		{"max-connections", &lim.MaxConnections, *maxConns}, {"cmd-window", &lim.CmdWindow, *cmdWindow},
		{"max-discovery-sessions", &lim.MaxDiscoverySessions, *maxDiscovery}, {"max-logins-per-source", &lim.MaxLoginsPerSource, *maxLoginsPerSource},
		{"max-recv-data-segment-length", &lim.MaxRecvDataSegmentLength, *mrdsl},
		{"io-budget", &lim.IOBudget, *ioBudget}, {"session-io-budget", &lim.SessionIOBudget, *sessionIOBudget},
	} {
		switch d := o.dst.(type) {
		case *time.Duration:
			if set[o.flag] || *d == 0 {
				*d = o.v.(time.Duration)
			}
		case *int:
			if set[o.flag] || *d == 0 {
				*d = o.v.(int)
			}
		case *string:
			if set[o.flag] || *d == "" {
				*d = o.v.(string)
			}
		}
	}
	if err := lim.Validate("--"); err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	ioB, sessB, _ := lim.Budgets() // validated
	// One I/O buffer budget for every fabric (iSCSI, iSER, SRP).
	budget := scsitarget.NewIOBudget(ioB, sessB)

	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintf(stderr, "blockwire: %v\n", err)
			return 1
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "blockwire: %v\n", err)
			return 1
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	opts := iscsitarget.Options{
		LoginTimeout:             lim.LoginTimeout,
		NopInterval:              lim.NopInterval,
		NopTimeout:               lim.NopTimeout,
		MaxSessions:              lim.MaxSessions,
		MaxConnections:           lim.MaxConnections,
		MaxDiscoverySessions:     lim.MaxDiscoverySessions,
		MaxLoginsPerSource:       lim.MaxLoginsPerSource,
		CmdWindow:                uint32(lim.CmdWindow),
		MaxRecvDataSegmentLength: lim.MaxRecvDataSegmentLength,
		Budget:                   budget,
		RequireHeaderDigest:      *hdigest == "required",
		RequireDataDigest:        *ddigest == "required",
	}
	for _, t := range cfg.Targets {
		for _, l := range t.LUNs {
			// What this node is to seed 001's iSER connection preference.
			opts.Gateway = opts.Gateway || l.Remote != ""
			opts.EndNode = opts.EndNode || l.Remote == ""
		}
	}
	if iserWanted {
		// One port for iSCSI/TCP and iSER: the first byte tells them
		// apart (an MPA Request or a Login PDU).
		opts.ISER = &iscsitarget.ISERPortal{
			IWARP: siw.New(siw.Options{Logger: log}),
			PD:    rdma.NewDevice("blockwire").AllocPD(),
		}
	}
	srv := iscsitarget.NewServer(log, opts)
	if err := setDiscovery(srv, cfg.Discovery); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	lv := &live{cfg: cfg, path: *cfgPath, srv: srv, log: log}
	closeDevices := func() {
		for _, d := range lv.Devices() {
			if err := d.Close(); err != nil {
				log.Error("closing backends", "target", d.Name(), "err", err)
			}
		}
	}
	var isnsNodes []isns.Node
	for _, tc := range cfg.Targets {
		dev, t, err := buildTarget(tc, log)
		if err != nil {
			closeDevices()
			fmt.Fprintln(stderr, err)
			return 1
		}
		lv.devices = append(lv.devices, dev)
		if err := srv.AddTarget(t); err != nil {
			closeDevices()
			fmt.Fprintln(stderr, err)
			return 1
		}
		isnsNodes = append(isnsNodes, isns.Node{Name: t.Name, Alias: t.Alias, TPGT: t.TPGT})
		for _, l := range dev.LUNs() {
			lu := dev.LU(l)
			log.Info("lun ready", "target", t.Name, "lun", l, "blocks", lu.Blocks(), "block_size", lu.BlockSize(), "read_only", lu.ReadOnly())
		}
	}

	// One software RoCEv2 device per local address, shared by the iSER
	// and SRP listeners on it (they would fight over its UDP port).
	roceDevs := map[string]*roce.Device{}
	closeDevices = func(close func()) func() {
		return func() {
			for _, d := range roceDevs {
				d.Close()
			}
			close()
		}
	}(closeDevices)
	roceListen := func(a string) (*roce.Device, rdma.Listener, error) {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			return nil, nil, err
		}
		d := roceDevs[host]
		if d == nil {
			if d, err = roce.Open(host, roce.Options{Port: roceUDPPort, Logger: log}); err != nil {
				return nil, nil, err
			}
			roceDevs[host] = d
		}
		l, err := d.Listen(a)
		return d, l, err
	}
	var srpSrv *srptarget.Server
	var srpListeners []rdma.Listener
	if len(cfg.SRPListen) > 0 || len(cfg.SRPROCEListen) > 0 {
		hi, lo, err := srpPortID(cfg.SRPIDExt, cfg.Targets[0].Name)
		if err != nil {
			closeDevices()
			fmt.Fprintln(stderr, "blockwire: --srp-id-ext:", err)
			return 2
		}
		name := cfg.Targets[0].Name
		srpSrv = srptarget.New(srptarget.Options{PD: rdma.NewDevice("blockwire-srp").AllocPD(), Device: lv.devices[0],
			IDExt: hi, IOCGUID: lo, Logger: log.With("target", name), Budget: budget,
			// The target's SRP ACL as it is now (reloads and the admin
			// API change it): SRP has no CHAP, so a protected target
			// admits only the ports listed (config.Target.SRPAllows).
			Allow:  func(id srp.PortID, remote net.Addr) bool { return lv.srpAllows(name, id, remote) },
			LUNMap: func(id srp.PortID) map[uint64]uint64 { return lv.srpLUNMap(name, id) }})
		fab := siw.New(siw.Options{Logger: log})
		for _, a := range cfg.SRPListen {
			l, err := fab.Listen(a)
			if err != nil {
				for _, o := range srpListeners {
					o.Close()
				}
				closeDevices()
				fmt.Fprintf(stderr, "blockwire: --srp-listen: %v\n", err)
				return 1
			}
			srpListeners = append(srpListeners, l)
			log.Info("serving SRP", "target", cfg.Targets[0].Name, "url", fmt.Sprintf("srp://%s/%016x:%016x/0", l.Addr(), hi, lo))
		}
		iocListening := map[*roce.Device]bool{}
		for _, a := range cfg.SRPROCEListen {
			d, l, err := roceListen(a)
			if err == nil && !iocListening[d] {
				// Also as an InfiniBand I/O controller: REQs to the
				// IOC GUID as service ID, the whole SRP_LOGIN_REQ
				// inside (seed 003 §A.2), as Linux ib_srpt does —
				// once per device.
				var sl rdma.Listener
				if sl, err = d.ListenService(lo); err == nil {
					srpListeners = append(srpListeners, sl)
					iocListening[d] = true
				}
			}
			if err != nil {
				for _, o := range srpListeners {
					o.Close()
				}
				closeDevices()
				fmt.Fprintf(stderr, "blockwire: --srp-roce-listen: %v\n", err)
				return 1
			}
			srpListeners = append(srpListeners, l)
			log.Info("serving SRP over RoCEv2", "target", cfg.Targets[0].Name, "portal", a, "udp_port", roceUDPPort, "id_ext", fmt.Sprintf("%016x", hi), "ioc_guid", fmt.Sprintf("%016x", lo),
				"service_id", fmt.Sprintf("%016x", lo))
		}
	}
	var listeners []net.Listener
	for _, a := range cfg.Listen {
		l, err := net.Listen("tcp", a)
		if err != nil {
			for _, o := range listeners {
				o.Close()
			}
			closeDevices()
			fmt.Fprintf(stderr, "blockwire: %v\n", err)
			return 1
		}
		listeners = append(listeners, l)
	}
	loopback := true
	for _, l := range listeners {
		if ta, ok := l.Addr().(*net.TCPAddr); !ok || !ta.IP.IsLoopback() {
			loopback = false
		}
	}
	if loopback {
		log.Info("serving on loopback only; use --listen ADDR:PORT to reach other hosts")
	}
	if *adminSocket != "" {
		cfg.AdminSocket = *adminSocket
	}
	if len(adminDirs) > 0 {
		cfg.AdminDirs = adminDirs
	}
	if cfg.AdminSocket != "" {
		al, err := listenAdminSocket(cfg.AdminSocket)
		if err != nil {
			for _, o := range listeners {
				o.Close()
			}
			closeDevices()
			fmt.Fprintf(stderr, "blockwire: --admin-socket: %v\n", err)
			return 1
		}
		h := admin.Handler(admin.Options{ISCSI: srv, Control: lv, Dirs: cfg.AdminDirs})
		hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(al)
		defer hs.Close() // closing the listener removes the socket
		log.Info("administration API", "socket", cfg.AdminSocket)
	}
	if *adminHTTP != "" {
		// Loopback only, and guarded against what a browser on this
		// host can be made to send (admin.Protect): Host, Origin, JSON
		// only, and the per-run token in a file only this user reads.
		hl, err := net.Listen("tcp", *adminHTTP)
		if err == nil {
			if ta, ok := hl.Addr().(*net.TCPAddr); !ok || !ta.IP.IsLoopback() {
				hl.Close()
				err = errors.New("not a loopback address")
			}
		}
		var token string
		if err == nil {
			if token, err = writeToken(*adminToken); err != nil {
				hl.Close()
			}
		}
		if err != nil {
			for _, o := range listeners {
				o.Close()
			}
			closeDevices()
			fmt.Fprintf(stderr, "blockwire: --admin-http: %v\n", err)
			return 1
		}
		h := admin.Protect(admin.Handler(admin.Options{ISCSI: srv, Control: lv, Dirs: cfg.AdminDirs}), hl.Addr().String(), token)
		hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(hl)
		defer func() { hs.Close(); os.Remove(*adminToken) }()
		log.Info("administration API", "url", "http://"+hl.Addr().String(), "token_file", *adminToken)
	}
	if *metricsAddr != "" {
		cfg.Metrics = *metricsAddr
	}
	if cfg.Metrics != "" {
		ml, err := net.Listen("tcp", cfg.Metrics)
		if err != nil {
			for _, o := range listeners {
				o.Close()
			}
			closeDevices()
			fmt.Fprintf(stderr, "blockwire: --metrics: %v\n", err)
			return 1
		}
		token := ""
		if *metricsToken != "" {
			b, err := os.ReadFile(*metricsToken)
			if token = strings.TrimSpace(string(b)); err != nil || token == "" {
				ml.Close()
				for _, o := range listeners {
					o.Close()
				}
				closeDevices()
				fmt.Fprintf(stderr, "blockwire: --metrics-token-file: %v (the file must hold the token)\n", err)
				return 1
			}
		}
		if metricsExposed(ml.Addr(), token) {
			log.Warn("metrics on a non-loopback address without a token: anyone who reaches it reads every target's and initiator's name; give --metrics-token-file or listen on loopback",
				"metrics", ml.Addr().String())
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", metrics.Protect(metrics.Handler(metrics.New(lv.Devices, srv)), ml.Addr().String(), token))
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(ml)
		defer hs.Close()
		log.Info("serving metrics", "url", "http://"+ml.Addr().String()+"/metrics")
	}
	for _, a := range cfg.ROCEListen {
		d, l, err := roceListen(a)
		if err != nil {
			for _, o := range listeners {
				o.Close()
			}
			closeDevices()
			fmt.Fprintf(stderr, "blockwire: --roce-listen: %v\n", err)
			return 1
		}
		go func() { // the server closes l at shutdown
			if err := srv.ServeISER(l, d.RDMA().AllocPD(), iser.Options{Logger: log}); err != nil {
				log.Error("iSER over RoCEv2", "portal", a, "err", err)
			}
		}()
		log.Info("serving iSER over RoCEv2", "portal", a, "udp_port", roceUDPPort)
	}
	var wg sync.WaitGroup
	errc := make(chan error, len(listeners)+len(srpListeners))
	for _, l := range listeners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.Serve(l); err != nil {
				errc <- err
			}
		}()
	}
	for _, l := range srpListeners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srpSrv.Serve(l); err != nil {
				errc <- err
			}
		}()
	}
	if *isnsServer != "" {
		cfg.ISNS = *isnsServer
	}
	isnsDone := make(chan struct{})
	isnsCtx, isnsStop := context.WithCancel(context.Background())
	if cfg.ISNS != "" {
		host, _ := os.Hostname()
		c := &isns.Client{Server: cfg.ISNS, EntityID: "blockwire:" + host, Nodes: isnsNodes, Portals: portalAddrs(listeners, log), Log: log}
		go func() { defer close(isnsDone); c.Run(isnsCtx) }()
	} else {
		close(isnsDone)
	}
	if *cfgPath != "" {
		// SIGHUP: apply the configuration file's changes.
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		go func() {
			for range hup {
				log.Info("reloading the configuration", "file", *cfgPath)
				if err := lv.reload(); err != nil {
					log.Error("reload incomplete", "err", err)
				} else {
					log.Info("configuration reloaded")
				}
			}
		}()
	}
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	code := 0
	select {
	case s := <-sig:
		log.Info("shutting down", "signal", s.String())
	case err := <-errc:
		log.Error("portal failed", "err", err)
		code = 1
	}
	isnsStop() // deregister first: no new initiators
	<-isnsDone
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if srpSrv != nil {
		srpSrv.Close() // SRP_T_LOGOUT to every channel
	}
	if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		log.Warn("shutdown incomplete", "err", err)
	}
	wg.Wait()
	closeDevices()
	log.Info("stopped")
	return code
}

// srpPortID parses --srp-id-ext, or derives the port ID from the target
// name (FNV-1a, so it stays the same across restarts).
func srpPortID(v, name string) (uint64, uint64, error) {
	if v == "" {
		h := fnv.New64a()
		h.Write([]byte(name))
		id := h.Sum64()
		return id, id, nil
	}
	a, b, ok := strings.Cut(v, ":")
	if !ok {
		b = a
	}
	hi, err1 := strconv.ParseUint(strings.TrimPrefix(a, "0x"), 16, 64)
	lo, err2 := strconv.ParseUint(strings.TrimPrefix(b, "0x"), 16, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("want ID_EXT[:IOC_GUID] in hex, not %q", v)
	}
	return hi, lo, nil
}

// buildLU makes the logical unit a configuration's LUN describes.
func buildLU(targetName string, lc config.LUN, log *slog.Logger) (*scsitarget.LU, error) {
	var size int64
	if lc.Size != "" {
		var err error
		if size, err = config.ParseSize(lc.Size); err != nil {
			return nil, err
		}
	}
	var be backend.Backend
	var err error
	blockSize := lc.BlockSize
	switch {
	case lc.Remote != "":
		// A gateway LUN (issue 13): another target's LUN through our
		// initiator, which reconnects for up to 30 s before commands fail
		// with a retryable sense.
		var d device
		if d, err = openDevice(context.Background(), lc.Remote, initiator.Options{Logger: log.With("remote", config.RedactURL(lc.Remote))}); err == nil {
			if blockSize != 0 && blockSize != d.BlockSize() {
				d.Close()
				err = fmt.Errorf("%s: block_size %d, but the remote LUN's is %d", config.RedactURL(lc.Remote), blockSize, d.BlockSize())
			} else {
				blockSize = d.BlockSize()
				be = remote.New(d.(remote.Device), config.RedactURL(lc.Remote))
			}
		}
	case lc.RBD != "":
		// Ceph RBD (issue 14): needs a build with the rbd tag (rbd.go).
		be, err = openRBD(lc, log)
	case lc.File != "":
		be, err = file.Open(lc.File, file.Options{Size: size, Grow: lc.Grow, ReadOnly: lc.ReadOnly})
	default:
		be, err = mem.New(size)
	}
	if err != nil {
		return nil, err
	}
	prFile := ""
	if lc.File != "" {
		prFile = lc.File + ".pr" // persistent reservations with APTPL live beside the data
	}
	lu, err := scsitarget.NewLU(targetName, scsitarget.LUConfig{LUN: lc.ID, Backend: be, BlockSize: blockSize, ReadOnly: lc.ReadOnly,
		Removable: lc.Removable, Serial: lc.Serial, PRFile: prFile, Logger: log.With("lun", lc.ID)})
	if err != nil {
		if c, ok := be.(backend.Closer); ok {
			c.Close()
		}
		return nil, err
	}
	return lu, nil
}

func buildTarget(tc config.Target, log *slog.Logger) (*scsitarget.Device, *iscsitarget.Target, error) {
	t, err := targetAccess(tc)
	if err != nil {
		return nil, nil, err
	}
	dev := scsitarget.NewDevice(tc.Name, log.With("target", tc.Name))
	for _, lc := range tc.LUNs {
		lu, err := buildLU(tc.Name, lc, log)
		if err == nil {
			if err = dev.AddLU(lu); err != nil {
				lu.Close()
			}
		}
		if err != nil {
			dev.Close()
			return nil, nil, err
		}
	}
	if len(tc.PortGroups) > 0 {
		var groups []scsitarget.PortGroup
		for _, g := range tc.PortGroups {
			pg, err := scsitarget.ParsePortGroup(g)
			if err != nil {
				dev.Close()
				return nil, nil, err
			}
			groups = append(groups, pg)
		}
		if err := dev.SetPortGroups(groups); err != nil {
			dev.Close()
			return nil, nil, err
		}
	}
	t.Device = dev
	return dev, t, nil
}

// targetAccess is a target's name, alias, ACL and CHAP credentials, without
// its device.
// flagNames turns the places of the default target's configuration into
// the serve flags that set them.
var flagNames = strings.NewReplacer(
	"target[0].lun[0].size", "--size", "target[0].lun[0].block_size", "--block-size", "target[0].lun[0].file", "--file",
	"target[0].lun[0].remote", "--remote", "target[0].lun[0].rbd", "--rbd", "target[0].lun[0]", "LUN 0 (--size, --file, --remote, --rbd)",
	"target[0].name", "--iqn", "target[0].tpgt", "--tpgt", "target[0].port_groups", "--port-groups", "target[0]", "the target (--iqn)")

// metricsExposed reports whether metrics at addr without a token can be
// read by anyone who reaches the host: a non-loopback address.
func metricsExposed(addr net.Addr, token string) bool {
	ta, ok := addr.(*net.TCPAddr)
	return ok && !ta.IP.IsLoopback() && token == ""
}

// setDiscovery applies the discovery sessions' access rules.
func setDiscovery(srv *iscsitarget.Server, d *config.Discovery) error {
	if d == nil {
		return srv.SetDiscovery(nil)
	}
	t, err := targetAccess(d.AsTarget())
	if err == nil {
		err = srv.SetDiscovery(t)
	}
	return err
}

func targetAccess(tc config.Target) (*iscsitarget.Target, error) {
	allowed := tc.AllowedInitiators()
	t := &iscsitarget.Target{Name: tc.Name, Alias: tc.Alias, Initiators: allowed, Restricted: allowed != nil, TPGT: tc.TPGT,
		Redirect: tc.Redirect, RedirectPermanent: tc.RedirectPermanent, Portals: tc.Portals}
	for _, a := range tc.ACL {
		if src, err := a.Sources(); err != nil {
			return nil, err
		} else if src != nil && a.Initiator != "" {
			if t.Sources == nil {
				t.Sources = map[string][]netip.Prefix{}
			}
			t.Sources[a.Initiator] = src
		}
		if m, err := a.LUNMap(); err != nil {
			return nil, err
		} else if m != nil && a.Initiator != "" {
			if t.LUNMaps == nil {
				t.LUNMaps = map[string]map[uint64]uint64{}
			}
			t.LUNMaps[a.Initiator] = m
		}
	}
	for _, a := range tc.ACL {
		if a.CHAP == nil {
			continue
		}
		v, err := a.CHAP.Value()
		if err != nil {
			return nil, err
		}
		if t.InitiatorCHAP == nil {
			t.InitiatorCHAP = map[string]auth.Credentials{}
		}
		t.InitiatorCHAP[a.Initiator] = auth.Credentials{User: a.CHAP.User, Secret: v}
	}
	if tc.CHAP != nil {
		v, err := tc.CHAP.Value()
		if err != nil {
			return nil, err
		}
		t.CHAP = &auth.Credentials{User: tc.CHAP.User, Secret: v}
	}
	if tc.MutualCHAP != nil {
		v, err := tc.MutualCHAP.Value()
		if err != nil {
			return nil, err
		}
		t.MutualCHAP = &auth.Credentials{User: tc.MutualCHAP.User, Secret: v}
	}
	return t, nil
}

// version prints the module version and the VCS revision it was built from.
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
	parts := []string{"blockwire", bi.Main.Version}
	if rev != "" {
		parts = append(parts, rev+dirty, when)
	}
	fmt.Fprintln(stdout, strings.Join(append(parts, bi.GoVersion), " "))
	return 0
}

// portalAddrs are the addresses to register with iSNS: each listener's,
// with a wildcard one expanded to the host's addresses.
func portalAddrs(ls []net.Listener, log *slog.Logger) []netip.AddrPort {
	var out []netip.AddrPort
	for _, l := range ls {
		ap, err := netip.ParseAddrPort(l.Addr().String())
		if err != nil {
			continue
		}
		if !ap.Addr().IsUnspecified() {
			out = append(out, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
			continue
		}
		addrs, _ := net.InterfaceAddrs()
		for _, a := range addrs {
			if pfx, err := netip.ParsePrefix(a.String()); err == nil && !pfx.Addr().IsLoopback() && !pfx.Addr().IsLinkLocalUnicast() {
				out = append(out, netip.AddrPortFrom(pfx.Addr().Unmap(), ap.Port()))
			}
		}
	}
	if len(out) == 0 {
		log.Warn("iSNS: no portal address to register")
	}
	return out
}

// bashCompletion completes verbs, admin sub-verbs and each verb's flags,
// which it reads from the verb's own -h output (package flag's usage).
const bashCompletion = `# bash completion for blockwire: source <(blockwire completion bash)
_blockwire() {
	local cur=${COMP_WORDS[COMP_CWORD]}
	if [ "$COMP_CWORD" -eq 1 ]; then
		COMPREPLY=($(compgen -W "serve config discover inquiry read write copy bench admin version completion" -- "$cur"))
		return
	fi
	local verb=${COMP_WORDS[1]}
	if [ "$verb" = admin ] && [ "$COMP_CWORD" -eq 2 ] && [[ $cur != -* ]]; then
		COMPREPLY=($(compgen -W "sessions drop luns add-lun remove-lun resize add-target remove-target set-initiators reload save" -- "$cur"))
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
