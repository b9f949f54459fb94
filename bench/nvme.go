package main

import (
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// nvmeBench compares NVMe/TCP targets per target core: SPDK's nvmf_tgt
// and blockwire (default and polling), each serving a 1 GiB RAM
// namespace, pinned to core 1, driven by SPDK's spdk_nvme_perf on core 0
// — a client that polls its core and is never the limit — the same runs
// against each, rotating over the rounds. SPDK runs only while it is
// measured (it polls its core even idle). The target's CPU time per I/O
// is shown for blockwire, in the default mode and with --poll 1ms (its
// connections' readers polling, as SPDK's reactor polls).
func nvmeBench(bin string, pin bool) {
	home, built := spdkHome()
	if !built {
		log.Fatal(spdkHowTo(home))
	}
	perf := filepath.Join(home, "src", "build", "bin", "spdk_nvme_perf")
	if _, err := os.Stat(perf); err != nil {
		log.Fatalf("bench: %v (SPDK built without its host tools?)", err)
	}
	if runtime.NumCPU() < 2 && pin {
		log.Fatal("bench: pinning needs two cores (run with -pin=false)")
	}
	targetCPU, clientCPU := []string{"taskset", "-c", "1"}, []string{"taskset", "-c", "0"}
	mask, clientMask := "0x2", "0x1"
	if !pin {
		targetCPU, clientCPU = nil, nil
		mask = fmt.Sprintf("0x%x", 1<<runtime.NumCPU()-1)
	}
	dur := runTime()

	port := strings.Split(freePort(), ":")[1]
	spdkUp := func() (int, error) { return nvmfStart(home, port, "1024", mask) }
	spdkDown := func() { nvmfStop(home, port) }
	defer spdkDown()
	spdk := target{name: "spdk", url: "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:" + port + " subnqn:nqn.2016-06.io.spdk:anchor"}

	nvmeServe := func(name string, args ...string) (target, func()) {
		addr := freePort()
		t, stop := serve(targetCPU, bin, name, append([]string{"--size", "1GiB", "--nvme-listen", addr}, args...)...)
		waitPort(addr)
		host, p, _ := strings.Cut(addr, ":")
		t.url = "trtype:TCP adrfam:IPv4 traddr:" + host + " trsvcid:" + p + " subnqn:nqn.2026-11.io.blockwire:iqn.2026-11.org.blockwire:default"
		return t, stop
	}
	bwt, stopBw := nvmeServe("blockwire")
	defer stopBw()
	bwp, stopBwp := nvmeServe("blockwire-poll", "--poll", "1ms")
	defer stopBwp()

	secs := strconv.Itoa(max(int(dur/time.Second), 1))
	run := func(what string, args ...string) func(target) (float64, error) {
		return func(t target) (float64, error) {
			argv := append(append([]string{}, clientCPU...), perf, "-r", t.url, "-t", secs, "-c", clientMask, "--no-huge", "-s", "1024")
			return spdkPerf(home, what, append(argv, args...))
		}
	}
	ws := []workload{
		{"4k randread QD1", "IOPS", true, run("iops", "-q", "1", "-o", "4096", "-w", "randread")},
		{"4k randread QD1 mean", "usec", false, run("mean", "-q", "1", "-o", "4096", "-w", "randread")},
		{"4k randread QD32", "IOPS", true, run("iops", "-q", "32", "-o", "4096", "-w", "randread")},
		{"4k randwrite QD32", "IOPS", true, run("iops", "-q", "32", "-o", "4096", "-w", "randwrite")},
		{"128k read QD8", "MB/s", true, run("mbs", "-q", "8", "-o", "131072", "-w", "read")},
		{"128k write QD8", "MB/s", true, run("mbs", "-q", "8", "-o", "131072", "-w", "write")},
	}
	if *conns {
		// Connections sharing the target core (#57: the polling mode
		// never below the default mode with 1, 2, 4 and 16 of them).
		for _, n := range []string{"2", "4", "16"} {
			for _, qd := range []string{"1", "32"} {
				ws = append(ws, workload{"4k randread QD" + qd + " x" + n + " conns", "IOPS", true, run("iops", "-q", qd, "-P", n, "-o", "4096", "-w", "randread")})
			}
		}
	}
	cpu := perIOCPU(ws, "spdk", func() error { _, err := spdkUp(); return err }, spdkDown)
	results := roundsN(ws, spdk, bwt, bwp)

	host, _ := os.Hostname()
	how := "each target pinned to core 1, spdk_nvme_perf on core 0"
	if !pin {
		how = "unpinned (SPDK polls on every core)"
	}
	fmt.Printf("\nNVMe/TCP per target core: SPDK nvmf_tgt vs blockwire, 1 GiB RAM namespaces, %s, %s, %s, %d cores, %d rounds of %s (median [min-max])\n\n",
		how, time.Now().UTC().Format("2006-01-02 15:04 MST"), host, runtime.NumCPU(), *rounds, dur)
	fmt.Println("| workload | unit | SPDK | blockwire | blockwire, polling | blockwire/SPDK | polling/SPDK | polling/blockwire | target CPU µs per I/O: blockwire | polling |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for _, w := range ws {
		s, b, bp := results[w.name]["spdk"], results[w.name]["blockwire"], results[w.name]["blockwire-poll"]
		ratio := func(a, b []float64) string {
			if len(a) == 0 || len(b) == 0 || median(a) == 0 || median(b) == 0 {
				return "n/a"
			}
			if !w.higher {
				return fmt.Sprintf("%.2fx", median(a)/median(b))
			}
			return fmt.Sprintf("%.2fx", median(b)/median(a))
		}
		c := func(name string) string {
			if v := cpu[w.name][name]; len(v) > 0 {
				return fmt.Sprintf("%.1f", median(v))
			}
			return "-"
		}
		fmt.Printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", w.name, w.unit, stat(s), stat(b), stat(bp),
			ratio(s, b), ratio(s, bp), ratio(b, bp), c("blockwire"), c("blockwire-poll"))
	}
	fmt.Printf("\nratios above 1: blockwire better (for the mean latency, the inverse). \"polling\": blockwire serve --poll 1ms. SPDK polls: its core is 100 %% busy even idle, so its CPU per I/O is not shown.\n")
	name := "nvme-spdk-pinned"
	if !pin {
		name = "nvme-spdk-unpinned"
	}
	writeComparison(name, "NVMe/TCP per target core: "+how, ws, results, []string{"spdk", "blockwire", "blockwire-poll"})
}

// perfTotal is spdk_nvme_perf's Total line: IOPS, MiB/s, mean latency (µs).
var perfTotal = regexp.MustCompile(`(?m)^Total\s*:\s*([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)`)

// spdkPerf runs spdk_nvme_perf (argv) and returns what of its Total
// line: "iops", "mbs" (MB/s, from its MiB/s) or "mean" (µs).
func spdkPerf(home, what string, argv []string) (float64, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	src := filepath.Join(home, "src")
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(src, "build/lib")+":"+filepath.Join(src, "isa-l/.libs")+":"+filepath.Join(src, "isa-l-crypto/.libs"))
	out, err := cmd.CombinedOutput()
	m := perfTotal.FindSubmatch(out)
	if err != nil || m == nil {
		return 0, fmt.Errorf("spdk_nvme_perf %v: %v\n%s", argv, err, out)
	}
	col := map[string]int{"iops": 1, "mbs": 2, "mean": 3}[what]
	v, _ := strconv.ParseFloat(string(m[col]), 64)
	if what == "mbs" {
		v *= 1.048576
	}
	return v, nil
}

// nvmfStart starts SPDK's nvmf_tgt with the anchor's script on port, a
// malloc namespace of sizeMiB, its reactors on the cores of mask, and
// returns its process ID.
func nvmfStart(home, port, sizeMiB, mask string) (int, error) {
	up := filepath.Join(home, "anchor", "nvmf-up.sh")
	cmd := exec.Command(up, port, sizeMiB)
	cmd.Env = append(os.Environ(), "SPDK_CPUMASK="+mask)
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("%s: %v\n%s", up, err, out)
	}
	b, _ := os.ReadFile(filepath.Join(home, "run", "nvmf-"+port+".pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, nil
}

// nvmfStop stops the nvmf_tgt nvmfStart started on port.
func nvmfStop(home, port string) {
	exec.Command(filepath.Join(home, "anchor", "nvmf-down.sh"), port).Run()
}
