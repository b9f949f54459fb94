package main

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/blockwire/blockwire/internal/mutant"
)

// op is a history entry for the model tests: times in milliseconds, ret
// < 0 for a write that never returned.
func op(client int, in input, out uint64, call, ret int64) porcupine.Operation {
	r, o := ret*int64(time.Millisecond), output{value: out}
	if ret < 0 {
		r, o.unknown = math.MaxInt64, true
	}
	return porcupine.Operation{ClientId: client, Input: in, Output: o, Call: call * int64(time.Millisecond), Return: r}
}

func w(b int, v uint64, fua bool) input {
	return input{kind: opWrite, block: b, value: v, fua: fua, durable: fua}
}
func rd(b int) input { return input{kind: opRead, block: b} }
func wn(b int, v uint64, nexus int) input {
	return input{kind: opWrite, block: b, value: v, nexus: nexus}
}
func reg(nexus int) input      { return input{kind: opRegister, nexus: nexus} }
func preempt(client int) input { return input{kind: opPreempt, victim: client} }

var (
	syncOp  = input{kind: opSync}
	crashOp = input{kind: opCrash}
)

// TestModel: the durability and reservation rules on small histories,
// each legal or not.
func TestModel(t *testing.T) {
	for _, c := range []struct {
		name  string
		h     []porcupine.Operation
		legal bool
	}{
		{"a FUA write survives a crash", []porcupine.Operation{
			op(0, w(0, 1, true), 0, 0, 1), op(9, crashOp, 0, 2, 3), op(0, rd(0), 1, 4, 5)}, true},
		{"a FUA write lost by a crash", []porcupine.Operation{
			op(0, w(0, 1, true), 0, 0, 1), op(9, crashOp, 0, 2, 3), op(0, rd(0), 0, 4, 5)}, false},
		{"a plain write may be lost by a crash", []porcupine.Operation{
			op(0, w(0, 1, false), 0, 0, 1), op(9, crashOp, 0, 2, 3), op(0, rd(0), 0, 4, 5)}, true},
		{"a plain write may survive a crash", []porcupine.Operation{
			op(0, w(0, 1, false), 0, 0, 1), op(9, crashOp, 0, 2, 3), op(0, rd(0), 1, 4, 5)}, true},
		{"a synchronized write lost by a crash", []porcupine.Operation{
			op(0, w(0, 1, false), 0, 0, 1), op(1, syncOp, 0, 2, 3), op(9, crashOp, 0, 4, 5), op(0, rd(0), 0, 6, 7)}, false},
		{"an older value comes back after a newer durable write", []porcupine.Operation{
			op(0, w(0, 1, true), 0, 0, 1), op(0, w(0, 2, true), 0, 2, 3), op(9, crashOp, 0, 4, 5), op(0, rd(0), 1, 6, 7)}, false},
		{"a plain write over a durable one: either survives", []porcupine.Operation{
			op(0, w(0, 1, true), 0, 0, 1), op(0, w(0, 2, false), 0, 2, 3), op(9, crashOp, 0, 4, 5), op(0, rd(0), 1, 6, 7)}, true},
		{"a value never written", []porcupine.Operation{
			op(0, w(0, 1, false), 0, 0, 1), op(0, rd(0), 7, 2, 3)}, false},
		{"a stale read after a completed write", []porcupine.Operation{
			op(0, w(0, 1, false), 0, 0, 1), op(0, w(0, 2, false), 0, 2, 3), op(1, rd(0), 1, 4, 5)}, false},
		{"a read concurrent with a write sees either", []porcupine.Operation{
			op(0, w(0, 1, false), 0, 0, 1), op(0, w(0, 2, false), 0, 2, 6), op(1, rd(0), 1, 3, 4), op(2, rd(0), 2, 4, 5)}, true},
		{"a write that never returned may happen late", []porcupine.Operation{
			op(0, w(0, 1, true), 0, 0, -1), op(1, rd(0), 0, 2, 3), op(1, rd(0), 1, 4, 5)}, true},
		{"a write that never returned takes effect once", []porcupine.Operation{
			op(0, w(0, 1, true), 0, 0, -1), op(1, rd(0), 1, 2, 3), op(1, w(0, 2, true), 0, 4, 5), op(1, rd(0), 2, 6, 7),
			op(1, rd(0), 1, 8, 9)}, false},
		{"blocks are independent, crashes and flushes reach all", []porcupine.Operation{
			op(0, w(0, 1, false), 0, 0, 1), op(1, w(1, 2, false), 0, 0, 1), op(2, syncOp, 0, 2, 3),
			op(9, crashOp, 0, 4, 5), op(0, rd(0), 1, 6, 7), op(1, rd(1), 0, 6, 7)}, false},
		// Reservations: client 0 has nexus 1, client 1 nexus 2.
		{"a write acknowledged after its key was preempted", []porcupine.Operation{
			op(0, reg(1), 0, 0, 1), op(1, reg(2), 0, 0, 1), op(9, preempt(0), 0, 2, 3),
			op(0, wn(0, 5, 1), 0, 4, 5)}, false},
		{"a write acknowledged once registered again", []porcupine.Operation{
			op(0, reg(1), 0, 0, 1), op(9, preempt(0), 0, 2, 3), op(0, reg(1), 0, 4, 5),
			op(0, wn(0, 5, 1), 0, 6, 7), op(1, rd(0), 5, 8, 9)}, true},
		{"an aborted write that lands after the preemption", []porcupine.Operation{
			op(0, reg(1), 0, 0, 1), op(1, reg(2), 0, 0, 1),
			op(0, wn(0, 5, 1), 0, 2, -1), op(9, preempt(0), 0, 3, 4),
			op(1, wn(0, 6, 2), 0, 5, 6), op(1, rd(0), 5, 7, 8)}, false},
		{"an aborted write that landed before the preemption", []porcupine.Operation{
			op(0, reg(1), 0, 0, 1), op(1, reg(2), 0, 0, 1),
			op(0, wn(0, 5, 1), 0, 2, -1), op(1, rd(0), 5, 3, 4), op(9, preempt(0), 0, 5, 6),
			op(1, rd(0), 5, 7, 8)}, true},
		{"an aborted write may never land", []porcupine.Operation{
			op(0, reg(1), 0, 0, 1), op(0, wn(0, 5, 1), 0, 2, -1), op(9, preempt(0), 0, 3, 4),
			op(1, rd(0), 0, 5, 6)}, true},
	} {
		m := newModel(map[int]int{1: 0, 2: 1})
		if got := porcupine.CheckOperations(m.ToModel(), c.h); got != c.legal {
			t.Errorf("%s: linearizable %v, want %v", c.name, got, c.legal)
		}
	}
}

// long skips a harness run unless BLOCKWIRE_LONG is set: go test ./...
// leaves the torture runs to .ci/run, which sets it.
func long(t *testing.T) {
	t.Helper()
	if os.Getenv("BLOCKWIRE_LONG") == "" {
		t.Skip("long: a torture run (faults injected, the history checked); BLOCKWIRE_LONG=1 runs it, as .ci/run does")
	}
}

// short runs the harness for d and fails the test on an error or a
// verdict other than want.
func short(t *testing.T, cfg Config, want porcupine.CheckResult) *Report {
	t.Helper()
	if cfg.Artifact == "" {
		// Kept after the test for a failing history (CI prints where).
		cfg.Artifact = filepath.Join(os.TempDir(), "blockwire-torture-"+t.Name()+".html")
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	rep.Print(&b)
	t.Logf("\n%s", b.String())
	if rep.Verdict != want {
		if rep.Verdict == porcupine.Illegal {
			t.Logf("the checker's visualization of the failing history: %s", cfg.Artifact)
		}
		t.Fatalf("verdict %s, want %s", rep.Verdict, want)
	}
	if rep.Implausible != "" {
		t.Fatalf("implausible: %s (%v)", rep.Implausible, rep.Ops)
	}
	return rep
}

// TestTortureTCP: a fixed-seed run over iSCSI/TCP, two connections per
// session (MC/S), every fault, against the target in this process whose
// storage loses its unflushed cache on a crash.
func TestTortureTCP(t *testing.T) {
	long(t)
	rep := short(t, Config{Duration: 45 * time.Second, Seed: 1, Connections: 2, FaultEvery: 700 * time.Millisecond}, porcupine.Ok)
	if rep.Faults["crash"] == 0 {
		t.Errorf("no crash injected: %v", rep.Faults)
	}
	// Crashes end every operation of this target: the history is
	// checked stretch by stretch (segments.go), as a long run's must be.
	if !strings.HasPrefix(rep.Checked, "checked in") || strings.Contains(rep.Checked, "the checker failed") {
		t.Errorf("checker: %s", rep.Checked)
	}
}

// TestTortureNetworkOnly: without crashes, failed writes are bounded by
// the client's next login (session reinstatement) or their status, so a
// crash-free history too is checked stretch by stretch — in bounded
// memory, however long the run — and that bound is checked on the way:
// no write of a session lands after a login that reinstated it.
func TestTortureNetworkOnly(t *testing.T) {
	long(t)
	rep := short(t, Config{Duration: 20 * time.Second, Seed: 3, FaultEvery: 500 * time.Millisecond,
		Faults: []string{"reset", "reset-one", "partition", "delay"}}, porcupine.Ok)
	if !strings.HasPrefix(rep.Checked, "checked in") || strings.Contains(rep.Checked, "the checker failed") || !strings.HasSuffix(rep.Checked, " 0 not)") {
		t.Errorf("checker: %s", rep.Checked)
	}
}

// TestTortureISER: the same over iSER on the software iWARP device.
func TestTortureISER(t *testing.T) {
	long(t)
	short(t, Config{Duration: 45 * time.Second, Seed: 2, Fabric: "iser", FaultEvery: 700 * time.Millisecond}, porcupine.Ok)
}

// TestTortureNVMe: the same over NVMe/TCP — crashes, resets, partitions
// and delays; the failed writes are bounded by a crash or by the
// target's keep-alive timeout (nvmeQuiesce), and the history is checked
// stretch by stretch. With storage whose flushes lie the same run must
// fail: the harness catches a durability bug over NVMe too.
func TestTortureNVMe(t *testing.T) {
	long(t)
	rep := short(t, Config{Duration: 30 * time.Second, Seed: 4, Fabric: "nvme", Faults: []string{"crash", "reset", "partition", "delay"},
		FaultEvery: 700 * time.Millisecond}, porcupine.Ok)
	if rep.Faults["crash"] == 0 || rep.Faults["reset"]+rep.Faults["partition"] == 0 {
		t.Errorf("faults %v: want crashes and lost connections", rep.Faults)
	}
	if !strings.HasPrefix(rep.Checked, "checked in") || strings.Contains(rep.Checked, "the checker failed") {
		t.Errorf("checker: %s", rep.Checked)
	}
	short(t, Config{Duration: 9 * time.Second, Seed: 5, Fabric: "nvme", LieAboutFlush: true, Faults: []string{"crash"},
		FaultEvery: 300 * time.Millisecond}, porcupine.Illegal)
}

// TestTortureNVMePreempt: NVMe hosts register through NVMe (Reservation
// Register) and an iSCSI session to the same LU holds the reservation and
// PREEMPTs AND ABORTs their keys — one reservation state across the
// fabrics — while writes take 10 ms in the storage (in flight when a
// preemption comes), with resets, partitions and delays: none of a host's
// writes sent before a preemption may land after it.
func TestTortureNVMePreempt(t *testing.T) {
	long(t)
	rep := short(t, Config{Duration: 20 * time.Second, Seed: 6, Fabric: "nvme", WriteDelay: 10 * time.Millisecond,
		Faults: []string{"preempt", "reset", "partition", "delay"}, FaultEvery: 400 * time.Millisecond}, porcupine.Ok)
	if rep.Ops["preempt ok"] == 0 || rep.Ops["write refused: reservation conflict"] == 0 {
		t.Errorf("no preemption took effect: %v", rep.Ops)
	}
}

// TestTortureWriteThrough: with the write cache off, every acknowledged
// write must survive a crash, FUA or not.
func TestTortureWriteThrough(t *testing.T) {
	long(t)
	short(t, Config{Duration: 20 * time.Second, Seed: 3, WriteThrough: true, Faults: []string{"crash", "reset"},
		FaultEvery: 500 * time.Millisecond}, porcupine.Ok)
}

// TestTortureKill: the blockwire executable serving a file, SIGKILLed
// and restarted, with the write cache on and off — on the file's default
// I/O paths, and with every read, write and FUA write (RWF_DSYNC) through
// io_uring with O_DIRECT, whose completions arrive asynchronously.
func TestTortureKill(t *testing.T) {
	long(t)
	bin := filepath.Join(t.TempDir(), "blockwire")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/blockwire/blockwire/cmd/blockwire").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, c := range []struct {
		wt   bool
		args []string
	}{{false, nil}, {true, nil}, {false, []string{"--io-engine", "io_uring", "--direct"}}} {
		dir := t.TempDir()
		logsOnFailure(t, dir)
		rep := short(t, Config{Duration: 20 * time.Second, Seed: 4, Binary: bin, Dir: dir, WriteThrough: c.wt, ServeArgs: c.args,
			Faults: []string{"crash", "reset", "partition"}, FaultEvery: 700 * time.Millisecond}, porcupine.Ok)
		if rep.Faults["crash"] == 0 {
			t.Errorf("no kill: %v", rep.Faults)
		}
		if log, _ := os.ReadFile(filepath.Join(dir, "target.log")); strings.Contains(string(log), "panic") {
			t.Errorf("the target panicked:\n%s", log)
		}
	}
}

// TestPowerCutCommand: with PowerCut, the command runs after every
// SIGKILL and before the restart (the guest lab's power-cut scenario
// replays the storage's write log there), the binary serves LUNFile, and
// a command that fails ends the run with its reason.
func TestPowerCutCommand(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "blockwire")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/blockwire/blockwire/cmd/blockwire").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := t.TempDir()
	logsOnFailure(t, dir)
	lun, cuts := filepath.Join(dir, "elsewhere.img"), filepath.Join(dir, "cuts")
	rep := short(t, Config{Duration: 6 * time.Second, Seed: 5, Binary: bin, Dir: dir, LUNFile: lun,
		PowerCut: "test -f " + lun + " && echo cut >> " + cuts, Faults: []string{"crash"}, FaultEvery: 500 * time.Millisecond}, porcupine.Ok)
	b, _ := os.ReadFile(cuts)
	if n := strings.Count(string(b), "cut\n"); n == 0 || n != rep.Faults["crash"] {
		t.Errorf("the power-cut command ran %d times for %d kills", n, rep.Faults["crash"])
	}
	if _, err := os.Stat(filepath.Join(dir, "lun.img")); err == nil {
		t.Error("the binary served the default file, not LUNFile")
	}
	dir = t.TempDir()
	_, err := Run(context.Background(), Config{Duration: 3 * time.Second, Seed: 5, Binary: bin, Dir: dir,
		PowerCut: "echo the log is gone; exit 3", Faults: []string{"crash"}, FaultEvery: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "power cut") {
		t.Fatalf("a failing power cut: Run returned %v", err)
	}
}

// TestCheckerCatchesLostFUA: storage that acknowledges FUA and
// SYNCHRONIZE CACHE without making anything durable must fail the check,
// with the breaking operations listed and the visualization written.
func TestCheckerCatchesLostFUA(t *testing.T) {
	long(t)
	html := filepath.Join(t.TempDir(), "history.html")
	rep := short(t, Config{Duration: 9 * time.Second, Seed: 5, LieAboutFlush: true, Faults: []string{"crash"},
		FaultEvery: 300 * time.Millisecond, Artifact: html}, porcupine.Illegal)
	w := strings.Join(rep.Window, "\n")
	if len(rep.Window) < 2 || !strings.Contains(w, "in the stretch from") || !strings.Contains(w, "<- the history breaks the model here") {
		t.Errorf("no operations shown for the failure, not its stretch, or no mark where it breaks: %q", rep.Window)
	}
	if fi, err := os.Stat(html); err != nil || fi.Size() == 0 {
		t.Errorf("no visualization: %v", err)
	}
}

// TestCheckerCatchesLyingSyncCache: storage whose SYNCHRONIZE CACHE
// answers GOOD without flushing, while FUA writes are durable, must fail
// the check — in a run like TestTortureTCP's, every fault kind. With the
// earlier storage double, whose every FUA write flushed every block, such
// a lie went through the CI runs: one FUA write after the SYNCHRONIZE
// CACHE made its writes durable anyway.
//
// The same bug in the SCSI core is among TestHarnessCatchesMutations';
// here the storage lies, and the run is shorter.
func TestCheckerCatchesLyingSyncCache(t *testing.T) {
	long(t)
	short(t, Config{Duration: 10 * time.Second, Seed: 1, Connections: 2, LieAboutSync: true, FaultEvery: 500 * time.Millisecond}, porcupine.Illegal)
	if _, err := Run(context.Background(), Config{Duration: time.Second, LieAboutSync: true, FUAFlushesAll: true}); err == nil {
		t.Error("a lying SYNCHRONIZE CACHE on storage whose FUA flushes everything was run (FUA would lie too)")
	}
}

// TestTortureFUAFlushesAll: the earlier storage double, FUA flushing
// every cached block, still runs clean.
func TestTortureFUAFlushesAll(t *testing.T) {
	long(t)
	short(t, Config{Duration: 10 * time.Second, Seed: 8, FUAFlushesAll: true, Faults: []string{"crash", "reset"},
		FaultEvery: 500 * time.Millisecond}, porcupine.Ok)
}

// TestTorturePreempt: PREEMPT AND ABORT of a client's key at random
// times while it writes, with resets, partitions and delays: none of its
// writes sent before a preemption may land after it.
func TestTorturePreempt(t *testing.T) {
	long(t)
	rep := short(t, Config{Duration: 30 * time.Second, Seed: 6, Faults: []string{"preempt", "reset", "partition", "delay"},
		FaultEvery: 500 * time.Millisecond}, porcupine.Ok)
	if rep.Ops["preempt ok"] == 0 || rep.Ops["write refused: reservation conflict"] == 0 {
		t.Errorf("no preemption took effect: %v", rep.Ops)
	}
}

// TestTortureCephGateways: two blockwire gateways (the rbd build) serve
// one Ceph RBD image; clients log in through one with the other as a
// failover path while a gateway is SIGKILLed now and then, with resets,
// partitions and delays. Needs a cluster: BLOCKWIRE_CEPH_CONF names its
// ceph.conf (.ci/run's Ceph stage sets it; test/ceph/up.sh starts one).
func TestTortureCephGateways(t *testing.T) {
	long(t)
	conf, bin, dir, img := cephGateways(t, "torture")
	rep := short(t, Config{Duration: 45 * time.Second, Seed: 7, Binary: bin, Dir: dir, RBD: img, CephConf: conf,
		Faults: []string{"crash", "reset", "partition", "delay"}}, porcupine.Ok)
	if rep.Faults["crash"] == 0 {
		t.Errorf("no gateway killed: %v", rep.Faults)
	}
	// Failed writes are bounded by the gateways' deaths and the clients'
	// logins: the history is checked stretch by stretch.
	if !strings.HasPrefix(rep.Checked, "checked in") || strings.Contains(rep.Checked, "the checker failed") {
		t.Errorf("checker: %s", rep.Checked)
	}
}

// TestTortureCephGatewaysPreempt: preemptions on two gateways of one
// Ceph RBD image, the correct code: a PREEMPT AND ABORT through one
// gateway ends the victim's writes on the other too before it completes
// (scsitarget/prgate.go), so none lands after it. (The Ceph stage.)
func TestTortureCephGatewaysPreempt(t *testing.T) {
	long(t)
	conf, bin, dir, img := cephGateways(t, "torture-preempt")
	short(t, Config{Duration: 20 * time.Second, Seed: 7, Binary: bin, Dir: dir, RBD: img, CephConf: conf,
		Faults: []string{"preempt", "reset"}, FaultEvery: 500 * time.Millisecond}, porcupine.Ok)
}

// cephGateways is what a run on gateways of one Ceph RBD image needs: the
// cluster's ceph.conf (BLOCKWIRE_CEPH_CONF; the test is skipped without
// one: .ci/run's Ceph stage sets it, test/ceph/up.sh starts a cluster),
// the rbd build of blockwire, a directory for its logs (printed when the
// test fails) and a new image named after prefix, removed at the end.
func cephGateways(t *testing.T, prefix string) (conf, bin, dir, img string) {
	t.Helper()
	conf = os.Getenv("BLOCKWIRE_CEPH_CONF")
	if conf == "" {
		t.Skip("no Ceph cluster: BLOCKWIRE_CEPH_CONF is not set (.ci/run's Ceph stage runs this)")
	}
	dir = t.TempDir()
	logsOnFailure(t, dir)
	bin = filepath.Join(dir, "blockwire-rbd")
	if out, err := exec.Command("go", "build", "-tags", "rbd", "-o", bin, "github.com/blockwire/blockwire/cmd/blockwire").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags rbd: %v\n%s", err, out)
	}
	rbdPool(conf)
	img = "rbd/" + prefix + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if out, err := exec.Command("rbd", "-c", conf, "create", "--size", "64M", img).CombinedOutput(); err != nil {
		t.Fatalf("rbd create: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("rbd", "-c", conf, "rm", "--no-progress", img).Run() })
	return conf, bin, dir, img
}

// rbdPool makes the cluster's "rbd" pool unless it is there.
func rbdPool(conf string) {
	if out, err := exec.Command("ceph", "-c", conf, "osd", "pool", "ls").CombinedOutput(); err != nil || !strings.Contains(string(out), "rbd\n") {
		exec.Command("ceph", "-c", conf, "osd", "pool", "create", "rbd", "8").Run()
		exec.Command("rbd", "-c", conf, "pool", "init", "rbd").Run()
	}
}

// logsOnFailure prints the end of every target log in dir when the test
// failed (dir goes with the test).
func logsOnFailure(t *testing.T, dir string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("%s:\n%s", filepath.Base(l), b)
		}
	})
}

// TestNetemNeedsDevices: the network's faults are refused without the
// devices netem acts on, and device names parse as dev or dev@netns
// (the faults themselves run in the guest lab's torture-netem scenario:
// the host kernel has no netem).
func TestNetemNeedsDevices(t *testing.T) {
	if _, err := Run(context.Background(), Config{Duration: time.Second, Faults: []string{"loss"}}); err == nil || !strings.Contains(err.Error(), "Netem") {
		t.Fatalf("loss without devices: %v", err)
	}
	devs, err := parseNetDevs([]string{"ta", "tb@tor"})
	if err != nil || len(devs) != 2 || devs[0] != (netDev{"ta", ""}) || devs[1] != (netDev{"tb", "tor"}) {
		t.Fatalf("parsed %+v, %v", devs, err)
	}
	if _, err := parseNetDevs([]string{"@tor"}); err == nil {
		t.Fatal("a device with no name parsed")
	}
}

// TestValuesTornInsideAWord: a read torn inside a word (the one seen in
// the guest lab: ...0054 of one write giving way to ...0068 of another,
// one word holding bytes of both) names the two values, not a third;
// a word with a byte of neither names itself.
func TestValuesTornInsideAWord(t *testing.T) {
	const a, b = 0x3000000000054, 0x1000000000068
	blk := make([]byte, 64)
	fill(blk[:24], a)
	fill(blk[32:], b)
	binary.LittleEndian.PutUint64(blk[24:], 0x1000000000054) // high bytes of b, the low one of a
	if got := values(blk); !slices.Equal(got, []output{{value: a}, {value: b}}) {
		t.Errorf("torn inside a word: %+v, want %x and %x", got, a, b)
	}
	binary.LittleEndian.PutUint64(blk[24:], 0x1000000000077) // 0x77: neither
	if got := values(blk); !slices.Contains(got, output{value: 0x1000000000077}) {
		t.Errorf("a word of other bytes passed over: %+v", got)
	}
	fill(blk, a)
	binary.LittleEndian.PutUint64(blk[0:], 0x1000000000054) // no word before it
	if got := values(blk); !slices.ContainsFunc(got, func(o output) bool { return o.value == 0x1000000000054 }) {
		t.Errorf("a first word passed over: %+v", got)
	}
}

// reads is a read of block 0 by client from call to ret that returned
// outs: one history entry per value (model.go).
func reads(client int, outs []output, call, ret int64) []porcupine.Operation {
	var h []porcupine.Operation
	for _, o := range outs {
		r := op(client, rd(0), 0, call, ret)
		r.Output = o
		h = append(h, r)
	}
	return h
}

// TestValuesTornInAnEdgeWord: the tear falls in the block's first (or
// last) word, so the value given way to is seen nowhere whole — the one
// seen over TCP in CI: the read names the bytes it saw of that value,
// and the model takes them when a value the block held has them, and
// refuses them when none has.
func TestValuesTornInAnEdgeWord(t *testing.T) {
	const old, new = 0x2000000000131, 0x1000000000254
	blk := make([]byte, 64)
	for _, c := range []struct {
		name string
		at   int
	}{{"first", 0}, {"last", 56}} {
		fill(blk, new)
		binary.LittleEndian.PutUint64(blk[c.at:], 0x1000000000131) // low bytes of old, high ones of new
		want := []output{{value: 0x1000000000131, mask: 0xffff}, {value: new}}
		if c.at != 0 {
			want[0], want[1] = want[1], want[0]
		}
		got := values(blk)
		if !slices.Equal(got, want) {
			t.Fatalf("torn in the %s word: %+v, want %+v", c.name, got, want)
		}
		m := newModel(nil)
		// old written, then new written while the block is read.
		h := append([]porcupine.Operation{op(0, w(0, old, false), 0, 0, 1), op(0, w(0, new, false), 0, 2, 5)}, reads(1, got, 3, 4)...)
		if !porcupine.CheckOperations(m.ToModel(), h) {
			t.Errorf("torn in the %s word: the model refused %+v", c.name, got)
		}
		h[0].Input = w(0, 0x2000000000177, false) // old's low bytes were never written
		if porcupine.CheckOperations(m.ToModel(), h) {
			t.Errorf("torn in the %s word: the model took bytes of no value written", c.name)
		}
	}
	// The read of CI's failure (block 13, 2026-11-27): 0x200000000063d
	// written over 0x30000000005ef, the first two words torn, each in its
	// own way.
	const old2, new2 = 0x30000000005ef, 0x200000000063d
	fill(blk, new2)
	binary.LittleEndian.PutUint64(blk[0:], 0x20000000005ef)
	binary.LittleEndian.PutUint64(blk[8:], 0x20000000006ef)
	h := append([]porcupine.Operation{op(0, w(0, old2, false), 0, 0, 1), op(1, w(0, new2, false), 0, 2, 5)}, reads(2, values(blk), 3, 4)...)
	if m := newModel(nil); !porcupine.CheckOperations(m.ToModel(), h) {
		t.Errorf("CI's torn read refused: %+v", values(blk))
	}
	// A first word that is a whole value found elsewhere in the block is
	// that value, every byte of it.
	fill(blk, new)
	binary.LittleEndian.PutUint64(blk[0:], old)
	binary.LittleEndian.PutUint64(blk[32:], old)
	if got := values(blk); !slices.Contains(got, output{value: old}) {
		t.Errorf("a whole value in the first word taken in part: %+v", got)
	}
}

// TestCLIFailsAnImplausibleRun: a run in which no preemption took effect
// proves nothing about preemptions, linearizable or not: the command
// fails it and says why (the go tests did; the command exited 0).
func TestCLIFailsAnImplausibleRun(t *testing.T) {
	long(t)
	var out, errOut strings.Builder
	code := run([]string{"-faults", "preempt", "-fault-every", "1h", "-duration", "2s", "-seed", "6"}, &out, &errOut)
	if code != 1 || !strings.Contains(out.String(), "implausible: no preemption took effect") {
		t.Fatalf("exit %d, output:\n%s%s", code, out.String(), errOut.String())
	}
	for _, c := range []struct {
		ops  map[string]int
		want string
	}{
		{map[string]int{"write ok": 100, "read ok": 100, "write failed": 5}, ""},
		{map[string]int{"write ok": 0, "read ok": 100}, "too few operations"},
		{map[string]int{"write ok": 50, "read ok": 50, "read failed": 20}, "20 of 120"},
	} {
		r := &Report{Ops: c.ops}
		if got := r.implausible(nil); c.want == "" && got != "" || !strings.Contains(got, c.want) {
			t.Errorf("%v: %q, want %q", c.ops, got, c.want)
		}
	}
}

// TestTorturePreemptInFlight: preemptions of clients whose writes are in
// flight in slow storage (10 ms a write), each followed by two reads of the
// block being written: PREEMPT AND ABORT must abort those writes or wait
// for them, so that none lands after it completed.
func TestTorturePreemptInFlight(t *testing.T) {
	long(t)
	rep := short(t, Config{Duration: 10 * time.Second, Seed: 6, WriteDelay: 10 * time.Millisecond, Faults: []string{"preempt", "reset"},
		FaultEvery: 300 * time.Millisecond}, porcupine.Ok)
	t.Logf("%d preemptions", rep.Ops["preempt ok"])
}

// mutations are deliberate bugs a real target could have, each a
// replacement in one source file, and the run that must catch it.
var mutations = []struct {
	name, file, old, new string
	args                 []string
}{
	{"SYNCHRONIZE CACHE answers GOOD without flushing", "scsitarget/commands.go",
		"\tif err := lu.Flush(); err != nil {\n\t\tlu.dev.log.Error(\"backend flush failed\", \"lun\", lu.lun, \"err\", err)\n\t\treturn ioFailed(err, true, rw.LBA)\n\t}\n\treturn nil\n}\n\nfunc cmdUnmap(",
		"\treturn nil\n}\n\nfunc cmdUnmap(",
		[]string{"-connections", "2", "-fault-every", "700ms", "-duration", "20s", "-seed", "1"}},
	{"the reservation check skipped for WRITE(16)", "scsitarget/commands.go",
		"\t\tconflict, gated, epoch := lu.prCheck(c.Nexus, o)\n\t\tif conflict {",
		"\t\tconflict, gated, epoch := lu.prCheck(c.Nexus, o)\n\t\tif conflict && c.CDB[0] != 0x8a {",
		[]string{"-faults", "preempt,reset", "-fault-every", "500ms", "-duration", "10s", "-seed", "6"}},
	{"PREEMPT AND ABORT does not wait for the NVMe hosts' writes", "scsitarget/pr.go",
		"\tif err == nil && sa == 5 {\n\t\t// The preempted NVMe hosts' writes too (prunit.go).",
		"\tif false && err == nil && sa == 5 {\n\t\t// The preempted NVMe hosts' writes too (prunit.go).",
		[]string{"-fabric", "nvme", "-faults", "preempt,reset", "-write-delay", "10ms", "-fault-every", "400ms", "-duration", "12s", "-seed", "6"}},
	{"the reservation check skipped for NVMe commands", "nvme/nvmetarget/resv.go",
		"\tok, ticket = r.Admit(q.c.resvName, write)",
		"\tok, ticket = true, 0",
		[]string{"-fabric", "nvme", "-faults", "preempt,reset", "-fault-every", "400ms", "-duration", "10s", "-seed", "6"}},
	{"PREEMPT AND ABORT aborts nothing", "scsitarget/pr.go",
		"\t\tif sa == 5 && len(victims) > 0 {",
		"\t\tif false && sa == 5 && len(victims) > 0 {",
		[]string{"-faults", "preempt,reset", "-write-delay", "10ms", "-fault-every", "300ms", "-duration", "10s", "-seed", "6"}},
	{"FUA ignored on WRITE", "blockcore/store.go",
		"fua || !s.cache.Load())",
		"!s.cache.Load())",
		[]string{"-faults", "crash", "-fault-every", "300ms", "-duration", "10s", "-seed", "5"}},
	{"write-through that caches", "blockcore/store.go",
		"fua || !s.cache.Load())",
		"fua)",
		[]string{"-write-through", "-faults", "crash,reset", "-fault-every", "500ms", "-duration", "10s", "-seed", "3"}},
	{"a write acknowledged before it is applied", "blockcore/store.go",
		"\t_, err := s.be.WriteAt(p, off)",
		"\tgo s.be.WriteAt(append([]byte(nil), p...), off)\n\tvar err error",
		[]string{"-faults", "reset", "-write-delay", "5ms", "-fault-every", "500ms", "-duration", "10s", "-seed", "1"}},
	// A read in flight when the connection dropped is answered with
	// whatever its buffer held — what had arrived, or nothing — instead of
	// being sent again on the reinstated session: a stale read after a
	// reconnect (in the initiator; the harness's clients use it).
	{"a read in flight at a reconnect answered without being sent again", "iscsi/initiator/io.go",
		"\t\t\tfor _, t := range pending {\n",
		"\t\t\tfor _, t := range pending {\n\t\t\t\tif t.in != nil {\n\t\t\t\t\ts.finish(t.itt, &Result{}, nil)\n\t\t\t\t\tcontinue\n\t\t\t\t}\n",
		[]string{"-faults", "reset,partition", "-fault-every", "300ms", "-duration", "10s", "-seed", "1"}},
	// The old session's writes, still in the storage, land after the
	// login that reinstated it completed and after the replayed copy was
	// answered (with the nexus loss's unit attention): caught without
	// crashes, by the bound the crash-free checking rests on.
	{"a session reinstatement that does not wait for the old session", "iscsi/iscsitarget/login.go",
		"		case <-time.After(reinstateWait):",
		"		default:",
		[]string{"-faults", "reset,partition", "-write-delay", "20ms", "-fault-every", "300ms", "-duration", "10s", "-seed", "1"}},
}

// TestHarnessCatchesMutations builds this command with each deliberate bug
// in the target (go build -overlay: the source file replaced, nothing in
// the product to switch it on) and runs it: every run must fail, with a
// history that breaks the model or a run too implausible to prove
// anything. A mutation whose code is gone from its file fails the test
// until it is brought up to date.
func TestHarnessCatchesMutations(t *testing.T) {
	long(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mutations {
		t.Run(m.name, func(t *testing.T) {
			dir := t.TempDir()
			bin := filepath.Join(dir, "torture")
			build := exec.Command("go", "build", "-overlay", overlay(t, root, dir, m.file, m.old, m.new), "-o", bin, "./test/torture")
			build.Dir = root
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("building the mutant: %v\n%s", err, out)
			}
			// A second run, with another seed, only when the first let
			// the bug through: how soon a bug shows depends on timing
			// too, and CI's machine is shared.
			var out []byte
			for try, seed := range []string{"", "101"} {
				args := m.args
				if seed != "" {
					args = append(slices.Clone(args), "-seed", seed)
				}
				out, err = exec.Command(bin, args...).CombinedOutput()
				var ee *exec.ExitError
				if errors.As(err, &ee) && ee.ExitCode() == 1 {
					break
				}
				if try == 1 {
					t.Fatalf("the harness let the bug through in two runs (%v):\n%s", err, out)
				}
				t.Logf("the first run let the bug through: %v", err)
			}
			if !strings.Contains(string(out), "NOT linearizable") && !strings.Contains(string(out), "implausible:") {
				t.Fatalf("the run failed for another reason:\n%s", out)
			}
			for _, l := range strings.Split(string(out), "\n") {
				if strings.HasPrefix(l, "verdict:") || strings.HasPrefix(l, "implausible:") {
					t.Log(l)
				}
			}
		})
	}
}

// overlay writes, in dir, a copy of file (relative to root) in which old
// becomes new, and returns the go build -overlay file that uses it.
func overlay(t *testing.T, root, dir, file, old, new string) string {
	t.Helper()
	path, err := mutant.Overlay(dir, filepath.Join(root, file), map[string]string{old: new})
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTortureCephGatewaysCatchStaleReservations: a deliberate bug in the
// gateways' shared reservation state — a gateway acknowledges another's
// change of the state without marking its own copy out of date, so after
// a PREEMPT AND ABORT through one gateway the other still takes the
// preempted client's writes — must fail preemptions on two gateways of
// one Ceph RBD image. (Runs in .ci/run's Ceph stage.)
func TestTortureCephGatewaysCatchStaleReservations(t *testing.T) {
	long(t)
	conf := os.Getenv("BLOCKWIRE_CEPH_CONF")
	if conf == "" {
		t.Skip("no Ceph cluster: BLOCKWIRE_CEPH_CONF is not set (.ci/run's Ceph stage runs this)")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "blockwire-rbd-stale")
	build := exec.Command("go", "build", "-tags", "rbd", "-overlay", overlay(t, root, dir, "scsitarget/pr.go",
		"\t\tif v == 0 || v != p.known.Load() {\n\t\t\tp.stale.Store(true)\n",
		"\t\tif v == 0 || v != p.known.Load() {\n"), "-o", bin, "./cmd/blockwire")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the mutant: %v\n%s", err, out)
	}
	rbdPool(conf)
	for try, seed := range []uint64{7, 8} {
		img := "rbd/torture-stale-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		if out, err := exec.Command("rbd", "-c", conf, "create", "--size", "64M", img).CombinedOutput(); err != nil {
			t.Fatalf("rbd create: %v\n%s", err, out)
		}
		t.Cleanup(func() { exec.Command("rbd", "-c", conf, "rm", "--no-progress", img).Run() })
		rep, err := Run(context.Background(), Config{Duration: 15 * time.Second, Seed: seed, Binary: bin, Dir: t.TempDir(), RBD: img,
			CephConf: conf, Faults: []string{"preempt", "reset"}, FaultEvery: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Verdict == porcupine.Illegal || rep.Implausible != "" {
			t.Logf("caught (seed %d): %s %s", seed, verdictText(rep.Verdict), rep.Implausible)
			return
		}
		if try == 1 {
			t.Fatalf("the harness let stale reservations through in two runs: %v", rep.Ops)
		}
	}
}
