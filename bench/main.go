// Command bench is blockwire's side-by-side benchmark harness: it starts
// Debian's tgt (RAM-backed LUN) and blockwire (memory LUN) on loopback
// ports and runs the same fixed set of workloads against each with
// third-party clients (qemu-img bench through QEMU's libiscsi driver,
// libiscsi's iscsi-perf) and with blockwire's own initiator, alternating
// A B A B over several rounds, plus iperf3 for the loopback ceiling and the
// target's memory with idle and busy sessions. It prints one table of
// medians, spreads and blockwire/tgt ratios; only ratios from one run mean
// anything on a shared machine.
//
//	go run ./bench [-rounds 3] [-quick]
//	go run ./bench -iser-only   # iSER and SRP versus iSCSI/TCP
//	go run ./bench -gateway     # tgt directly versus through the gateway
//	go run ./bench -rbd         # RBD LUNs: tgt-rbd versus backend/rbd (root, Ceph)
//	go run ./bench -file        # file LUNs: pread, io_uring, O_DIRECT versus fio on the file
//	go run ./bench -spdk        # per target core: SPDK iscsi_tgt versus blockwire versus tgt
//	go run ./bench -nvme        # NVMe/TCP per target core: SPDK nvmf_tgt versus blockwire (spdk_nvme_perf)
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/internal/benchplot"
	"github.com/blockwire/blockwire/iscsi/initiator"
)

type target struct {
	name string
	url  string
	pid  int
	srp  string   // blockwire's SRP URL
	args []string // blockwire bench's flags for the URL (as --roce)
}

const benchSRPID = "0011223344556677"

type workload struct {
	name   string
	unit   string
	higher bool // higher is better
	run    func(t target) (float64, error)
}

var (
	rounds   = flag.Int("rounds", 3, "alternating rounds (at least 3 for a median)")
	quick    = flag.Bool("quick", false, "shorter runs (for a smoke test)")
	bwBin    = flag.String("blockwire", "", "blockwire binary (default: build it)")
	iserOnly = flag.Bool("iser-only", false, "only blockwire's transports: iSER and SRP versus iSCSI/TCP (no tgt)")
	gwOnly   = flag.Bool("gateway", false, "only the gateway hop: tgt directly versus blockwire serving tgt's LUN (--remote) over iSCSI/TCP and iSER")
	spdkOnly = flag.Bool("spdk", false, "only the per-core comparison: SPDK's iscsi_tgt, blockwire and tgt pinned to core 1, clients on core 0 (SPDK built as ../shared/anchors/spdk says)")
	conns    = flag.Bool("conns", false, "with -nvme: also 4 KiB random reads at QD 1 and QD 32 over 2, 4 and 16 connections (spdk_nvme_perf -P), to set the polling mode beside the default mode as connections share the target core")
	nvmeOnly = flag.Bool("nvme", false, "only NVMe/TCP per target core: SPDK's nvmf_tgt and blockwire pinned to core 1, spdk_nvme_perf on core 0 (SPDK built as ../shared/anchors/spdk says)")
	pin      = flag.Bool("pin", true, "with -spdk or -nvme: pin each target to core 1 and the clients to core 0 (false: no pinning)")
	outDir   = flag.String("out", "docs/bench", "where each table is written as JSON and an SVG chart, and each queue-depth sweep (the default run and -spdk) as JSON and an SVG of IOPS against depth and latency distributions (empty: nowhere)")
	fileOnly = flag.Bool("file", false, "only file LUNs: blockwire's pread, io_uring and O_DIRECT paths (O_DIRECT also pinned to core 1 with --poll 1ms, as SPDK runs) versus fio (io_uring engine) on the same file, in tmpfs and on a loop device")
	roceOnly = flag.Bool("roce", false, "only the software RoCEv2 device: iSER over it versus iSCSI/TCP on the same target (0.8x TCP at 128 KiB QD 8)")
	poll     = flag.Duration("poll", 0, "with -roce: the target's receivers poll this long before they sleep (serve --poll), on both fabrics; written as roce-poll.json and .svg")
	rbdOnly  = flag.Bool("rbd", false, "only RBD LUNs: tgt's rbd backing store (tgt-rbd) versus blockwire's backend/rbd on one Ceph cluster")
)

func main() {
	flag.Parse()
	log.SetFlags(0)
	tools := []string{"tgtd", "tgtadm", "qemu-img", "iscsi-perf", "iperf3"}
	if *iserOnly {
		tools = nil
	}
	if *gwOnly {
		tools = []string{"tgtd", "tgtadm"}
	}
	if *rbdOnly || *fileOnly || *spdkOnly || *roceOnly || *nvmeOnly {
		tools = nil // rbdBench, fileBench, spdkBench and nvmeBench check their own
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			log.Fatalf("bench: %s not found (apt-get install tgt qemu-utils qemu-block-extra libiscsi-bin iperf3)", tool)
		}
	}
	dir, _ := os.MkdirTemp("", "blockwire-bench")
	defer os.RemoveAll(dir)
	if *rbdOnly {
		rbdBench(dir)
		return
	}
	bin := *bwBin
	if bin == "" {
		bin = filepath.Join(dir, "blockwire")
		if out, err := exec.Command("go", "build", "-o", bin, "./cmd/blockwire").CombinedOutput(); err != nil {
			log.Fatalf("bench: building blockwire: %v\n%s", err, out)
		}
	}
	if *gwOnly {
		gateway(bin, dir)
		return
	}
	if *fileOnly {
		fileBench(bin)
		return
	}
	if *spdkOnly {
		spdkBench(bin, *pin)
		return
	}
	if *nvmeOnly {
		nvmeBench(bin, *pin)
		return
	}
	if *roceOnly {
		roceBench(bin)
		return
	}
	bw, stopBw := startBlockwire(bin)
	defer stopBw()

	dur := runTime()
	// A large odd step scatters qemu-img bench's offsets over the LUN
	// (it wraps at the end), standing in for random I/O.
	const scatter = "1040384"
	ws := []workload{
		{"qemu 4k randread QD1", "IOPS", true, qemu(requests(20000), "-d", "1", "-s", "4096", "-S", scatter)},
		{"qemu 4k randread QD32", "IOPS", true, qemu(requests(100000), "-d", "32", "-s", "4096", "-S", scatter)},
		{"qemu 4k randwrite QD1", "IOPS", true, qemu(requests(20000), "-d", "1", "-s", "4096", "-S", scatter, "-w")},
		{"qemu 4k randwrite QD32", "IOPS", true, qemu(requests(100000), "-d", "32", "-s", "4096", "-S", scatter, "-w")},
		{"qemu 64k read QD8", "MB/s", true, qemu(requests(20000), "-d", "8", "-s", "65536")},
		{"qemu 64k write QD8", "MB/s", true, qemu(requests(20000), "-d", "8", "-s", "65536", "-w")},
		{"qemu 128k read QD8", "MB/s", true, qemu(requests(10000), "-d", "8", "-s", "131072")},
		{"qemu 128k write QD8", "MB/s", true, qemu(requests(10000), "-d", "8", "-s", "131072", "-w")},
		{"iscsi-perf 4k random QD32", "IOPS", true, iscsiPerf(dur, "-m", "32", "-b", "8", "-r")},
		{"blockwire bench 4k randread QD1", "IOPS", true, bwBench(bin, dur, "randread", "4k", "1", "IOPS")},
		{"blockwire bench 4k randread QD1 p99", "usec", false, bwBench(bin, dur, "randread", "4k", "1", "p99")},
		{"blockwire bench 4k randread QD32", "IOPS", true, bwBench(bin, dur, "randread", "4k", "32", "IOPS")},
		{"blockwire bench 4k randwrite QD32", "IOPS", true, bwBench(bin, dur, "randwrite", "4k", "32", "IOPS")},
		{"blockwire bench 128k read QD8", "MB/s", true, bwBench(bin, dur, "read", "128k", "8", "MB/s")},
		{"blockwire bench 128k write QD8", "MB/s", true, bwBench(bin, dur, "write", "128k", "8", "MB/s")},
	}
	if *iserOnly {
		transports(bin, bw, dur)
		return
	}
	tgt, stopTgt := startTgt(dir)
	defer stopTgt()
	results := rounds2(ws, tgt, bw)
	ceiling := iperf(dur)
	bwBase, idleRSS, busyRSS := memory(bw, dur)
	tgtBase, tgtIdle, tgtBusy := memory(tgt, dur)

	host, _ := os.Hostname()
	fmt.Printf("\nblockwire vs tgt, %s, %s, %d cores, GOMAXPROCS %d, %d rounds (median [min-max])\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), host, runtime.NumCPU(), runtime.GOMAXPROCS(0), *rounds)
	fmt.Printf("| %-38s | %-5s | %-26s | %-26s | %-6s |\n", "workload", "unit", "tgt", "blockwire", "ratio")
	fmt.Printf("|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 40), strings.Repeat("-", 7), strings.Repeat("-", 28), strings.Repeat("-", 28), strings.Repeat("-", 8))
	for _, w := range ws {
		a, b := results[w.name]["tgt"], results[w.name]["blockwire"]
		ratio := "n/a"
		if len(a) > 0 && len(b) > 0 && median(a) > 0 && median(b) > 0 {
			rv := median(b) / median(a)
			if !w.higher {
				rv = median(a) / median(b)
			}
			ratio = fmt.Sprintf("%.2fx", rv)
		}
		fmt.Printf("| %-38s | %-5s | %-26s | %-26s | %-6s |\n", w.name, w.unit, stat(a), stat(b), ratio)
	}
	fmt.Printf("\nratio: blockwire/tgt for throughput, tgt/blockwire for latency (above 1 = blockwire better)\n")
	fmt.Printf("loopback TCP ceiling (iperf3, one stream): %.0f MB/s\n", ceiling)
	fmt.Printf("target RSS before the sessions: tgt %.1f MiB, blockwire %.1f MiB (blockwire's memory LUN holds the data written above; tgt's is in /dev/shm)\n", tgtBase, bwBase)
	fmt.Printf("added by 64 idle sessions: tgt %+.1f MiB, blockwire %+.1f MiB\n", tgtIdle-tgtBase, idleRSS-bwBase)
	fmt.Printf("added at peak by 16 sessions x QD32 4k random read: tgt %+.1f MiB, blockwire %+.1f MiB\n", tgtBusy-tgtBase, busyRSS-bwBase)
	writeComparison("vs-tgt", "blockwire vs tgt, loopback, unpinned", ws, results, []string{"tgt", "blockwire"})
	sweep("vs-tgt-sweep", "blockwire vs tgt, loopback, unpinned", nil, bin, dur, []target{tgt, bw}, nil)
	transports(bin, bw, dur)
}

// transports compares blockwire's own transports against one daemon in
// one run: iSCSI/TCP, iSER over the software iWARP device in the
// connection-first (Linux) profile, and SRP over the same device —
// rotating as above. (tgt's iSER needs kernel RDMA verbs, which these
// machines do not have.)
func transports(bin string, bw target, dur time.Duration) {
	tcp := target{name: "tcp", url: bw.url}
	iser := target{name: "iser", url: strings.Replace(bw.url, "iscsi://", "iser://", 1)}
	srp := target{name: "srp", url: bw.srp}
	ws := ourWorkloads(bin, dur)
	threeWay("iSER and SRP (software iWARP) vs iSCSI/TCP", ws, roundsN(ws, tcp, iser, srp),
		[3]string{"tcp", "iser", "srp"}, [5]string{"iSCSI/TCP", "iSER", "SRP", "iSER/TCP", "SRP/TCP"},
		"the RDMA transport over iSCSI/TCP (above 1 = faster than TCP)")
}

// gateway measures what the gateway hop costs: blockwire bench
// against tgt directly, and against blockwire serving tgt's LUN through
// its initiator, over iSCSI/TCP and iSER, rotating as above.
func gateway(bin, dir string) {
	dur := runTime()
	tgt, stopTgt := startTgt(dir)
	defer stopTgt()
	gwTCP, stopGw := serve(nil, bin, "gw-tcp", "--remote", tgt.url)
	defer stopGw()
	gwISER := target{name: "gw-iser", url: strings.Replace(gwTCP.url, "iscsi://", "iser://", 1)}
	ws := ourWorkloads(bin, dur)
	threeWay("tgt directly vs through the blockwire gateway", ws, roundsN(ws, tgt, gwTCP, gwISER),
		[3]string{"tgt", "gw-tcp", "gw-iser"}, [5]string{"tgt", "gateway iSCSI/TCP", "gateway iSER", "gw-tcp/tgt", "gw-iser/tgt"},
		"through the gateway over tgt directly (the hop's cost; 1 = free)")
}

// ourWorkloads are the blockwire bench runs of the three-way comparisons.
func ourWorkloads(bin string, dur time.Duration) []workload {
	return []workload{
		{"4k randread QD1", "IOPS", true, bwBench(bin, dur, "randread", "4k", "1", "IOPS")},
		{"4k randread QD32", "IOPS", true, bwBench(bin, dur, "randread", "4k", "32", "IOPS")},
		{"4k randwrite QD32", "IOPS", true, bwBench(bin, dur, "randwrite", "4k", "32", "IOPS")},
		{"128k read QD8", "MB/s", true, bwBench(bin, dur, "read", "128k", "8", "MB/s")},
		{"128k write QD8", "MB/s", true, bwBench(bin, dur, "write", "128k", "8", "MB/s")},
	}
}

// threeWay prints one table: the three targets' medians and spreads and
// the second's and third's ratios to the first.
func threeWay(title string, ws []workload, results map[string]map[string][]float64, names [3]string, heads [5]string, note string) {
	host, _ := os.Hostname()
	fmt.Printf("\nblockwire bench, %s, %s, %s, %d cores, %d rounds (median [min-max])\n\n",
		title, time.Now().UTC().Format("2006-01-02 15:04 MST"), host, runtime.NumCPU(), *rounds)
	row := "| %-20s | %-5s | %-22s | %-22s | %-22s | %-11s | %-11s |\n"
	fmt.Printf(row, "workload", "unit", heads[0], heads[1], heads[2], heads[3], heads[4])
	fmt.Printf("|%s|%s|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 22), strings.Repeat("-", 7), strings.Repeat("-", 24),
		strings.Repeat("-", 24), strings.Repeat("-", 24), strings.Repeat("-", 13), strings.Repeat("-", 13))
	ratio := func(a, b []float64) string {
		if len(a) > 0 && len(b) > 0 && median(a) > 0 {
			return fmt.Sprintf("%.2fx", median(b)/median(a))
		}
		return "n/a"
	}
	for _, w := range ws {
		a, b, c := results[w.name][names[0]], results[w.name][names[1]], results[w.name][names[2]]
		fmt.Printf(row, w.name, w.unit, stat(a), stat(b), stat(c), ratio(a, b), ratio(a, c))
	}
	fmt.Printf("\nratios: %s\n", note)
}

func median(v []float64) float64 { return benchplot.Median(v) }

// requests is a qemu-img request count: full, a fifth with -quick.
func requests(full int) string {
	if *quick {
		full /= 5
	}
	return strconv.Itoa(full)
}

func stat(v []float64) string {
	if len(v) == 0 {
		return "failed"
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return fmt.Sprintf("%.0f [%.0f-%.0f]", median(s), s[0], s[len(s)-1])
}

func freePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func waitPort(addr string) {
	for i := 0; i < 200; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	log.Fatalf("bench: nothing listens on %s", addr)
}

func startTgt(dir string) (target, func()) {
	backing := filepath.Join("/dev/shm", fmt.Sprintf("blockwire-bench-%d.img", os.Getpid()))
	os.WriteFile(backing, nil, 0o600)
	os.Truncate(backing, 1<<30)
	t, stop := startTgtLUN("iqn.2026-11.org.blockwire:bench-tgt", nil, "-b", backing)
	return t, func() {
		stop()
		os.Remove(backing)
	}
}

// startTgtLUN starts tgtd on a free loopback port with one target whose
// LUN 1 tgtadm makes from lunArgs, with env added to tgtd's environment.
func startTgtLUN(iqn string, env []string, lunArgs ...string) (target, func()) {
	addr := freePort()
	ctl := strconv.Itoa(2000 + os.Getpid()%1000)
	cmd := exec.Command("tgtd", "-f", "-C", ctl, "--iscsi", "portal="+addr)
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	adm := func(args ...string) {
		var err error
		var out []byte
		for try := 0; try < 100; try++ {
			if out, err = exec.Command("tgtadm", append([]string{"-C", ctl, "--lld", "iscsi"}, args...)...).CombinedOutput(); err == nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		log.Fatalf("tgtadm %v: %v %s", args, err, out)
	}
	adm("--op", "new", "--mode", "target", "--tid", "1", "-T", iqn)
	adm(append([]string{"--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", "1"}, lunArgs...)...)
	adm("--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL")
	waitPort(addr)
	return target{name: "tgt", url: "iscsi://" + addr + "/" + iqn + "/1", pid: cmd.Process.Pid}, func() {
		cmd.Process.Kill()
		cmd.Wait()
	}
}

func startBlockwire(bin string) (target, func()) {
	srpAddr := freePort()
	t, stop := serve(nil, bin, "blockwire", "--size", "1GiB", "--srp-listen", srpAddr, "--srp-id-ext", benchSRPID)
	t.srp = "srp://" + srpAddr + "/" + benchSRPID + "/0"
	return t, stop
}

// serve starts blockwire serve (behind prefix, such as taskset's
// arguments) on a free loopback port, with LUN 0 as args say.
func serve(prefix []string, bin, name string, args ...string) (target, func()) {
	addr := freePort()
	argv := append(append(append([]string{}, prefix...), bin, "serve", "--listen", addr, "--log-level", "warn"), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	waitPort(addr)
	return target{name: name, url: "iscsi://" + addr + "/iqn.2026-11.org.blockwire:default/0", pid: cmd.Process.Pid}, func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	}
}

var qemuRE = regexp.MustCompile(`Run completed in ([0-9.]+) seconds`)

func qemu(count string, args ...string) func(target) (float64, error) {
	return qemuN(nil, 1, count, args...)
}

// qemuN runs procs qemu-img bench processes at once, behind prefix (the
// client CPUs' taskset), each with count requests starting at its own
// offset, and returns their summed IOPS, or MB/s above 4 KiB.
func qemuN(prefix []string, procs int, count string, args ...string) func(target) (float64, error) {
	size := 4096
	for i, a := range args {
		if a == "-s" {
			size, _ = strconv.Atoi(args[i+1])
		}
	}
	c, _ := strconv.Atoi(count)
	return func(t target) (float64, error) {
		var wg sync.WaitGroup
		vals := make([]float64, procs)
		errs := make([]error, procs)
		for p := range procs {
			wg.Go(func() {
				full := append(append(append([]string{}, prefix...), "qemu-img", "bench", "-f", "raw", "-c", count), args...)
				if procs > 1 {
					full = append(full, "-o", strconv.Itoa(p*256<<20))
				}
				out, err := exec.Command(full[0], append(full[1:], t.url)...).CombinedOutput()
				if err != nil {
					errs[p] = fmt.Errorf("%v: %s", err, out)
					return
				}
				m := qemuRE.FindSubmatch(out)
				if m == nil {
					errs[p] = fmt.Errorf("no result in %q", out)
					return
				}
				secs, _ := strconv.ParseFloat(string(m[1]), 64)
				vals[p] = float64(c) / secs
				if size > 4096 {
					vals[p] *= float64(size) / 1e6
				}
			})
		}
		wg.Wait()
		sum := 0.0
		for p := range procs {
			if errs[p] != nil {
				return 0, errs[p]
			}
			sum += vals[p]
		}
		return sum, nil
	}
}

var perfRE = regexp.MustCompile(`iops average (\d+)`)

func iscsiPerf(d time.Duration, args ...string) func(target) (float64, error) {
	return func(t target) (float64, error) {
		full := append([]string{"-t", strconv.Itoa(int(d.Seconds()))}, args...)
		out, err := exec.Command("iscsi-perf", append(full, t.url)...).CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("%v: %s", err, out)
		}
		m := perfRE.FindAllSubmatch(out, -1)
		if m == nil {
			return 0, fmt.Errorf("no result in %q", out)
		}
		v, _ := strconv.ParseFloat(string(m[len(m)-1][1]), 64)
		return v, nil
	}
}

var (
	iopsRE = regexp.MustCompile(`IOPS=([0-9.]+), BW=[0-9.]+MiB/s \(([0-9.]+)MB/s\)`)
	p99RE  = regexp.MustCompile(`p99=([0-9.]+)`)
)

func bwBench(bin string, d time.Duration, rw, bs, qd, what string) func(target) (float64, error) {
	return bwBenchOn(nil, bin, d, rw, bs, qd, what)
}

// bwBenchOn is bwBench behind prefix (the client CPUs' taskset).
func bwBenchOn(prefix []string, bin string, d time.Duration, rw, bs, qd, what string) func(target) (float64, error) {
	return func(t target) (float64, error) {
		argv := benchArgv(prefix, bin, d, rw, bs, qd, t)
		out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("%v: %s", err, out)
		}
		switch what {
		case "p99":
			m := p99RE.FindSubmatch(out)
			if m == nil {
				return 0, fmt.Errorf("no p99 in %q", out)
			}
			return strconv.ParseFloat(string(m[1]), 64)
		default:
			m := iopsRE.FindSubmatch(out)
			if m == nil {
				return 0, fmt.Errorf("no result in %q", out)
			}
			if what == "MB/s" {
				return strconv.ParseFloat(string(m[2]), 64)
			}
			return strconv.ParseFloat(string(m[1]), 64)
		}
	}
}

// benchArgv is blockwire bench's command line for one run against t,
// behind prefix (the client CPUs' taskset), with flags (such as --json)
// before t's own.
func benchArgv(prefix []string, bin string, d time.Duration, rw, bs, qd string, t target, flags ...string) []string {
	argv := append(append([]string{}, prefix...), bin, "bench", "--rw", rw, "--bs", bs, "--qd", qd, "--time", d.String())
	if strings.HasSuffix(rw, "write") {
		argv = append(argv, "--overwrite") // the benchmark's own scratch LUN
	}
	argv = append(append(argv, flags...), t.args...)
	return append(argv, t.url)
}

// runTime is how long each run lasts: 5 s, 1 s with -quick.
func runTime() time.Duration {
	if *quick {
		return time.Second
	}
	return 5 * time.Second
}

func iperf(d time.Duration) float64 {
	port := strings.Split(freePort(), ":")[1]
	srv := exec.Command("iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", port)
	if err := srv.Start(); err != nil {
		return 0
	}
	defer srv.Wait()
	time.Sleep(300 * time.Millisecond)
	out, err := exec.Command("iperf3", "-c", "127.0.0.1", "-p", port, "-t", strconv.Itoa(int(d.Seconds())), "-J").Output()
	if err != nil {
		srv.Process.Kill()
		return 0
	}
	var r struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	json.Unmarshal(out, &r)
	return r.End.SumReceived.BitsPerSecond / 8 / 1e6
}

func rss(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// memory reports a target's RSS with 64 idle sessions, then its peak RSS
// with 16 sessions each running 32 concurrent 4 KiB random reads.
func memory(t target, d time.Duration) (base, idle, busy float64) {
	ctx := context.Background()
	base = rss(t.pid)
	var devs []*initiator.Device
	for i := 0; i < 64; i++ {
		dev, err := initiator.Open(ctx, t.url, initiator.Options{Dialer: &fabric.Dialer{}, InitiatorName: fmt.Sprintf("iqn.2026-11.org.blockwire:bench-%d", i)})
		if err != nil {
			log.Printf("bench: session %d to %s: %v", i, t.name, err)
			break
		}
		devs = append(devs, dev)
	}
	time.Sleep(500 * time.Millisecond)
	idle = rss(t.pid)
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for _, dev := range devs[:min(16, len(devs))] {
		for q := 0; q < 32; q++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 4096)
				blocks := dev.Size() / 4096
				for time.Now().Before(stop) {
					if _, err := dev.ReadAt(buf, rand.Int64N(blocks)*4096); err != nil {
						return
					}
				}
			}()
		}
	}
	for time.Now().Before(stop) {
		busy = max(busy, rss(t.pid))
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	for _, dev := range devs {
		dev.Close()
	}
	return base, idle, busy
}

// rounds2 runs every workload against a and b, alternating A B / B A over
// the rounds, and returns the results by workload and target name.
func rounds2(ws []workload, a, b target) map[string]map[string][]float64 {
	return roundsN(ws, a, b)
}

// rotated is round r's order of ts: each round starts one further on,
// so no target always goes first.
func rotated(ts []target, r int) []target {
	return append(append([]target(nil), ts[r%len(ts):]...), ts[:r%len(ts)]...)
}

// roundsN runs every workload on every target, the order rotating each
// round so no target always goes first.
func roundsN(ws []workload, ts ...target) map[string]map[string][]float64 {
	results := map[string]map[string][]float64{}
	for r := 0; r < *rounds; r++ {
		order := rotated(ts, r)
		for _, w := range ws {
			for _, t := range order {
				v, err := w.run(t)
				if err != nil {
					log.Printf("bench: %s on %s: %v", w.name, t.name, err)
					continue
				}
				if results[w.name] == nil {
					results[w.name] = map[string][]float64{}
				}
				results[w.name][t.name] = append(results[w.name][t.name], v)
				fmt.Fprintf(os.Stderr, "round %d  %-38s %-9s %12.1f %s\n", r+1, w.name, t.name, v, w.unit)
			}
		}
	}
	return results
}
