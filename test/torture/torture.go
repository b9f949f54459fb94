package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/blockwire/blockwire/iscsi/initiator"
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
	// Fabric is "tcp" (iSCSI/TCP), "iser" (iSER over the software
	// iWARP device, which runs over TCP: the proxy's faults apply) or
	// "nvme" (NVMe/TCP: each client a host with one I/O queue, its
	// keep-alive timeout nvmeKATO).
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
	// ServeArgs are more flags for the binary's serve (its LUN's
	// --io-engine and --direct, say).
	ServeArgs []string
	// LUNFile, with Binary, is the file the binary serves (default: one
	// in Dir).
	LUNFile string
	// PowerCut, with Binary, is a shell command run after each SIGKILL,
	// before the restart: it must leave at LUNFile only what the storage
	// under it had made durable, as a power cut would (the guest lab's
	// power-cut scenario replays a dm-log-writes log to the moment of the
	// kill). A command that fails ends the run.
	PowerCut string
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
	// CACHE without making anything durable; LieAboutSync only
	// SYNCHRONIZE CACHE (FUA stays honest): deliberate bugs the checker
	// must catch. Without Binary only.
	LieAboutFlush, LieAboutSync bool
	// FUAFlushesAll gives the storage in this process no durable write:
	// the SCSI core then answers FUA with a flush of every cached block
	// (storage without RWF_DSYNC). By default a FUA write makes its own
	// block durable and no other, as on a file.
	FUAFlushesAll bool
	// WriteDelay is how long each write to the storage in this process
	// takes before it lands (0): with it, writes are in flight in the
	// storage when a PREEMPT AND ABORT comes, and the abort must wait
	// for them.
	WriteDelay time.Duration
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
	// Implausible, when set, says why the run proves little whatever its
	// verdict (implausible): it fails the run as an illegal history does.
	Implausible string `json:",omitempty"`
}

// implausible says why a run's history, legal or not, proves little: no
// write or no read completed, more than a tenth of them failed (the
// faults kept the clients from working rather than testing them), or,
// with preemptions, none took effect (no PREEMPT AND ABORT completed, or
// no write was refused for the reservation after one). "" when none.
func (r *Report) implausible(faults []string) string {
	w, rd := r.Ops["write ok"], r.Ops["read ok"]
	if w == 0 || rd == 0 {
		return fmt.Sprintf("too few operations completed (%d writes, %d reads)", w, rd)
	}
	failed := r.Ops["write failed"] + r.Ops["read failed"]
	if total := w + rd + failed; failed*10 > total {
		return fmt.Sprintf("%d of %d writes and reads failed", failed, total)
	}
	if slices.Contains(faults, "preempt") && (r.Ops["preempt ok"] == 0 || r.Ops["write refused: reservation conflict"] == 0) {
		return fmt.Sprintf("no preemption took effect (%d PREEMPT AND ABORT completed, %d writes refused for a reservation conflict)",
			r.Ops["preempt ok"], r.Ops["write refused: reservation conflict"])
	}
	return ""
}

// Run runs the clients against a target while faults are injected, then
// checks the history.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.defaults()
	rep := &Report{Seed: cfg.Seed, Ops: map[string]int{}, Faults: map[string]int{}, Recovery: map[string][]time.Duration{}}
	if cfg.Fabric != "tcp" && cfg.Fabric != "iser" && cfg.Fabric != "nvme" {
		return nil, fmt.Errorf("fabric %q: tcp, iser or nvme", cfg.Fabric)
	}
	pr := slices.Contains(cfg.Faults, "preempt")
	if cfg.Fabric == "nvme" && (cfg.RBD != "" || cfg.Connections > 1 || slices.Contains(cfg.Faults, "reset-one")) {
		return nil, errors.New(`over NVMe/TCP: no "reset-one", gateways or more connections yet`)
	}
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
	if (cfg.LUNFile != "" || cfg.PowerCut != "") && (cfg.Binary == "" || cfg.RBD != "") {
		return nil, errors.New("LUNFile and PowerCut are for a target run from Binary serving a file (not gateways)")
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
		if cfg.LieAboutSync && cfg.FUAFlushesAll {
			// FUA would flush through the same lying Flush: that is
			// LieAboutFlush, not a SYNCHRONIZE CACHE that lies alone.
			return nil, errors.New("LieAboutSync needs storage with a durable write (not FUAFlushesAll)")
		}
		lie := ""
		switch {
		case cfg.LieAboutFlush:
			lie = "flush"
		case cfg.LieAboutSync:
			lie = "sync"
		}
		tg = &incarnation{cfg: &cfg, disk: newVolatileDisk(int64(cfg.Blocks)*blockSize, blockSize, lie, cfg.FUAFlushesAll, cfg.WriteDelay)}
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
		// Only reservation. Over NVMe/TCP it is an iSCSI session to the
		// same LU: one reservation state, the hosts preempted across
		// the fabrics.
		adminAddr := addr
		if cfg.Fabric == "nvme" {
			adminAddr = tg.iscsi()
		}
		if admin, err = reserve(ctx, adminAddr); err != nil {
			return nil, fmt.Errorf("reserving: %w", err)
		}
		defer admin.Close()
	}
	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()

	var wg sync.WaitGroup
	// writing[c]: 1 + the block client c has a write outstanding to, or
	// 0 (a preemption picks such a victim when there is one, so aborts
	// race writes in flight).
	writing := make([]atomic.Int64, cfg.Clients)
	for c := 0; c < cfg.Clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := &client{id: c, cfg: &cfg, targets: px.addrs(), home: c % len(px), rng: rand.New(rand.NewPCG(cfg.Seed, uint64(c)+1)), now: now, rec: rec, pr: pr,
				writing: &writing[c]}
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
			victim := tg.crash()
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
			rec.add(porcupine.Operation{ClientId: cfg.Clients, Input: input{kind: opCrash, victim: victim}, Call: call, Return: now()})
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
			for i := range cfg.Clients {
				if c := (victim + i) % cfg.Clients; writing[c].Load() != 0 {
					victim = c
					break
				}
			}
			inFlight := int(writing[victim].Load()) - 1
			op := porcupine.Operation{ClientId: cfg.Clients, Input: input{kind: opPreempt, victim: victim}, Call: now()}
			octx, ocancel := context.WithTimeout(ctx, cfg.OpTimeout)
			_, err := admin.Do(octx, 0, prOut(5), prParams(adminKey, clientKey(victim)), nil)
			op.Return = now()
			var se *initiator.SCSIError
			switch {
			case errors.As(err, &se) && se.Status == statusReservationConflict:
				// The victim's key is not registered (preempted before,
				// not registered again yet): refused, nothing happened
				// (SPC-4, PREEMPT with an unregistered service action
				// reservation key).
				rec.count("preempt refused: key not registered")
			case err != nil:
				cfg.Log.Warn("preempt failed", "victim", victim, "after", time.Duration(op.Return-op.Call), "err", err)
				op.Return, op.Output = math.MaxInt64, output{unknown: true, failed: op.Return}
				rec.count("preempt failed")
				rec.add(op)
			default:
				rec.count("preempt ok")
				rec.add(op)
			}
			if err == nil && inFlight >= 0 && cfg.WriteDelay > 0 {
				// The block the victim was writing, read at once and
				// again once its write would have landed: a write the
				// preemption neither aborted nor waited for shows up
				// in the second read only.
				for _, wait := range []time.Duration{0, cfg.WriteDelay + 5*time.Millisecond} {
					time.Sleep(wait)
					look(octx, admin, rec, cfg.Clients, inFlight, now)
				}
			}
			ocancel()
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
	var st stretchStats
	rep.Verdict, rep.Window, st = check(newModel(rec.owner), h, cutting{logins: rec.logins, timeout: 2 * time.Minute}, cfg.Artifact)
	rep.Implausible = rep.implausible(cfg.Faults)
	rep.Checked = st.String()
	return rep, nil
}

// recorder collects the history.
type recorder struct {
	mu     sync.Mutex
	ops    []porcupine.Operation
	counts map[string]int
	nexus  int         // the last nexus number given out
	owner  map[int]int // the client of each nexus
	logins map[int][]login
}

// login is a client's login that completed, on a target (gateway).
type login struct {
	call, ret int64
	target    int
}

func (r *recorder) addLogin(client int, l login) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.logins == nil {
		r.logins = map[int][]login{}
	}
	r.logins[client] = append(r.logins[client], l)
	if r.counts == nil {
		r.counts = map[string]int{}
	}
	r.counts["login ok"]++
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

// look reads block through s as client id and records what it saw.
func look(ctx context.Context, s *initiator.Session, rec *recorder, id, block int, now func() int64) {
	buf := make([]byte, blockSize)
	op := porcupine.Operation{ClientId: id, Input: input{kind: opRead, block: block}, Call: now()}
	if _, err := s.Do(ctx, 0, rw16(0x88, block, false), nil, buf); err != nil {
		return // a read that failed says nothing
	}
	op.Return = now()
	for _, v := range values(buf) {
		op.Output = v
		rec.add(op)
	}
}
