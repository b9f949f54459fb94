package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/blockwire/blockwire/admin"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/internal/benchplot"
	"github.com/blockwire/blockwire/node"
	"github.com/blockwire/blockwire/node/nodetest"
)

// decodeStrict decodes b into v refusing fields the documented shape
// (docs/json.md) lacks, and anything after the value.
func decodeStrict(t *testing.T, what string, b []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v\n%s", what, err, b)
	}
	if dec.More() {
		t.Fatalf("%s: more than one JSON value\n%s", what, b)
	}
}

// TestJSONOutputs: discover, inquiry, bench and admin sessions/luns with
// --json against a live node print their documented shapes (docs/json.md)
// with the values the node has; blockwire-plot draws the bench result as
// a valid SVG.
func TestJSONOutputs(t *testing.T) {
	const iqn = "iqn.2026-11.org.example:json"
	sock := filepath.Join(t.TempDir(), "admin.sock")
	iser := false
	cfg := &config.Config{Listen: []string{"127.0.0.1:0"}, AdminSocket: sock, ISER: &iser,
		Targets: []config.Target{{Name: iqn, LUNs: []config.LUN{{ID: 0, Size: "8MiB"}}}}}
	n := nodetest.Start(t, cfg, node.Options{})
	addr := nodetest.Portal(t, n, "iscsi")
	url := "iscsi://" + addr + "/" + iqn + "/0"
	cli := func(args ...string) []byte {
		t.Helper()
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != 0 {
			t.Fatalf("blockwire %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
		}
		return out.Bytes()
	}

	var ts []discovered
	decodeStrict(t, "discover", cli("discover", "--json", addr), &ts)
	if len(ts) != 1 || ts[0].Name != iqn || len(ts[0].Addresses) == 0 || !strings.Contains(ts[0].Addresses[0], ",1") {
		t.Errorf("discover --json: %+v", ts)
	}

	var in inquired
	decodeStrict(t, "inquiry", cli("inquiry", "--json", url), &in)
	if in.DeviceType != 0 || in.BlockSize != 512 || in.CapacityBytes != 8<<20 || in.CapacityBlocks != 8<<20/512 || in.Vendor == "" || in.Serial == "" {
		t.Errorf("inquiry --json: %+v", in)
	}

	var br benchResult
	benchOut := cli("bench", "--json", "--rw", "randwrite", "--verify", "--overwrite", "--qd", "2", "--time", "1200ms", "--size", "1MiB", url)
	decodeStrict(t, "bench", benchOut, &br)
	if br.RW != "randwrite" || br.BlockSize != 4096 || br.QueueDepth != 2 || br.IOs <= 0 || br.IOPS <= 0 || br.Seconds <= 0 ||
		br.LatencyUS.P50 <= 0 || br.LatencyUS.Max < br.LatencyUS.P99 || br.Mismatches == nil || *br.Mismatches != 0 {
		t.Errorf("bench --json: %+v", br)
	}
	var sum int64
	for _, n := range br.IOsBySecond {
		sum += n
	}
	if len(br.IOsBySecond) != int(math.Ceil(br.Seconds)) || len(br.IOsBySecond) < 2 || sum != br.IOs {
		t.Errorf("bench --json: ios_by_second %v over %.2fs, %d I/Os", br.IOsBySecond, br.Seconds, br.IOs)
	}
	if l := br.LatencyDistribution; len(l) != 104 || l[0].Percentile != 1 || l[len(l)-1].Percentile != 100 || l[len(l)-1].US != br.LatencyUS.Max {
		t.Errorf("bench --json: latency_distribution_us %+v", l)
	}
	// blockwire-plot's drawing of this very output is a valid SVG.
	res, err := benchplot.Decode(bytes.NewReader(benchOut))
	if err != nil {
		t.Fatal(err)
	}
	svgFile := filepath.Join(t.TempDir(), "bench.svg")
	f, err := os.Create(svgFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := benchplot.Draw(f, res); err != nil {
		t.Fatal(err)
	}
	f.Close()
	checkSVG(t, svgFile)
	var plain benchResult
	decodeStrict(t, "bench without --verify", cli("bench", "--json", "--qd", "1", "--time", "200ms", "--size", "1MiB", url), &plain)
	if plain.Mismatches != nil || plain.RW != "randread" {
		t.Errorf("bench --json without --verify: %+v", plain)
	}

	var ls []admin.LUN
	decodeStrict(t, "admin luns", cli("admin", "--socket", sock, "--json", "luns"), &ls)
	if len(ls) != 1 || ls[0].Target != iqn || ls[0].Size != 8<<20 || ls[0].BlockSize != 512 {
		t.Errorf("admin --json luns: %+v", ls)
	}
	var tr admin.Tree
	decodeStrict(t, "admin ls", cli("admin", "--socket", sock, "--json", "ls"), &tr)
	if len(tr.Targets) != 1 || tr.Targets[0].Name != iqn || !tr.Targets[0].Open || len(tr.Targets[0].LUNs) != 1 ||
		tr.Targets[0].LUNs[0].Size != 8<<20 || tr.Targets[0].LUNs[0].Backing != "memory" || tr.Targets[0].LUNs[0].Cache != "write-back" ||
		len(tr.Portals) == 0 || tr.Targets[0].Sessions == nil {
		t.Errorf("admin --json ls: %+v", tr)
	}
	var ss []admin.Session
	decodeStrict(t, "admin sessions", cli("admin", "--socket", sock, "--json", "sessions"), &ss)
	if ss == nil {
		t.Error("admin --json sessions: null, want an array")
	}
}

// checkSVG: the file is well-formed XML whose root is an svg element and
// which draws lines (the latency distribution and the rate).
func checkSVG(t *testing.T, file string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(b))
	root, paths := "", 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s is not well-formed XML: %v", file, err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
			}
			if se.Name.Local == "path" {
				paths++
			}
		}
	}
	if root != "svg" || paths < 2 || !bytes.Contains(b, []byte("latency distribution")) || !bytes.Contains(b, []byte("IOPS over time")) {
		t.Fatalf("%s: root <%s>, %d paths: not the bench's SVG", file, root, paths)
	}
}
