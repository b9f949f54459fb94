// Command torture drives several initiator sessions against a blockwire
// iSCSI target while faults are injected — power lost under the target
// (its unflushed write cache is gone), connection resets, network
// partitions, delays — records every operation with its invocation and
// completion time, and checks the history with a linearizability checker
// (porcupine) against per-block registers with the durability SCSI
// promises (model.go). It prints what it did and the verdict, and for a
// failing history the operations that break the model; -html writes the
// checker's visualization.
//
//	go run ./test/torture -duration 30m -seed 7
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("torture", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg Config
	fs.DurationVar(&cfg.Duration, "duration", time.Minute, "how long the clients run")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "the seed the operations and the faults come from")
	fs.IntVar(&cfg.Clients, "clients", 4, "initiator sessions")
	fs.IntVar(&cfg.Blocks, "blocks", 16, "4 KiB blocks they share")
	fs.DurationVar(&cfg.Pause, "pause", time.Millisecond, "each client's pause between operations")
	fs.DurationVar(&cfg.FaultEvery, "fault-every", time.Second, "mean time between faults")
	faults := fs.String("faults", strings.Join(AllFaults, ","), "fault kinds: "+strings.Join(KnownFaults, ", ")+` ("preempt" not with "crash")`)
	fs.BoolVar(&cfg.LieAboutFlush, "lie-about-flush", false, "storage that acknowledges FUA and SYNCHRONIZE CACHE without making anything durable (the checker must fail)")
	fs.BoolVar(&cfg.LieAboutSync, "lie-about-sync", false, "storage whose SYNCHRONIZE CACHE answers GOOD without flushing, FUA honest (the checker must fail)")
	fs.DurationVar(&cfg.WriteDelay, "write-delay", 0, "how long each write to the in-process storage takes before it lands (writes in flight at a preemption)")
	fs.BoolVar(&cfg.FUAFlushesAll, "fua-flushes-all", false, "storage without a durable write: FUA flushes every cached block (hides a lying SYNCHRONIZE CACHE)")
	fs.StringVar(&cfg.Fabric, "fabric", "tcp", "tcp (iSCSI/TCP), iser (iSER over the software iWARP device) or nvme (NVMe/TCP)")
	fs.IntVar(&cfg.Connections, "connections", 1, "connections per session (MC/S above 1)")
	fs.BoolVar(&cfg.WriteThrough, "write-through", false, "the LU's write cache off: every acknowledged write must survive")
	fs.StringVar(&cfg.Binary, "binary", "", "run this blockwire executable as the target (crash = SIGKILL) instead of one in this process")
	fs.StringVar(&cfg.LUNFile, "lun-file", "", "with -binary: the file it serves (default: one in a temporary directory)")
	fs.StringVar(&cfg.PowerCut, "power-cut", "", "with -binary: a shell command run after each SIGKILL, before the restart, that leaves at -lun-file only what the storage made durable (a power cut)")
	fs.StringVar(&cfg.TargetAddr, "target-addr", "", "with -binary: the address it serves on (default a free port on 127.0.0.1)")
	netem := fs.String("netem", "", `network devices ("dev" or "dev@netns", comma-separated) on the path to the target for the faults loss, reorder, jitter and blackhole (tc netem)`)
	fs.StringVar(&cfg.RBD, "rbd", "", "with -binary (an rbd build) and -ceph-conf: gateways serving this RBD image (pool/image); crash kills one")
	fs.StringVar(&cfg.CephConf, "ceph-conf", "", "the cluster's ceph.conf")
	fs.IntVar(&cfg.Gateways, "gateways", 2, "with -rbd: how many gateways")
	fs.StringVar(&cfg.Artifact, "html", "", "write the checker's visualization of a failing history here")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	verbose := fs.Bool("v", false, "log the faults and the target's warnings")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	for _, f := range strings.Split(*faults, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if !slices.Contains(KnownFaults, f) {
			fmt.Fprintf(stderr, "torture: unknown fault %q (%s)\n", f, strings.Join(KnownFaults, ", "))
			return 2
		}
		cfg.Faults = append(cfg.Faults, f)
	}
	if *netem != "" {
		cfg.Netem = strings.Split(*netem, ",")
	}
	if *verbose {
		cfg.Log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	if cfg.Binary != "" {
		dir, err := os.MkdirTemp("", "torture")
		if err != nil {
			fmt.Fprintln(stderr, "torture:", err)
			return 1
		}
		cfg.Dir = dir
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(stderr, "torture:", err)
		if cfg.Dir != "" {
			fmt.Fprintln(stderr, "torture: the target's logs are kept in", cfg.Dir)
		}
		return 1
	}
	if cfg.Dir != "" && rep.Verdict == porcupine.Ok {
		os.RemoveAll(cfg.Dir)
	}
	if *asJSON {
		e := json.NewEncoder(stdout)
		e.SetIndent("", "  ")
		e.Encode(rep)
	} else {
		rep.Print(stdout)
	}
	if rep.Verdict != porcupine.Ok || rep.Implausible != "" {
		return 1
	}
	return 0
}

// Print writes the report for a person.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "seed %d, %s\n", r.Seed, r.Duration.Round(time.Millisecond))
	fmt.Fprintf(w, "operations:")
	for _, k := range sortedKeys(r.Ops) {
		fmt.Fprintf(w, "  %s %d", k, r.Ops[k])
	}
	fmt.Fprintf(w, "\nfaults:")
	for _, k := range sortedKeys(r.Faults) {
		fmt.Fprintf(w, "  %s %d", k, r.Faults[k])
	}
	fmt.Fprintln(w)
	for _, k := range sortedKeys(r.Recovery) {
		d := slices.Clone(r.Recovery[k])
		slices.Sort(d)
		fmt.Fprintf(w, "recovery after %s: p50 %s  p99 %s  max %s  (%d)\n", k,
			pct(d, 50), pct(d, 99), d[len(d)-1].Round(time.Millisecond), len(d))
	}
	if r.NetemDropped > 0 {
		fmt.Fprintf(w, "netem: %d packets dropped\n", r.NetemDropped)
	}
	if r.Checked != "" {
		fmt.Fprintf(w, "checker: %s\n", r.Checked)
	}
	fmt.Fprintf(w, "verdict: %s\n", verdictText(r.Verdict))
	if r.Implausible != "" {
		fmt.Fprintf(w, "implausible: %s — the run proves little, and fails\n", r.Implausible)
	}
	for _, l := range r.Window {
		fmt.Fprintln(w, "  ", l)
	}
}

func verdictText(v porcupine.CheckResult) string {
	switch v {
	case porcupine.Ok:
		return "linearizable: no acknowledged durable write lost, no stale or invented read"
	case porcupine.Illegal:
		return "NOT linearizable: the history breaks the model (the operations of the block up to the first break follow)"
	}
	return "unknown: the checker timed out"
}

func pct(d []time.Duration, p int) time.Duration {
	i := (len(d)*p + 99) / 100
	return d[max(0, min(len(d)-1, i-1))].Round(time.Millisecond)
}

func sortedKeys[V any](m map[string]V) []string {
	var k []string
	for x := range m {
		k = append(k, x)
	}
	slices.Sort(k)
	return k
}
