package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/blockwire/blockwire/internal/benchplot"
)

// fileBench compares blockwire's file LUN I/O paths with fio (io_uring
// engine) run directly on the same file, in one run: on a file in tmpfs
// (/dev/shm) and, as root with losetup, on a loop device over a file of
// the test directory's filesystem. blockwire is driven by its own
// initiator over iSCSI/TCP on loopback; fio has no network in its path,
// so its figure is the ceiling the file itself sets; blockwire on a memory
// LUN is the ceiling the iSCSI path sets. Where SPDK is built (spdkHome),
// its iscsi_tgt serves the same file through its AIO bdev, driven by the
// same initiator: what the fastest target reaches against the same goal.
func fileBench(bin string) {
	dur := runTime()
	if _, err := exec.LookPath("fio"); err != nil {
		log.Fatal("bench: fio not found (apt-get install fio)")
	}
	spdkDir, spdkBuilt := spdkHome()
	if !spdkBuilt {
		log.Printf("bench: no SPDK column in the file LUN tables: %s", spdkHowTo(spdkDir))
	}
	ws := []workload{
		{"4k randread QD32", "IOPS", true, nil},
		{"4k randwrite QD32", "IOPS", true, nil},
		{"4k randread QD1", "IOPS", true, nil},
		{"128k read QD8", "MB/s", true, nil},
		{"128k write QD8", "MB/s", true, nil},
	}
	args := map[string][4]string{ // blockwire bench and fio: rw, bs, qd, what
		"4k randread QD32":  {"randread", "4k", "32", "IOPS"},
		"4k randwrite QD32": {"randwrite", "4k", "32", "IOPS"},
		"4k randread QD1":   {"randread", "4k", "1", "IOPS"},
		"128k read QD8":     {"read", "128k", "8", "MB/s"},
		"128k write QD8":    {"write", "128k", "8", "MB/s"},
	}
	type place struct {
		name, path string
		direct     bool // O_DIRECT for blockwire's third target and fio
	}
	shm, err := os.MkdirTemp("/dev/shm", "blockwire-bench")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(shm)
	places := []place{{"tmpfs file", filepath.Join(shm, "lun.img"), false}}
	if loop, stop := loopDevice(); loop != "" {
		defer stop()
		places = append(places, place{"loop device", loop, true})
	}
	for _, pl := range places {
		if !strings.HasPrefix(pl.path, "/dev/loop") {
			// A written file, so reads hit data rather than holes.
			if out, err := exec.Command("fio", "--name=fill", "--filename="+pl.path, "--size=1g", "--rw=write", "--bs=1m", "--ioengine=psync").CombinedOutput(); err != nil {
				log.Fatalf("bench: filling %s: %v\n%s", pl.path, err, out)
			}
		}
		// Each blockwire path, and the fio run it is held against (the
		// same page cache use).
		type path struct {
			name, engine string
			direct       bool
			poll         bool // pinned to core 1 and polling, as SPDK runs
		}
		paths := []path{{name: "pread", engine: "pread"}, {name: "auto", engine: "auto"}, {name: "io_uring", engine: "io_uring"}}
		refs := []target{{name: "fio", url: pl.path}}
		if pl.direct {
			paths = append(paths, path{name: "direct", engine: "auto", direct: true},
				path{name: "direct-poll", engine: "auto", direct: true, poll: true})
			refs = append(refs, target{name: "fio-direct", url: pl.path})
		}
		var ts []target
		var stops []func()
		for _, p := range paths {
			extra := []string{"--file", pl.path, "--io-engine", p.engine}
			if p.direct {
				extra = append(extra, "--direct")
			}
			var prefix []string
			if p.poll {
				prefix = []string{"taskset", "-c", "1"}
				extra = append(extra, "--poll", "1ms")
			}
			t, stop := serve(prefix, bin, p.name, extra...)
			ts = append(ts, t)
			stops = append(stops, stop)
		}
		// The same iSCSI path on a memory LUN: what the network and
		// the initiator allow, whatever the storage.
		mem, stopMem := serve(nil, bin, "memory", "--size", "1GiB")
		stops = append(stops, stopMem)
		ts = append(ts, mem)
		// SPDK polls a core: it runs only while it is measured.
		spdkPort := strings.Split(freePort(), ":")[1]
		if spdkBuilt {
			ts = append(ts, target{name: "spdk-aio"})
		}
		ts = append(ts, refs...)
		for i := range ws {
			a := args[ws[i].name]
			bw := bwBench(bin, dur, a[0], a[1], a[2], a[3])
			ws[i].run = func(t target) (float64, error) {
				switch {
				case strings.HasPrefix(t.name, "fio"):
					return fio(t.url, dur, t.name == "fio-direct", a[0], a[1], a[2], a[3])
				case t.name == "spdk-aio":
					st, stop, err := spdkOnFile(spdkDir, spdkPort, pl.path)
					defer stop()
					if err != nil {
						return 0, err
					}
					return bw(st)
				}
				return bw(t)
			}
		}
		results := roundsN(ws, ts...)
		for _, stop := range stops {
			stop()
		}
		host, _ := os.Hostname()
		fmt.Printf("\nfile LUNs on a %s (%s), %s, %s, %d cores, %d rounds (median [min-max]); blockwire over iSCSI/TCP on loopback with its own initiator, fio (io_uring engine, one job) on the file itself\n\n",
			pl.name, pl.path, time.Now().UTC().Format("2006-01-02 15:04 MST"), host, runtime.NumCPU(), *rounds)
		heads := []string{"workload", "unit"}
		for _, t := range ts {
			heads = append(heads, t.name)
		}
		// Each path against its fio reference, then the memory LUN
		// against each reference: the ceiling the iSCSI path and the
		// initiator set for any storage behind them.
		var ratios [][2]string
		for _, p := range paths {
			ratios = append(ratios, [2]string{p.name, ref(p.direct)})
		}
		ratios = append(ratios, [2]string{"memory", ref(false)})
		if pl.direct {
			ratios = append(ratios, [2]string{"memory", ref(true)})
		}
		if spdkBuilt {
			// SPDK's AIO bdev opens the file O_DIRECT: held against fio's
			// direct run where there is one, and blockwire's nearest path
			// against it.
			ratios = append(ratios, [2]string{"spdk-aio", ref(pl.direct)})
			if pl.direct {
				ratios = append(ratios, [2]string{"direct", "spdk-aio"}, [2]string{"direct-poll", "spdk-aio"})
			} else {
				ratios = append(ratios, [2]string{"auto", "spdk-aio"})
			}
		}
		for _, r := range ratios {
			heads = append(heads, r[0]+"/"+r[1])
		}
		fmt.Println("| " + strings.Join(heads, " | ") + " |")
		fmt.Println(strings.Repeat("|---", len(heads)) + "|")
		for _, w := range ws {
			row := []string{w.name, w.unit}
			for _, t := range ts {
				row = append(row, stat(results[w.name][t.name]))
			}
			for _, r := range ratios {
				f := results[w.name][r[1]]
				x := "n/a"
				if v := results[w.name][r[0]]; len(v) > 0 && len(f) > 0 && median(f) > 0 {
					x = fmt.Sprintf("%.2fx", median(v)/median(f))
				}
				row = append(row, x)
			}
			fmt.Println("| " + strings.Join(row, " | ") + " |")
		}
		fmt.Println("\nmemory/fio: blockwire's memory LUN over the same iSCSI path against fio on the file, the most any file LUN behind that path can reach in this run (a path's goal, 0.9x of fio, is out of reach in a row where this is below 0.9x)")
		if spdkBuilt {
			fmt.Println("spdk-aio: SPDK's iscsi_tgt, one reactor polling core 1, serving the same file through its AIO bdev (O_DIRECT), driven by the same initiator — the fastest target in the field held to the same goal")
		}
		if pl.direct {
			fmt.Println("direct-poll: blockwire --direct --poll 1ms pinned to core 1, as SPDK runs (direct-poll/spdk-aio compares them per target core)")
		}
		names := []string{ref(false)}
		if pl.direct {
			names = append(names, ref(true))
		}
		for _, t := range ts {
			if !strings.HasPrefix(t.name, "fio") {
				names = append(names, t.name)
			}
		}
		writeComparison("file-"+strings.ReplaceAll(pl.name, " ", "-"), "file LUNs on a "+pl.name+": blockwire's paths over iSCSI/TCP against fio on the file", ws, results, names)
	}
}

// ref names the fio run a blockwire path is held against.
func ref(direct bool) string {
	if direct {
		return "fio-direct"
	}
	return "fio"
}

// fio runs fio's io_uring engine on path, one job at depth qd, and
// returns IOPS or MB/s.
func fio(path string, d time.Duration, direct bool, rw, bs, qd, what string) (float64, error) {
	dio := "0"
	if direct {
		dio = "1"
	}
	out, err := exec.Command("fio", "--name=b", "--filename="+path, "--ioengine=io_uring", "--rw="+rw, "--bs="+bs,
		"--iodepth="+qd, "--direct="+dio, "--size=1g", "--time_based", "--runtime="+fmt.Sprint(int(d.Seconds())),
		"--output-format=json").Output()
	if err != nil {
		return 0, fmt.Errorf("fio: %v: %s", err, out)
	}
	var r struct {
		Jobs []struct {
			Read, Write struct {
				IOPS float64 `json:"iops"`
				BW   float64 `json:"bw_bytes"`
			}
		}
	}
	if err := json.Unmarshal(out, &r); err != nil || len(r.Jobs) == 0 {
		return 0, fmt.Errorf("fio output: %v", err)
	}
	j := r.Jobs[0]
	iops, bw := j.Read.IOPS+j.Write.IOPS, j.Read.BW+j.Write.BW
	if what == "MB/s" {
		return bw / 1e6, nil
	}
	return iops, nil
}

// loopDevice attaches a 1 GiB file of the temporary directory's
// filesystem to a loop device (root and losetup needed; "" otherwise).
func loopDevice() (string, func()) {
	if os.Geteuid() != 0 {
		log.Print("bench: not root: no loop device run")
		return "", nil
	}
	f, err := os.CreateTemp("", "blockwire-bench-loop")
	if err != nil {
		return "", nil
	}
	name := f.Name()
	f.Close()
	if out, err := exec.Command("fio", "--name=fill", "--filename="+name, "--size=1g", "--rw=write", "--bs=1m", "--ioengine=psync").CombinedOutput(); err != nil {
		log.Printf("bench: filling %s: %v\n%s", name, err, out)
		os.Remove(name)
		return "", nil
	}
	out, err := exec.Command("losetup", "--find", "--show", "--direct-io=on", name).Output()
	if err != nil {
		log.Printf("bench: losetup: %v: no loop device run", err)
		os.Remove(name)
		return "", nil
	}
	dev := strings.TrimSpace(string(out))
	return dev, func() {
		exec.Command("losetup", "-d", dev).Run()
		os.Remove(name)
	}
}

// writeComparison writes one table's results into the -out directory as
// NAME.json (benchplot.Comparison) and NAME.svg (its chart), the first
// target the reference.
func writeComparison(name, title string, ws []workload, results map[string]map[string][]float64, targets []string) {
	c := benchplot.Comparison{Title: title, Targets: targets}
	for _, w := range ws {
		c.Rows = append(c.Rows, benchplot.Row{Name: w.name, Unit: w.unit, Higher: w.higher, Runs: results[w.name]})
	}
	writeChart(name, c, true, func(w io.Writer) error { return benchplot.DrawComparison(w, c) })
}

// writeChart writes v into the -out directory as NAME.json (indented, or
// on one line: a sweep's thousands of latency points) and, drawn, as
// NAME.svg (nothing without -out).
func writeChart(name string, v any, indent bool, draw func(io.Writer) error) {
	if *outDir == "" {
		return
	}
	if err := os.MkdirAll(*outDir, 0o755); err != nil {
		log.Printf("bench: %v", err)
		return
	}
	js, _ := json.Marshal(v)
	if indent {
		js, _ = json.MarshalIndent(v, "", "  ")
	}
	base := filepath.Join(*outDir, name)
	if err := os.WriteFile(base+".json", append(js, '\n'), 0o644); err != nil {
		log.Printf("bench: %v", err)
		return
	}
	var svg bytes.Buffer
	if err := draw(&svg); err != nil {
		log.Printf("bench: drawing %s: %v", name, err)
		return
	}
	if err := os.WriteFile(base+".svg", svg.Bytes(), 0o644); err != nil {
		log.Printf("bench: %v", err)
		return
	}
	fmt.Printf("\n(written: %s.json, %[1]s.svg)\n", base)
}
