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
	"sync"
	"time"
)

// spdkBench compares the targets per target core: SPDK's
// iscsi_tgt, blockwire and tgt, each serving a 1 GiB RAM LUN, each pinned
// to core 1 with its clients on core 0 (-pin=false: both unpinned), the
// same clients against each, rotating over the rounds. Clients are
// several qemu-img processes at once (one is itself a limit at QD 32)
// and blockwire's initiator for the QD 1 latency percentiles. For each
// run it reads the target's CPU time, so the table also gives the
// target's CPU per I/O — except SPDK's, which polls (its core is busy
// whether or not I/O flows).
//
// SPDK comes from ${SPDK_HOME:-$HOME/spdk}: src/ the tree built by
// anchor/build-spdk.sh, anchor/ the scripts of ../shared/anchors/spdk.
func spdkBench(bin string, pin bool) {
	home, built := spdkHome()
	if !built {
		log.Fatal(spdkHowTo(home))
	}
	for _, tool := range []string{"tgtd", "tgtadm", "qemu-img", "taskset"} {
		if _, err := exec.LookPath(tool); err != nil {
			log.Fatalf("bench: %s not found (apt-get install tgt qemu-utils qemu-block-extra util-linux)", tool)
		}
	}
	if runtime.NumCPU() < 2 && pin {
		log.Fatal("bench: pinning needs two cores (run with -pin=false)")
	}
	targetCPU, clientCPU := []string{"taskset", "-c", "1"}, []string{"taskset", "-c", "0"}
	if !pin {
		targetCPU, clientCPU = nil, nil
	}
	dur := runTime()

	// SPDK: its own scripts (core 1 unless pin is off; then every core).
	// It polls, keeping its core busy even idle, so it runs only while
	// it is measured: started before each of its runs, stopped after.
	port := strings.Split(freePort(), ":")[1]
	mask := "0x2"
	if !pin {
		mask = fmt.Sprintf("0x%x", 1<<runtime.NumCPU()-1)
	}
	spdkUp := func() (int, error) { return spdkStart(home, port, "1024", mask) }
	spdkDown := func() { spdkStop(home, port) }
	defer spdkDown()
	spdk := target{name: "spdk", url: "iscsi://127.0.0.1:" + port + "/iqn.2016-06.io.spdk:anchor/0"}

	bwt, stopBw := serve(targetCPU, bin, "blockwire", "--size", "1GiB")
	defer stopBw()
	// The same, its connections' readers polling up to 1 ms before they
	// sleep (--poll: as long as the initiator takes to send again, within
	// that): measured both ways.
	bwp, stopBwp := serve(targetCPU, bin, "blockwire-poll", "--size", "1GiB", "--poll", "1ms")
	defer stopBwp()

	dir, _ := os.MkdirTemp("", "blockwire-bench-spdk")
	defer os.RemoveAll(dir)
	tgt, stopTgt := startTgt(dir)
	defer stopTgt()
	if pin {
		// tgtd with its threads onto core 1.
		exec.Command("taskset", "-a", "-p", "-c", "1", strconv.Itoa(tgt.pid)).Run()
	}

	const scatter = "1040384"
	ws := []workload{
		{"4k randread QD1", "IOPS", true, qemuN(clientCPU, 1, requests(20000), "-d", "1", "-s", "4096", "-S", scatter)},
		{"4k randread QD32", "IOPS", true, qemuN(clientCPU, 2, requests(100000), "-d", "16", "-s", "4096", "-S", scatter)},
		{"4k randwrite QD32", "IOPS", true, qemuN(clientCPU, 2, requests(100000), "-d", "16", "-s", "4096", "-S", scatter, "-w")},
		{"128k read QD8", "MB/s", true, qemuN(clientCPU, 2, requests(10000), "-d", "4", "-s", "131072")},
		{"128k write QD8", "MB/s", true, qemuN(clientCPU, 2, requests(10000), "-d", "4", "-s", "131072", "-w")},
		{"4k randread QD1 p99", "usec", false, bwBenchOn(clientCPU, bin, dur, "randread", "4k", "1", "p99")},
	}
	cpu := perIOCPU(ws, "spdk", func() error { _, err := spdkUp(); return err }, spdkDown)
	ts := []target{spdk, bwt, bwp, tgt}
	results := roundsN(ws, ts...)

	host, _ := os.Hostname()
	how := "each target pinned to core 1, clients on core 0"
	if !pin {
		how = "unpinned (SPDK polls on every core)"
	}
	fmt.Printf("\nper target core: SPDK iscsi_tgt vs blockwire vs tgt, 1 GiB RAM LUNs, %s, %s, %s, %d cores, %d rounds (median [min-max]); qemu-img bench (2 processes for QD 32 and 128k), blockwire bench for p99\n\n",
		how, time.Now().UTC().Format("2006-01-02 15:04 MST"), host, runtime.NumCPU(), *rounds)
	fmt.Println("| workload | unit | SPDK | blockwire | blockwire, polling | tgt | blockwire/SPDK | polling/SPDK | blockwire/tgt | target CPU µs per I/O: blockwire | polling | tgt |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, w := range ws {
		s, b, bp, g := results[w.name]["spdk"], results[w.name]["blockwire"], results[w.name]["blockwire-poll"], results[w.name]["tgt"]
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
		fmt.Printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", w.name, w.unit, stat(s), stat(b), stat(bp), stat(g),
			ratio(s, b), ratio(s, bp), ratio(g, b), c("blockwire"), c("blockwire-poll"), c("tgt"))
	}
	fmt.Printf("\nratios above 1: blockwire better (for p99, the inverse of the latencies). \"polling\": blockwire serve --poll 1ms (adaptive, up to 1 ms). SPDK polls: its core is 100 %% busy even idle, so its CPU per I/O is not shown. CPU per I/O is the target's user+system time over the run divided by the I/Os (MB/s rows: 128 KiB I/Os).\n")
	name := "spdk-pinned"
	if !pin {
		name = "spdk-unpinned"
	}
	writeComparison(name, "per target core: "+how, ws, results, []string{"spdk", "blockwire", "blockwire-poll", "tgt"})
	sweep(name+"-sweep", "per target core: "+how, clientCPU, bin, dur, ts, func(t target) (func(), error) {
		if t.name != "spdk" {
			return func() {}, nil
		}
		_, err := spdkUp()
		return spdkDown, err
	})
	if pid, err := spdkUp(); err == nil {
		time.Sleep(time.Second)
		c0, b0, p0, g0 := cpuTime(pid), cpuTime(bwt.pid), cpuTime(bwp.pid), cpuTime(tgt.pid)
		time.Sleep(2 * time.Second)
		fmt.Printf("idle for 2 s, no session: SPDK used %.0f %% of a core, blockwire %.1f %%, blockwire polling %.1f %%, tgt %.1f %%\n",
			(cpuTime(pid)-c0)/2*100, (cpuTime(bwt.pid)-b0)/2*100, (cpuTime(bwp.pid)-p0)/2*100, (cpuTime(tgt.pid)-g0)/2*100)
		spdkDown()
	}
}

// spdkHome is where SPDK is (${SPDK_HOME:-$HOME/spdk}) and whether its
// iscsi_tgt is built there.
func spdkHome() (string, bool) {
	home := os.Getenv("SPDK_HOME")
	if home == "" {
		home = filepath.Join(os.Getenv("HOME"), "spdk")
	}
	_, err := os.Stat(filepath.Join(home, "src", "build", "bin", "iscsi_tgt"))
	return home, err == nil
}

// spdkHowTo says how to build SPDK into home.
func spdkHowTo(home string) string {
	return fmt.Sprintf(`bench: no SPDK iscsi_tgt under %s. Build it (about 6 minutes on 2 cores):
  mkdir -p %[1]s && cp -r ../shared/anchors/spdk %[1]s/anchor
  SPDK_GIT=<clone of spdk/spdk> ISAL_GIT=<clone of intel/isa-l> ISALC_GIT=<clone of intel/isa-l_crypto> \
    INSTALL_DEPS=1 %[1]s/anchor/build-spdk.sh
(../shared/anchors/spdk/README.md says what it does), or set SPDK_HOME to where it is built`, home)
}

// spdkOnFile runs SPDK's iscsi_tgt on one polling core (core 1) serving
// path through its AIO bdev (O_DIRECT, as SPDK opens it), and returns the
// LUN's target and a function that stops it: the anchor's script starts
// it (with a 1 MiB malloc LUN of its own), its rpc.py adds the bdev and
// a target node on the anchor's portal and initiator groups.
func spdkOnFile(home, port, path string) (target, func(), error) {
	stop := func() { spdkStop(home, port) }
	pid, err := spdkStart(home, port, "1", "0x2")
	if err != nil {
		return target{}, stop, err
	}
	rpc := func(args ...string) error {
		argv := append([]string{filepath.Join(home, "src", "scripts", "rpc.py"), "-s", filepath.Join(home, "run", "spdk-"+port+".sock"), "-t", "30"}, args...)
		if out, err := exec.Command("/usr/bin/python3", argv...).CombinedOutput(); err != nil {
			return fmt.Errorf("rpc.py %v: %v\n%s", args, err, out)
		}
		return nil
	}
	if err := rpc("bdev_aio_create", path, "Aio0", "512"); err != nil {
		stop()
		return target{}, stop, err
	}
	if err := rpc("iscsi_create_target_node", "file", "file_alias", "Aio0:0", "1:2", "64", "-d"); err != nil {
		stop()
		return target{}, stop, err
	}
	return target{name: "spdk-aio", url: "iscsi://127.0.0.1:" + port + "/iqn.2016-06.io.spdk:file/0", pid: pid}, stop, nil
}

// spdkStart starts SPDK's iscsi_tgt with the anchor's script on port,
// with a malloc LUN of sizeMiB, its reactors on the cores of mask, and
// returns its process ID.
func spdkStart(home, port, sizeMiB, mask string) (int, error) {
	up := filepath.Join(home, "anchor", "spdk-up.sh")
	cmd := exec.Command(up, port, sizeMiB)
	cmd.Env = append(os.Environ(), "SPDK_CPUMASK="+mask)
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("%s: %v\n%s", up, err, out)
	}
	b, _ := os.ReadFile(filepath.Join(home, "run", "spdk-"+port+".pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, nil
}

// spdkStop stops the iscsi_tgt spdkStart started on port.
func spdkStop(home, port string) {
	exec.Command(filepath.Join(home, "anchor", "spdk-down.sh"), port).Run()
}

var statRE = regexp.MustCompile(`\) \S+ (?:\S+ ){10}(\d+) (\d+)`)

// cpuTime is a process's user+system CPU time in seconds, its threads
// included (/proc/PID/stat utime and stime).
func cpuTime(pid int) float64 {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	m := statRE.FindSubmatch(b)
	if m == nil {
		return 0
	}
	u, _ := strconv.ParseFloat(string(m[1]), 64)
	s, _ := strconv.ParseFloat(string(m[2]), 64)
	return (u + s) / 100 // USER_HZ
}

// perIOCPU wraps each workload's run so that it starts the polling
// target named polling before the run and stops it after (it runs only
// while it is measured), and records every other target's CPU time per
// I/O (µs; 128 KiB I/Os on the MB/s rows): the map it returns, by
// workload and target, fills as the runs go.
func perIOCPU(ws []workload, polling string, up func() error, down func()) map[string]map[string][]float64 {
	cpu := map[string]map[string][]float64{}
	var mu sync.Mutex
	for i := range ws {
		w := ws[i]
		run := w.run
		ws[i].run = func(t target) (float64, error) {
			if t.name == polling {
				if err := up(); err != nil {
					return 0, err
				}
				defer down()
			}
			c0, start := cpuTime(t.pid), time.Now()
			v, err := run(t)
			c1, wall := cpuTime(t.pid), time.Since(start).Seconds()
			if err == nil && w.unit != "usec" && v > 0 && t.pid != 0 && t.name != polling {
				ops := v * wall
				if w.unit == "MB/s" {
					ops = v * 1e6 * wall / 131072
				}
				mu.Lock()
				if cpu[w.name] == nil {
					cpu[w.name] = map[string][]float64{}
				}
				cpu[w.name][t.name] = append(cpu[w.name][t.name], (c1-c0)/ops*1e6)
				mu.Unlock()
			}
			return v, err
		}
	}
	return cpu
}
