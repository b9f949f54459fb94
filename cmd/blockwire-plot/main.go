// Command blockwire-plot draws a run of blockwire bench as SVG: the
// latency distribution and the I/Os per second over the run — or what the
// bench harness wrote into docs/bench: a side by side comparison (bars
// relative to its first target), or a queue-depth sweep (IOPS against
// queue depth, and latency distributions, per target).
//
//	blockwire bench --json iscsi://HOST/IQN/0 > run.json
//	blockwire-plot -o run.svg run.json
//	blockwire-plot -o spdk.svg docs/bench/spdk-pinned.json
//	blockwire-plot -o sweep.svg docs/bench/spdk-pinned-sweep.json
//
// It reads bench's --json output (docs/json.md) from the file named, or
// from standard input. A tool of its own, so blockwire itself carries no
// plotting library.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/blockwire/blockwire/internal/benchplot"
)

func main() {
	out := flag.String("o", "bench.svg", "the SVG file to write")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: blockwire-plot [-o FILE.svg] [BENCH.json]   (blockwire bench --json output; standard input without a file)")
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := run(*out, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "blockwire-plot:", err)
		os.Exit(1)
	}
}

func run(out string, args []string) error {
	var in io.Reader = os.Stdin
	switch len(args) {
	case 0:
	case 1:
		f, err := os.Open(args[0])
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	default:
		return fmt.Errorf("one bench result at a time, not %d", len(args))
	}
	b, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	// What kind of result: a sweep has depths, a comparison targets
	// (and no depths), a run neither.
	var kind struct {
		Targets []string `json:"targets"`
		Depths  []int    `json:"depths"`
	}
	json.Unmarshal(b, &kind)
	var draw func(io.Writer) error
	if kind.Depths != nil {
		s, err := benchplot.DecodeSweep(bytes.NewReader(b))
		if err != nil {
			return err
		}
		draw = func(w io.Writer) error { return benchplot.DrawSweep(w, s) }
	} else if kind.Targets != nil {
		c, err := benchplot.DecodeComparison(bytes.NewReader(b))
		if err != nil {
			return err
		}
		draw = func(w io.Writer) error { return benchplot.DrawComparison(w, c) }
	} else {
		r, err := benchplot.Decode(bytes.NewReader(b))
		if err != nil {
			return err
		}
		draw = func(w io.Writer) error { return benchplot.Draw(w, r) }
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if err := draw(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
