package main

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/blockwire/blockwire/internal/benchplot"
)

// sweepDepths are the queue depths of a sweep.
var sweepDepths = []int{1, 2, 4, 8, 16, 32, 64}

// sweep runs 4 KiB random reads at each of sweepDepths against each
// target, with blockwire bench --json as the one initiator (behind
// prefix, the clients' taskset), rotating the targets' order each round;
// around, when set, brings a target up for its run (SPDK, which polls)
// and returns how to stop it. It prints IOPS against depth and writes the
// sweep (benchplot.Sweep: every round's IOPS, the median round's latency
// distribution) into -out as NAME.json and NAME.svg.
func sweep(name, title string, prefix []string, bin string, dur time.Duration, ts []target, around func(target) (func(), error)) {
	s := benchplot.Sweep{Title: title, Workload: "4k randread", Depths: sweepDepths,
		IOPS: map[string][][]float64{}, Latency: map[string][][]benchplot.Point{}}
	runs := map[string][][]benchplot.Result{}
	for _, t := range ts {
		s.Targets = append(s.Targets, t.name)
		s.IOPS[t.name] = make([][]float64, len(sweepDepths))
		runs[t.name] = make([][]benchplot.Result, len(sweepDepths))
	}
	for r := 0; r < *rounds; r++ {
		order := rotated(ts, r)
		for di, d := range sweepDepths {
			for _, t := range order {
				stop := func() {}
				if around != nil {
					var err error
					if stop, err = around(t); err != nil {
						log.Printf("bench: sweep QD %d on %s: %v", d, t.name, err)
						continue
					}
				}
				res, err := bwBenchJSON(prefix, bin, dur, d, t)
				stop()
				if err != nil {
					log.Printf("bench: sweep QD %d on %s: %v", d, t.name, err)
					continue
				}
				s.IOPS[t.name][di] = append(s.IOPS[t.name][di], res.IOPS)
				runs[t.name][di] = append(runs[t.name][di], res)
				fmt.Fprintf(os.Stderr, "round %d  sweep 4k randread QD%-3d %-9s %12.1f IOPS\n", r+1, d, t.name, res.IOPS)
			}
		}
	}
	fmt.Printf("\n%s: 4k random read IOPS against queue depth (blockwire bench as the initiator; median [min-max] of %d rounds)\n\n", title, *rounds)
	fmt.Printf("| QD |")
	for _, t := range ts {
		fmt.Printf(" %s |", t.name)
	}
	fmt.Printf("\n|---|")
	for range ts {
		fmt.Printf("---|")
	}
	fmt.Println()
	for di, d := range sweepDepths {
		fmt.Printf("| %d |", d)
		for _, t := range ts {
			fmt.Printf(" %s |", stat(s.IOPS[t.name][di]))
		}
		fmt.Println()
	}
	for _, t := range ts {
		s.Latency[t.name] = make([][]benchplot.Point, len(sweepDepths))
		for di := range sweepDepths {
			if m := benchplot.MedianRound(s.IOPS[t.name][di]); m >= 0 {
				s.Latency[t.name][di] = runs[t.name][di][m].Latency
			}
		}
	}
	writeChart(name, s, false, func(w io.Writer) error { return benchplot.DrawSweep(w, s) })
}

// bwBenchJSON runs blockwire bench --json, 4 KiB random reads at depth
// qd, against t.
func bwBenchJSON(prefix []string, bin string, d time.Duration, qd int, t target) (benchplot.Result, error) {
	argv := benchArgv(prefix, bin, d, "randread", "4k", strconv.Itoa(qd), t, "--json")
	var out, errb bytes.Buffer
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return benchplot.Result{}, fmt.Errorf("%v: %s", err, errb.Bytes())
	}
	return benchplot.Decode(&out)
}
