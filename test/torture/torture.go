package main

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/initiator"
	"github.com/blockwire/blockwire/iscsi/target"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/siw"
	"github.com/blockwire/blockwire/scsitarget"
)

const iqn = "iqn.2026-11.org.blockwire:torture"

// Config is one run.
type Config struct {
	Duration time.Duration
	Seed     uint64
	Clients  int // sessions writing and reading at once (4)
	Blocks   int // blocks they share (16), 4 KiB each
	// FaultEvery is the mean time between faults (1s); each fault's
	// kind and moment come from the seed.
	FaultEvery time.Duration
	// Faults are the kinds injected: "crash" (power lost under the
	// target: its unflushed cache is gone; it restarts), "reset" (every
	// connection reset), "partition" (all traffic held, then reset),
	// "delay" (every segment delayed), and, when named (not with
	// "crash": reservations do not survive a power loss without APTPL),
	// "preempt" (PERSISTENT RESERVE OUT PREEMPT AND ABORT of a client's
	// key: none of its writes sent before may land after it). Empty:
	// all but "preempt".
	Faults []string
	// Fabric is "tcp" (iSCSI/TCP) or "iser" (iSER over the software
	// iWARP device, which runs over TCP: the proxy's faults apply).
	Fabric string
	// Connections per session (1); more is MC/S, and the "reset-one"
	// fault ends one connection of a session while its others live on.
	Connections int
	// WriteThrough runs the LU with its write cache off: every write
	// acknowledged is durable, FUA or not.
	WriteThrough bool
	// Binary, when set, is a blockwire executable run as the target
	// (serve --file on a file in a temporary directory): "crash" is then
	// SIGKILL and a restart. Without it the target runs in this process
	// on storage with a volatile cache, and "crash" is power lost under
	// it (the cache's unflushed blocks are gone).
	Binary string
	// Dir holds the binary's file and log (a temporary directory).
	Dir string
	// TargetAddr, with Binary, is the address it serves on (default: a
	// free port on 127.0.0.1) — one in another network namespace when
	// Binary is a wrapper that runs blockwire there (ip netns exec).
	TargetAddr string
	// Netem lists the network devices ("dev", or "dev@netns") on the
	// path to the target that the "loss", "reorder", "jitter" and
	// "blackhole" faults act on with tc netem (netem.go).
	Netem []string
	// RBD, with Binary (built with the rbd tag) and CephConf, runs
	// Gateways (2) blockwire processes serving this Ceph RBD image
	// ("pool/image") as one LU with a target port group each; every
	// client logs in through one gateway with the others as its failover
	// paths, and "crash" SIGKILLs one gateway (restarted at once) while
	// its clients fail over.
	RBD, CephConf string
	Gateways      int
	// LieAboutFlush makes the storage acknowledge FUA and SYNCHRONIZE
	// CACHE without making anything durable: the deliberate bug the
	// checker must catch.
	LieAboutFlush bool
	// OpTimeout bounds each operation (10s); one that takes longer is
	// aborted and counts as failed.
	OpTimeout time.Duration
	// Pause is each client's pause between operations (1ms), which
	// keeps the history small enough to check in seconds.
	Pause time.Duration
	// Artifact, when set, is the file the checker's HTML visualization of
	// a failing history is written to.
	Artifact string
	Log      *slog.Logger
}

// AllFaults are the fault kinds a run injects by default; KnownFaults
// adds "preempt" and the network's (netem.go), which are named on their
// own.
var (
	AllFaults   = []string{"crash", "reset", "reset-one", "partition", "delay"}
	KnownFaults = append(append(slices.Clone(AllFaults), "preempt"), NetFaults...)
)

func (c *Config) defaults() {
	if c.Clients == 0 {
		c.Clients = 4
	}
	if c.Blocks == 0 {
		c.Blocks = 16
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = 10 * time.Second
	}
	if c.Pause == 0 {
		c.Pause = time.Millisecond
	}
	if c.FaultEvery == 0 {
		c.FaultEvery = time.Second
	}
	if len(c.Faults) == 0 {
		c.Faults = AllFaults
	}
	if c.Fabric == "" {
		c.Fabric = "tcp"
	}
	if c.Connections == 0 {
		c.Connections = 1
	}
	if c.Log == nil {
		c.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

const blockSize = 4096

// Report is what a run found.
type Report struct {
	Seed     uint64
	Duration time.Duration
	// Ops counts the operations by kind and outcome ("write ok",
	// "write failed", "read ok", …; "read torn": reads that saw parts of
	// two writes).
	Ops map[string]int
	// Faults counts the faults injected by kind.
	Faults map[string]int
	// Recovery is, per fault kind, the times from each fault's end to the
	// first operation that completed after it.
	Recovery map[string][]time.Duration
	Verdict  porcupine.CheckResult
	// Checked says how: whole, or stretch by stretch (segments.go).
	Checked string
	// Window is, for a failing history, the block and the operations on
	// it up to the first moment the history breaks the model.
	Window []string
	// NetemDropped counts the packets netem dropped (netem.go).
	NetemDropped int
}

// Run runs the clients against a target while faults are injected, then
// checks the history.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.defaults()
	rep := &Report{Seed: cfg.Seed, Ops: map[string]int{}, Faults: map[string]int{}, Recovery: map[string][]time.Duration{}}
	if cfg.Fabric != "tcp" && cfg.Fabric != "iser" {
		return nil, fmt.Errorf("fabric %q: tcp or iser", cfg.Fabric)
	}
	pr := slices.Contains(cfg.Faults, "preempt")
	if pr && slices.Contains(cfg.Faults, "crash") {
		return nil, errors.New(`"preempt" and "crash" do not mix: registrations do not survive a power loss`)
	}
	devs, err := parseNetDevs(cfg.Netem)
	if err != nil {
		return nil, err
	}
	for _, f := range cfg.Faults {
		if slices.Contains(NetFaults, f) && len(devs) == 0 {
			return nil, fmt.Errorf("fault %q needs the network devices netem acts on (Netem)", f)
		}
	}
	if cfg.TargetAddr != "" && (cfg.Binary == "" || cfg.RBD != "") {
		return nil, errors.New("TargetAddr is the address of a target run from Binary (not gateways)")
	}
	var tg targetRunner
	switch {
	case cfg.RBD != "":
		if cfg.Binary == "" || cfg.CephConf == "" {
			return nil, errors.New("an RBD image needs Binary (built with the rbd tag) and CephConf")
		}
		if cfg.Gateways == 0 {
			cfg.Gateways = 2
		}
		tg = &gateways{cfg: &cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 99))}
	case cfg.Binary != "":
		tg = &process{cfg: &cfg, addr: cfg.TargetAddr}
	default:
		tg = &incarnation{cfg: &cfg, disk: newVolatileDisk(int64(cfg.Blocks)*blockSize, blockSize, cfg.LieAboutFlush)}
	}
	addr, err := tg.start()
	if err != nil {
		return nil, err
	}
	defer tg.stop()
	// One proxy per target address (gateways: one each).
	addrs := []string{addr}
	if g, ok := tg.(*gateways); ok {
		addrs = g.addrs()
	}
	var pxs proxies
	for _, a := range addrs {
		px, err := newProxy(a)
		if err != nil {
			return nil, err
		}
		defer px.Close()
		pxs = append(pxs, px)
	}
	px := pxs

	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }
	rec := &recorder{owner: map[int]int{}}
	var admin *initiator.Session
	if pr {
		// The preemptor: a session straight to the target (no proxy
		// fault reaches it) holding a Write Exclusive – Registrants
		// Only reservation.
		if admin, err = reserve(ctx, addr); err != nil {
			return nil, fmt.Errorf("reserving: %w", err)
		}
		defer admin.Close()
	}
	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()

	var wg sync.WaitGroup
	for c := 0; c < cfg.Clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := &client{id: c, cfg: &cfg, portal: px[c%len(px)].Addr(), paths: px.others(c % len(px)), rng: rand.New(rand.NewPCG(cfg.Seed, uint64(c)+1)), now: now, rec: rec, pr: pr}
			cl.run(runCtx)
		}()
	}
	// Faults, from the seed.
	rng := rand.New(rand.NewPCG(cfg.Seed, 0))
	type fault struct {
		kind string
		end  int64
	}
	var faults []fault
loop:
	for {
		wait := time.Duration(float64(cfg.FaultEvery) * (0.5 + rng.Float64()))
		select {
		case <-runCtx.Done():
			break loop
		case <-time.After(wait):
		}
		kind := cfg.Faults[rng.IntN(len(cfg.Faults))]
		rep.Faults[kind]++
		switch kind {
		case "crash":
			call := now()
			tg.crash()
			addr, err := tg.start()
			if err != nil {
				cancel()
				wg.Wait()
				return nil, fmt.Errorf("restarting the target: %w", err)
			}
			if _, ok := tg.(*gateways); !ok {
				px[0].SetTarget(addr)
				px[0].Reset()
			}
			rec.add(porcupine.Operation{ClientId: cfg.Clients, Input: input{kind: opCrash}, Call: call, Return: now()})
		case "reset":
			px.Reset()
		case "reset-one":
			px[rng.IntN(len(px))].ResetOne(rng)
		case "partition":
			px.Partition(time.Duration(200+rng.IntN(1800)) * time.Millisecond)
		case "delay":
			px.Delay(time.Duration(1+rng.IntN(20))*time.Millisecond, time.Duration(200+rng.IntN(800))*time.Millisecond)
		case "loss", "reorder", "jitter", "blackhole":
			n, err := netFault(devs, netemSpec(kind, rng), time.Duration(300+rng.IntN(2700))*time.Millisecond)
			if err != nil {
				cancel()
				wg.Wait()
				return nil, err
			}
			rep.NetemDropped += n
		case "preempt":
			victim := rng.IntN(cfg.Clients)
			op := porcupine.Operation{ClientId: cfg.Clients, Input: input{kind: opPreempt, victim: victim}, Call: now()}
			octx, ocancel := context.WithTimeout(ctx, cfg.OpTimeout)
			_, err := admin.Do(octx, 0, prOut(5), prParams(adminKey, clientKey(victim)), nil)
			ocancel()
			op.Return = now()
			if err != nil {
				cfg.Log.Warn("preempt failed", "victim", victim, "after", time.Duration(op.Return-op.Call), "err", err)
				op.Return, op.Output = math.MaxInt64, output{unknown: true, failed: op.Return}
				rec.count("preempt failed")
			} else {
				rec.count("preempt ok")
			}
			rec.add(op)
		}
		faults = append(faults, fault{kind, now()})
		cfg.Log.Info("fault", "kind", kind, "at", time.Duration(now()))
	}
	wg.Wait()
	rep.Duration = time.Since(start)

	h := rec.ops
	// Recovery: from a fault's end until every client has completed an
	// operation again (clients that completed none before the run ended
	// leave the fault out).
	returns := make([][]int64, cfg.Clients) // each client's, sorted
	for _, op := range h {
		if op.ClientId < cfg.Clients && op.Return != math.MaxInt64 {
			returns[op.ClientId] = append(returns[op.ClientId], op.Return)
		}
	}
	for _, r := range returns {
		slices.Sort(r)
	}
	for _, f := range faults {
		last := int64(0)
		for _, r := range returns {
			k, _ := slices.BinarySearch(r, f.end)
			if k == len(r) {
				last = math.MaxInt64
				break
			}
			last = max(last, r[k])
		}
		if last != math.MaxInt64 {
			rep.Recovery[f.kind] = append(rep.Recovery[f.kind], time.Duration(last-f.end))
		}
	}
	for k, v := range rec.counts {
		rep.Ops[k] = v
	}
	// A crash ends every operation of the target unless it kills one
	// gateway of several.
	_, gw := tg.(*gateways)
	var st stretchStats
	rep.Verdict, rep.Window, st = check(newModel(rec.owner), h, cfg.Artifact, !gw)
	rep.Checked = st.String()
	return rep, nil
}

// check runs the checker: stretch by stretch where the history can be
// cut (segments.go), else whole. For an illegal history it finds the
// first failing block (or stretch) and the shortest prefix of it (by
// invocation) that already breaks the model, lists that prefix's last
// operations (flushes left out), and writes the checker's visualization
// of the prefix to artifact.
func check(model porcupine.NondeterministicModel, h []porcupine.Operation, artifact string, cut bool) (porcupine.CheckResult, []string, stretchStats) {
	single := model
	single.Partition = nil
	if cut {
		res, fail, st, ok := checkStretches(model, h, 2*time.Minute)
		if ok {
			if fail == nil {
				return res, nil, st
			}
			from := make([]string, len(fail.init))
			for k, s := range fail.init {
				from[k] = fmt.Sprintf("%x", s.cur)
			}
			m := single
			m.Init = func() []any {
				out := make([]any, len(fail.init))
				for k, s := range fail.init {
					out[k] = s
				}
				return out
			}
			out := []string{fmt.Sprintf("block %d, in the stretch from %v, which starts holding one of [%s]:",
				fail.block, time.Duration(slices.MinFunc(fail.ops, byCall).Call), strings.Join(from, " "))}
			return res, append(out, explain(m, fail.ops, artifact)...), st
		}
	}
	res := porcupine.CheckOperationsTimeout(model.ToModel(), h, 10*time.Minute)
	if res != porcupine.Illegal {
		return res, nil, stretchStats{}
	}
	for _, part := range partition(h) {
		if porcupine.CheckOperationsTimeout(single.ToModel(), part, time.Minute) == porcupine.Illegal {
			return res, explain(single, part, artifact), stretchStats{}
		}
	}
	return res, nil, stretchStats{}
}

func byCall(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) }

// explain finds the shortest prefix (by invocation) of an illegal part
// of a history that already breaks the model, lists its last operations
// (flushes left out), and writes the checker's visualization of it to
// artifact.
func explain(model porcupine.NondeterministicModel, part []porcupine.Operation, artifact string) []string {
	m := model.ToModel()
	part = slices.Clone(part)
	slices.SortFunc(part, byCall)
	lo, hi := 1, len(part)
	for lo < hi {
		mid := (lo + hi) / 2
		if porcupine.CheckOperationsTimeout(m, clipped(part[:mid]), 20*time.Second) != porcupine.Illegal {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	prefix := clipped(part[:lo])
	var out []string
	if artifact != "" {
		_, info := porcupine.CheckOperationsVerbose(m, prefix, time.Minute)
		if err := porcupine.VisualizePath(m, info, artifact); err != nil {
			out = append(out, "visualization: "+err.Error())
		}
	}
	var shown []porcupine.Operation
	syncs := 0
	for i := len(prefix) - 1; i >= 0 && len(shown) < 16; i-- {
		if prefix[i].Input.(input).kind == opSync {
			syncs++
			continue
		}
		shown = append(shown, prefix[i])
	}
	slices.Reverse(shown)
	for _, op := range shown {
		ret := "never returned"
		if op.Return != math.MaxInt64 {
			ret = time.Duration(op.Return).String()
		}
		out = append(out, fmt.Sprintf("client %d  %-30s  %v .. %s", op.ClientId,
			model.DescribeOperation(op.Input, op.Output), time.Duration(op.Call), ret))
	}
	return append(out, fmt.Sprintf("(%d acknowledged SYNCHRONIZE CACHE among them not shown)", syncs))
}

// clipped is a prefix of a history whose operations returning after the
// prefix's last call are left open (they may take effect later, or not).
func clipped(p []porcupine.Operation) []porcupine.Operation {
	out := slices.Clone(p)
	last := p[len(p)-1].Call
	var keep []porcupine.Operation
	for _, op := range out {
		if op.Return > last && op.Input.(input).kind == opRead {
			continue // a read's value only counts once it returned
		}
		keep = append(keep, op)
	}
	return keep
}

// recorder collects the history.
type recorder struct {
	mu     sync.Mutex
	ops    []porcupine.Operation
	counts map[string]int
	nexus  int         // the last nexus number given out
	owner  map[int]int // the client of each nexus
}

// newNexus numbers a client's new session.
func (r *recorder) newNexus(client int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nexus++
	r.owner[r.nexus] = client
	return r.nexus
}

func (r *recorder) add(op porcupine.Operation) {
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

func (r *recorder) count(what string) {
	r.mu.Lock()
	if r.counts == nil {
		r.counts = map[string]int{}
	}
	r.counts[what]++
	r.mu.Unlock()
}

// targetRunner runs the target: start (again, after a crash) returns its
// address; crash ends it as a power loss or SIGKILL would; stop ends it.
type targetRunner interface {
	start() (string, error)
	crash()
	stop()
}

// incarnation is the target in this process as it runs between two
// crashes: an LU on a fresh view of the disk, an iSCSI server, a
// listener.
type incarnation struct {
	cfg  *Config
	disk *volatileDisk
	srv  *target.Server
}

func (t *incarnation) start() (string, error) {
	log := t.cfg.Log
	dev := scsitarget.NewDevice(iqn, log)
	lu, err := scsitarget.NewLU(iqn, scsitarget.LUConfig{Backend: t.disk.View(), BlockSize: blockSize, WriteThrough: t.cfg.WriteThrough})
	if err != nil {
		return "", err
	}
	dev.AddLU(lu)
	t.srv = target.NewServer(log, target.Options{})
	if err := t.srv.AddTarget(&target.Target{Name: iqn, Device: dev}); err != nil {
		return "", err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	a := fabric.TCP(l)
	if t.cfg.Fabric == "iser" {
		a = fabric.Portal(l, fabric.ISERPortal{IWARP: siw.New(siw.Options{}), PD: rdma.NewDevice("torture").AllocPD()})
	}
	go t.srv.Serve(a)
	return l.Addr().String(), nil
}

// crash loses power under the target: the disk's cache goes first, then
// the server (nothing of it reaches the disk again).
func (t *incarnation) crash() {
	t.disk.Crash()
	t.stop()
}

// stop ends the server at once (no logout asked for).
func (t *incarnation) stop() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	t.srv.Shutdown(ctx)
}

// process is the target as a blockwire process serving a file, or one
// gateway of an RBD image.
type process struct {
	cfg  *Config
	name string   // its log's name in Dir ("target")
	lun  []string // serve's flags for LUN 0 (default: a file in Dir)
	addr string
	cmd  *exec.Cmd
	log  *os.File
}

func (p *process) start() (string, error) {
	if p.log == nil {
		if p.addr == "" {
			// A port of our own, kept across restarts.
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return "", err
			}
			p.addr = l.Addr().String()
			l.Close()
		}
		if p.name == "" {
			p.name = "target"
		}
		var err error
		if p.log, err = os.Create(filepath.Join(p.cfg.Dir, p.name+".log")); err != nil {
			return "", err
		}
	}
	lun := p.lun
	if lun == nil {
		lun = []string{"--file", filepath.Join(p.cfg.Dir, "lun.img"), "--size", strconv.Itoa(p.cfg.Blocks * blockSize)}
	}
	args := append([]string{"serve", "--listen", p.addr, "--iqn", iqn, "--block-size", strconv.Itoa(blockSize),
		"--iser=" + strconv.FormatBool(p.cfg.Fabric == "iser"), "--log-level", "warn",
		"--write-cache=" + strconv.FormatBool(!p.cfg.WriteThrough)}, lun...)
	p.cmd = exec.Command(p.cfg.Binary, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		return "", err
	}
	// A gateway opens its image first: under load, or while the cluster
	// still holds a killed gateway's lock, that takes a while.
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", p.addr); err == nil {
			c.Close()
			return p.addr, nil
		}
	}
	p.crash()
	return "", fmt.Errorf("%s serve did not listen on %s within a minute (log: %s)", p.cfg.Binary, p.addr, p.log.Name())
}

func (p *process) crash() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.cmd.Wait()
}

func (p *process) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
	p.log.Close()
}

// gateways are blockwire processes serving one RBD image as one LU, a
// target port group each (all active/optimized); a crash is one of them
// SIGKILLed and started again on its port.
type gateways struct {
	cfg *Config
	rng *rand.Rand
	ps  []*process
}

func (g *gateways) start() (string, error) {
	if g.ps == nil {
		var groups []string
		for i := range g.cfg.Gateways {
			groups = append(groups, fmt.Sprintf("%d=active-optimized", i+1))
		}
		for i := range g.cfg.Gateways {
			g.ps = append(g.ps, &process{cfg: g.cfg, name: fmt.Sprintf("gateway%d", i+1),
				lun: []string{"--rbd", g.cfg.RBD, "--ceph-conf", g.cfg.CephConf, "--tpgt", strconv.Itoa(i + 1),
					"--port-groups", strings.Join(groups, ",")}})
		}
		for _, p := range g.ps {
			if _, err := p.start(); err != nil {
				return "", err
			}
		}
		return g.ps[0].addr, nil
	}
	// After a crash: the one that died.
	for _, p := range g.ps {
		if p.cmd.ProcessState != nil {
			return p.start()
		}
	}
	return g.ps[0].addr, nil
}

func (g *gateways) crash() { g.ps[g.rng.IntN(len(g.ps))].crash() }

func (g *gateways) stop() {
	for _, p := range g.ps {
		if p.cmd.ProcessState == nil {
			p.stop()
		}
	}
}

func (g *gateways) addrs() []string {
	var out []string
	for _, p := range g.ps {
		out = append(out, p.addr)
	}
	return out
}

// client is one initiator session doing operations.
type client struct {
	id     int
	cfg    *Config
	portal string
	paths  []string // failover portals (gateways)
	rng    *rand.Rand
	now    func() int64
	rec    *recorder
	seq    uint64
	s      *initiator.Session
	pr     bool // reservations in play: register on every session
	nexus  int  // the session's number (with pr)
}

func (c *client) login(ctx context.Context) error {
	s, err := initiator.Login(ctx, c.portal, iqn, initiator.Options{
		InitiatorName:   fmt.Sprintf("iqn.2026-11.org.blockwire:torture-client-%d", c.id),
		Dialer:          &fabric.Dialer{},
		ISER:            c.cfg.Fabric == "iser",
		Connections:     c.cfg.Connections,
		DialTimeout:     2 * time.Second,
		RecoveryTimeout: 15 * time.Second,
		NopInterval:     time.Second,
		Paths:           c.paths,
	})
	if err != nil {
		return err
	}
	c.s = s
	if c.pr {
		c.nexus = c.rec.newNexus(c.id)
		c.register()
	}
	return nil
}

// register registers the client's key on its session (REGISTER AND
// IGNORE EXISTING KEY).
func (c *client) register() {
	op := porcupine.Operation{ClientId: c.id, Input: input{kind: opRegister, nexus: c.nexus}, Call: c.now()}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.OpTimeout)
	defer cancel()
	_, err := c.do(ctx, prOut(6), prParams(0, clientKey(c.id)), nil)
	op.Return = c.now()
	if err != nil {
		op.Return, op.Output = math.MaxInt64, output{unknown: true, failed: op.Return}
		c.rec.count("register failed")
	} else {
		c.rec.count("register ok")
	}
	c.rec.add(op)
}

func (c *client) run(ctx context.Context) {
	defer func() {
		if c.s != nil {
			c.s.Close()
		}
	}()
	buf := make([]byte, blockSize)
	for ctx.Err() == nil {
		if c.s == nil {
			if err := c.login(ctx); err != nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
		}
		block := c.rng.IntN(c.cfg.Blocks)
		op := porcupine.Operation{ClientId: c.id}
		octx, cancel := context.WithTimeout(context.Background(), c.cfg.OpTimeout)
		switch p := c.rng.IntN(100); {
		case p < 45:
			c.seq++
			v := uint64(c.id+1)<<48 | c.seq
			fua := c.rng.IntN(3) == 0
			fill(buf, v)
			// Write-through: every write is durable once acknowledged.
			op.Input = input{kind: opWrite, block: block, value: v, fua: fua || c.cfg.WriteThrough, nexus: c.nexus}
			op.Call = c.now()
			_, err := c.do(octx, rw16(0x8a, block, fua), buf, nil)
			op.Return = c.now()
			var se *initiator.SCSIError
			switch {
			case errors.As(err, &se) && se.Status == statusReservationConflict:
				// Refused before it ran: it did not happen. Register
				// again (a preemption, or a new session).
				c.rec.count("write refused: reservation conflict")
				if c.s != nil {
					c.register()
				}
			case err != nil:
				op.Return, op.Output = math.MaxInt64, output{unknown: true, failed: op.Return} // it may have happened, or not
				c.rec.count("write failed")
				c.rec.add(op)
			default:
				c.rec.count("write ok")
				c.rec.add(op)
			}
		case p < 95:
			op.Input = input{kind: opRead, block: block}
			op.Call = c.now()
			_, err := c.do(octx, rw16(0x88, block, false), nil, buf)
			op.Return = c.now()
			if err != nil {
				c.rec.count("read failed")
				break
			}
			c.rec.count("read ok")
			vs := values(buf)
			if len(vs) > 1 {
				// A read overlapping a write of the block may see part
				// of each (model.go): every part must be a value the
				// block held while the read ran.
				c.rec.count("read torn")
				c.cfg.Log.Info("torn read", "block", block, "at", time.Duration(op.Call), "words", tornWords(buf))
			}
			for _, v := range vs {
				op.Output = output{value: v}
				c.rec.add(op)
			}
		default:
			op.Input = input{kind: opSync}
			op.Call = c.now()
			_, err := c.do(octx, []byte{0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0}, nil, nil)
			op.Return = c.now()
			if err != nil {
				c.rec.count("sync failed")
				break
			}
			c.rec.count("sync ok")
			c.rec.add(op)
		}
		cancel()
		time.Sleep(c.cfg.Pause)
	}
}

// do runs one command; a session that ended is dropped (the next
// operation logs in again).
func (c *client) do(ctx context.Context, cdb, out, in []byte) (initiator.Result, error) {
	r, err := c.s.Do(ctx, 0, cdb, out, in)
	if err == nil {
		return r, nil
	}
	c.cfg.Log.Debug("operation failed", "client", c.id, "err", err)
	var se *initiator.SCSIError
	if !errors.As(err, &se) {
		// The session failed (recovery gave up) or the command was
		// aborted: start again with a new one.
		c.s.Close()
		c.s = nil
	}
	return r, err
}

// rw16 is READ(16) (0x88) or WRITE(16) (0x8a) of one block.
func rw16(op byte, block int, fua bool) []byte {
	cdb := make([]byte, 16)
	cdb[0] = op
	if fua {
		cdb[1] = 0x08
	}
	binary.BigEndian.PutUint64(cdb[2:], uint64(block))
	binary.BigEndian.PutUint32(cdb[10:], 1)
	return cdb
}

// fill writes v into every 8-byte word of b.
func fill(b []byte, v uint64) {
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], v)
	}
}

// values reads back what fill wrote: one value, or for a torn block
// each value found in it. The tear itself may fall inside a word (a copy
// by bytes, as Linux's page cache and an emulated CPU do): a word whose
// every byte is that of the word before or of the word after, those two
// differing, is where one value gives way to the other and is no value
// of its own. Only such a word is passed over: a word of bytes from
// anything else counts as the value it spells, and breaks the model.
func values(b []byte) []uint64 {
	n := len(b) / 8
	word := func(i int) uint64 { return binary.LittleEndian.Uint64(b[i*8:]) }
	var vs []uint64
	for i := 0; i < n; i++ {
		v := word(i)
		if i > 0 && i+1 < n && tornBetween(v, word(i-1), word(i+1)) {
			continue
		}
		if !slices.Contains(vs, v) {
			vs = append(vs, v)
		}
	}
	return vs
}

// tornBetween reports whether v, differing from both a and b (which
// differ), has each byte of a or of b.
func tornBetween(v, a, b uint64) bool {
	if a == b || v == a || v == b {
		return false
	}
	for k := 0; k < 64; k += 8 {
		if x := v >> k & 0xff; x != a>>k&0xff && x != b>>k&0xff {
			return false
		}
	}
	return true
}

// tornWords describes a torn block: each run of equal words as
// "value@first-byte".
func tornWords(b []byte) string {
	var out []string
	prev := uint64(0)
	for i := 0; i+8 <= len(b); i += 8 {
		v := binary.LittleEndian.Uint64(b[i:])
		if i == 0 || v != prev {
			out = append(out, fmt.Sprintf("%x@%d", v, i))
		}
		prev = v
	}
	return strings.Join(out, " ")
}

// Persistent reservations (SPC-4 §6.16, PERSISTENT RESERVE OUT).
const (
	statusReservationConflict = 0x18
	adminKey                  = 0xAD
	prTypeWERO                = 5 // Write Exclusive – Registrants Only
)

func clientKey(c int) uint64 { return 0x1000 + uint64(c) + 1 }

// prOut is a PERSISTENT RESERVE OUT CDB: service action sa (1 RESERVE, 5
// PREEMPT AND ABORT, 6 REGISTER AND IGNORE EXISTING KEY), type WERO, 24
// bytes of parameters.
func prOut(sa byte) []byte {
	cdb := make([]byte, 10)
	cdb[0], cdb[1], cdb[2] = 0x5f, sa, prTypeWERO
	binary.BigEndian.PutUint32(cdb[5:], 24)
	return cdb
}

// prParams is its parameter list: the reservation key and the service
// action reservation key.
func prParams(key, saKey uint64) []byte {
	p := make([]byte, 24)
	binary.BigEndian.PutUint64(p[0:], key)
	binary.BigEndian.PutUint64(p[8:], saKey)
	return p
}

// reserve logs in to the target at addr as the preemptor, registers its
// key and takes the reservation.
func reserve(ctx context.Context, addr string) (*initiator.Session, error) {
	s, err := initiator.Login(ctx, addr, iqn, initiator.Options{
		InitiatorName: "iqn.2026-11.org.blockwire:torture-preemptor", Dialer: &fabric.Dialer{}, NopInterval: time.Second})
	if err != nil {
		return nil, err
	}
	for _, step := range []struct {
		sa         byte
		key, saKey uint64
	}{{6, 0, adminKey}, {1, adminKey, 0}} {
		// The first command may meet the LU's power-on unit attention.
		for try := 0; ; try++ {
			_, err = s.Do(ctx, 0, prOut(step.sa), prParams(step.key, step.saKey), nil)
			if err == nil || try == 2 {
				break
			}
		}
		if err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}
