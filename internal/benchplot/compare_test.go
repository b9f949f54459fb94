package benchplot

import (
	"bytes"
	"image/color"
	"math"
	"strings"
	"testing"
)

func TestRatio(t *testing.T) {
	iops := Row{Name: "4k", Unit: "IOPS", Higher: true, Runs: map[string][]float64{"a": {100, 90, 110}, "b": {50}}}
	if r := iops.Ratio("b", "a"); r != 0.5 {
		t.Errorf("IOPS: b/a = %v, want 0.5", r)
	}
	lat := Row{Name: "p99", Unit: "usec", Runs: map[string][]float64{"a": {60}, "b": {120}}}
	if r := lat.Ratio("b", "a"); r != 0.5 {
		t.Errorf("latency: b is twice as slow, ratio %v, want 0.5", r)
	}
	if r := iops.Ratio("c", "a"); !math.IsNaN(r) {
		t.Errorf("a target without runs: %v, want NaN", r)
	}
}

// TestDrawComparison draws a comparison read back from JSON: an SVG with
// every workload and target named.
func TestDrawComparison(t *testing.T) {
	c, err := DecodeComparison(strings.NewReader(`{"title":"t","targets":["spdk","blockwire","tgt"],"rows":[
		{"workload":"4k randread QD32","unit":"IOPS","higher_is_better":true,"runs":{"spdk":[142378],"blockwire":[114877],"tgt":[50289]}},
		{"workload":"p99","unit":"usec","higher_is_better":false,"runs":{"spdk":[61],"blockwire":[95]}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := DrawComparison(&b, c); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	for _, want := range []string{"<svg", "4k randread QD32", "p99", "spdk", "blockwire", "tgt", "relative to spdk"} {
		if !strings.Contains(svg, want) {
			t.Errorf("the SVG lacks %q", want)
		}
	}
	if _, err := DecodeComparison(strings.NewReader(`{"targets":["a"],"rows":[]}`)); err == nil {
		t.Error("a comparison of one target was accepted")
	}
}

// TestDrawSweep draws a sweep read back from JSON: IOPS against queue
// depth and the two latency distributions, every target and depth named;
// a sweep whose IOPS do not match its depths is refused.
func TestDrawSweep(t *testing.T) {
	js := `{"title":"sweep","workload":"4k randread","targets":["spdk","blockwire"],"depths":[1,4,32],
		"iops":{"spdk":[[13000],[40000,41000],[71000]],"blockwire":[[9000],[30000],[60000,62000,61000]]},
		"latency_distribution_us":{"spdk":[[{"percentile":50,"us":70},{"percentile":99,"us":90}],[],[{"percentile":50,"us":400}]],
			"blockwire":[[{"percentile":50,"us":100},{"percentile":99,"us":140}],[],[{"percentile":50,"us":500}]]}}`
	s, err := DecodeSweep(strings.NewReader(js))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := DrawSweep(&b, s); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	for _, want := range []string{"<svg", "sweep", "4k randread", "spdk", "blockwire", "latency distribution at QD 1", "latency distribution at QD 32", ">32<"} {
		if !strings.Contains(svg, want) {
			t.Errorf("the SVG lacks %q", want)
		}
	}
	if _, err := DecodeSweep(strings.NewReader(`{"targets":["a"],"depths":[1,2],"iops":{"a":[[1]]}}`)); err == nil {
		t.Error("a sweep with one IOPS entry for two depths was accepted")
	}
	if MedianRound([]float64{5, 1, 3}) != 2 || MedianRound(nil) != -1 {
		t.Error("MedianRound")
	}
}

// TestSeriesColors: the file LUN charts' eight series (and up to 14) get
// colours all different.
func TestSeriesColors(t *testing.T) {
	seen := map[color.RGBA]int{}
	for i := range 14 {
		r, g, b, a := seriesColor(i).RGBA()
		c := color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8), uint8(a >> 8)}
		if j, ok := seen[c]; ok {
			t.Fatalf("series %d has series %d's colour %v", i, j, c)
		}
		seen[c] = i
	}
}
