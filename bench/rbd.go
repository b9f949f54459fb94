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

// rbdBenchRE is rbd bench's summary: "elapsed: 2   ops: 65536   ops/sec: 31234.5   bytes/sec: 127.9 MiB/s".
var rbdBenchRE = regexp.MustCompile(`ops/sec:\s+([0-9.]+)\s+bytes/sec:\s+([0-9.]+)\s*([KMG]i)?B/s`)

// rbdBench compares blockwire's RBD LUN with tgt's rbd backing store
// (Debian's tgt-rbd) on one Ceph cluster, each on an image of its own of
// the same size, filled first so reads touch real objects; the same
// clients, alternating rounds. The cluster is BLOCKWIRE_CEPH_CONF's, or a
// throwaway one from test/ceph/up.sh.
func rbdBench(dir string) {
	for _, tool := range []string{"tgtd", "tgtadm", "qemu-img", "rbd", "ceph"} {
		if _, err := exec.LookPath(tool); err != nil {
			log.Fatalf("bench: %s not found (apt-get install tgt tgt-rbd qemu-utils qemu-block-extra ceph-mon ceph-osd ceph-common librbd-dev librados-dev)", tool)
		}
	}
	conf := os.Getenv("BLOCKWIRE_CEPH_CONF")
	if conf == "" {
		cd := filepath.Join(dir, "ceph")
		if out, err := exec.Command("test/ceph/up.sh", cd, "6991").CombinedOutput(); err != nil {
			log.Fatalf("bench: starting a Ceph cluster: %v\n%s", err, out)
		}
		defer exec.Command("test/ceph/down.sh", cd).Run()
		conf = filepath.Join(cd, "ceph.conf")
	}
	ceph := func(tool string, args ...string) string {
		out, err := exec.Command(tool, append([]string{"-c", conf}, args...)...).CombinedOutput()
		if err != nil {
			log.Fatalf("bench: %s %s: %v\n%s", tool, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if !strings.Contains(ceph("ceph", "osd", "pool", "ls"), "rbd\n") {
		ceph("ceph", "osd", "pool", "create", "rbd", "8")
		ceph("rbd", "pool", "init", "rbd")
	}
	const size = 1 << 30
	var images []string
	for _, n := range []string{"tgt", "bw"} {
		img := fmt.Sprintf("rbd/bench-%s-%d", n, os.Getpid())
		ceph("rbd", "create", "--size", strconv.Itoa(size>>20), img)
		defer exec.Command("rbd", "-c", conf, "rm", "--no-progress", img).Run()
		// Every object written, so reads go to the OSD.
		ceph("rbd", "bench", "--io-type", "write", "--io-size", "4M", "--io-pattern", "seq", "--io-total", strconv.Itoa(size), img)
		images = append(images, img)
	}

	bin := filepath.Join(dir, "blockwire-rbd")
	if out, err := exec.Command("go", "build", "-tags", "rbd", "-o", bin, "./cmd/blockwire").CombinedOutput(); err != nil {
		log.Fatalf("bench: building blockwire with -tags rbd: %v\n%s", err, out)
	}
	// tgt's librbd gets the same durability as ours: no write-back
	// cache (by default librbd turns it on after the first flush, and
	// then acknowledges writes the cluster does not have yet).
	b, err := os.ReadFile(conf)
	if err != nil {
		log.Fatal(err)
	}
	tgtConf := filepath.Join(dir, "ceph-tgt.conf")
	text := strings.Replace(string(b), "[client]\n", "[client]\nrbd cache = false\n", 1)
	if !strings.Contains(text, "rbd cache = false") {
		text += "\n[client]\nrbd cache = false\n"
	}
	if err := os.WriteFile(tgtConf, []byte(text), 0o644); err != nil {
		log.Fatal(err)
	}
	tgt, stopTgt := startTgtRBD(images[0], tgtConf)
	defer stopTgt()
	bw, stopBw := serve(nil, bin, "blockwire", "--iser=false", "--rbd", images[1], "--ceph-conf", conf)
	defer stopBw()

	dur := runTime()
	c4, c128 := "20000", "4000"
	if *quick {
		c4, c128 = "4000", "800"
	}
	const scatter = "1040384"
	ws := []workload{
		{"qemu 4k randread QD32", "IOPS", true, qemu(c4, "-d", "32", "-s", "4096", "-S", scatter)},
		{"qemu 4k randwrite QD32", "IOPS", true, qemu(c4, "-d", "32", "-s", "4096", "-S", scatter, "-w")},
		{"qemu 128k read QD8", "MB/s", true, qemu(c128, "-d", "8", "-s", "131072")},
		{"qemu 128k write QD8", "MB/s", true, qemu(c128, "-d", "8", "-s", "131072", "-w")},
		{"blockwire bench 4k randread QD32", "IOPS", true, bwBench(bin, dur, "randread", "4k", "32", "IOPS")},
		{"blockwire bench 4k randwrite QD32", "IOPS", true, bwBench(bin, dur, "randwrite", "4k", "32", "IOPS")},
		{"blockwire bench 128k read QD8", "MB/s", true, bwBench(bin, dur, "read", "128k", "8", "MB/s")},
		{"blockwire bench 128k write QD8", "MB/s", true, bwBench(bin, dur, "write", "128k", "8", "MB/s")},
	}
	results := rounds2(ws, tgt, bw)
	// The cluster's own ceiling: librbd driven directly by rbd bench, no
	// iSCSI at all, on the blockwire image.
	ceiling := func(typ, size, threads, pattern string) float64 {
		out := ceph("rbd", "bench", "--io-type", typ, "--io-size", size, "--io-threads", threads, "--io-total", "256M",
			"--io-pattern", pattern, images[1])
		m := rbdBenchRE.FindStringSubmatch(out)
		if m == nil {
			return 0
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		if size != "4K" {
			bps, _ := strconv.ParseFloat(m[2], 64)
			bps *= map[string]float64{"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}[m[3]]
			return bps / 1e6
		}
		return v
	}
	ceil := []float64{ceiling("read", "4K", "32", "rand"), ceiling("write", "4K", "32", "rand"),
		ceiling("read", "128K", "8", "seq"), ceiling("write", "128K", "8", "seq")}
	host, _ := os.Hostname()
	fmt.Printf("\nRBD LUNs: tgt (tgt-rbd) vs blockwire (backend/rbd), one Ceph cluster (1 memstore OSD), %s, %s, %d cores, %d rounds (median [min-max])\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), host, runtime.NumCPU(), *rounds)
	row := "| %-34s | %-5s | %-22s | %-22s | %-6s |\n"
	fmt.Printf(row, "workload", "unit", "tgt rbd", "blockwire rbd", "ratio")
	fmt.Printf("|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 36), strings.Repeat("-", 7), strings.Repeat("-", 24), strings.Repeat("-", 24), strings.Repeat("-", 8))
	for _, w := range ws {
		a, b := results[w.name]["tgt"], results[w.name]["blockwire"]
		ratio := "n/a"
		if len(a) > 0 && len(b) > 0 && median(a) > 0 {
			ratio = fmt.Sprintf("%.2fx", median(b)/median(a))
		}
		fmt.Printf(row, w.name, w.unit, stat(a), stat(b), ratio)
	}
	fmt.Printf("\nratio: blockwire/tgt (above 1 = blockwire faster); neither has librbd's write-back cache\n")
	fmt.Printf("the cluster without iSCSI (rbd bench, librbd directly): 4k randread QD32 %.0f IOPS, 4k randwrite QD32 %.0f IOPS, 128k read QD8 %.0f MB/s, 128k write QD8 %.0f MB/s\n",
		ceil[0], ceil[1], ceil[2], ceil[3])
}

// startTgtRBD starts tgtd with one LUN on an RBD image (bs_rbd).
func startTgtRBD(image, conf string) (target, func()) {
	return startTgtLUN("iqn.2026-11.org.blockwire:bench-tgt-rbd", []string{"CEPH_CONF=" + conf},
		"--bstype", "rbd", "--backing-store", image, "--bsopts", "conf="+conf)
}
