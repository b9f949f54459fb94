package benchplot

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Sweep is one workload run at a series of queue depths against several
// targets by the same initiator (bench's -spdk and default runs): every
// round's IOPS at each depth, and the latency distribution of the median
// round at each depth.
type Sweep struct {
	Title    string   `json:"title"`
	Workload string   `json:"workload"` // as "4k randread"
	Targets  []string `json:"targets"`
	Depths   []int    `json:"depths"`
	// IOPS[target][i] are the rounds' figures at Depths[i].
	IOPS map[string][][]float64 `json:"iops"`
	// Latency[target][i] is the distribution at Depths[i] (µs at each
	// percentile), from the round whose IOPS was the median.
	Latency map[string][][]Point `json:"latency_distribution_us"`
}

// DecodeSweep reads a Sweep written as JSON.
func DecodeSweep(r io.Reader) (Sweep, error) {
	var s Sweep
	if err := json.NewDecoder(r).Decode(&s); err != nil {
		return s, fmt.Errorf("reading a sweep: %w", err)
	}
	if len(s.Targets) == 0 || len(s.Depths) == 0 {
		return s, errors.New("the sweep has no targets or no depths")
	}
	for _, t := range s.Targets {
		if len(s.IOPS[t]) != len(s.Depths) {
			return s, fmt.Errorf("the sweep's target %q has %d IOPS entries for %d depths", t, len(s.IOPS[t]), len(s.Depths))
		}
	}
	return s, nil
}

// DrawSweep writes s as SVG: median IOPS against queue depth (log 2)
// with a line per target above; below, the latency distributions at the
// lowest and the highest depth, a line per target (percentile against µs,
// log scale).
func DrawSweep(w io.Writer, s Sweep) error {
	iops := plot.New()
	iops.Title.Text = s.Title
	iops.X.Label.Text = "queue depth"
	iops.Y.Label.Text = s.Workload + " IOPS (median)"
	iops.X.Scale = plot.LogScale{}
	iops.X.Tick.Marker = depthTicks(s.Depths)
	iops.Add(plotter.NewGrid())
	for i, t := range s.Targets {
		xy := plotter.XYs{}
		for j, d := range s.Depths {
			if v := s.IOPS[t][j]; len(v) > 0 {
				xy = append(xy, plotter.XY{X: float64(d), Y: Median(v)})
			}
		}
		if len(xy) == 0 {
			continue
		}
		l, p, err := plotter.NewLinePoints(xy)
		if err != nil {
			return err
		}
		l.Color, p.Color = seriesColor(i), seriesColor(i)
		iops.Add(l, p)
		iops.Legend.Add(t, l, p)
	}
	iops.Legend.Top, iops.Legend.Left = true, true
	iops.Y.Min = 0

	lat := func(j int) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("latency distribution at QD %d", s.Depths[j])
		p.X.Label.Text = "latency (µs)"
		p.Y.Label.Text = "percentile"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Add(plotter.NewGrid())
		for i, t := range s.Targets {
			if j >= len(s.Latency[t]) || len(s.Latency[t][j]) == 0 {
				continue
			}
			xy := make(plotter.XYs, 0, len(s.Latency[t][j]))
			for _, pt := range s.Latency[t][j] {
				xy = append(xy, plotter.XY{X: max(pt.US, 1), Y: pt.Percentile})
			}
			l, err := plotter.NewLine(xy)
			if err != nil {
				return nil, err
			}
			l.Color = seriesColor(i)
			p.Add(l)
			p.Legend.Add(t, l)
		}
		p.Legend.Top, p.Legend.Left = false, false
		p.Legend.YOffs = vg.Points(16)
		return p, nil
	}
	lo, err := lat(0)
	if err != nil {
		return err
	}
	hi, err := lat(len(s.Depths) - 1)
	if err != nil {
		return err
	}
	c := vgsvg.New(10*vg.Inch, 9*vg.Inch)
	tiles := draw.Tiles{Rows: 2, Cols: 2, PadTop: vg.Points(4), PadBottom: vg.Points(4), PadX: vg.Points(16), PadY: vg.Points(16),
		PadLeft: vg.Points(4), PadRight: vg.Points(12)}
	dc := draw.New(c)
	// The IOPS plot spans the top row; the two distributions share the
	// bottom one.
	top := draw.Crop(dc, 0, 0, dc.Size().Y/2, 0)
	iops.Draw(draw.Crop(top, tiles.PadLeft, -tiles.PadRight, tiles.PadY/2, -tiles.PadTop))
	bottom := draw.Crop(dc, 0, 0, 0, -dc.Size().Y/2)
	plots := [][]*plot.Plot{{lo, hi}}
	canv := plot.Align(plots, draw.Tiles{Rows: 1, Cols: 2, PadX: tiles.PadX, PadLeft: tiles.PadLeft, PadRight: tiles.PadRight,
		PadBottom: tiles.PadBottom, PadTop: tiles.PadY / 2}, bottom)
	lo.Draw(canv[0][0])
	hi.Draw(canv[0][1])
	if _, err := c.WriteTo(w); err != nil {
		return fmt.Errorf("writing the SVG: %w", err)
	}
	return nil
}

// depthTicks marks each depth of the sweep.
type depthTicks []int

func (d depthTicks) Ticks(min, max float64) []plot.Tick {
	var ts []plot.Tick
	for _, v := range slices.Sorted(slices.Values(d)) {
		if f := float64(v); f >= min-1e-9 && f <= max+1e-9 {
			ts = append(ts, plot.Tick{Value: f, Label: fmt.Sprint(v)})
		}
	}
	return ts
}

// MedianRound is the index of the round whose figure is the median of v
// (the lower middle one for an even count); -1 for none.
func MedianRound(v []float64) int {
	if len(v) == 0 {
		return -1
	}
	m := Median(v)
	best, bestDiff := 0, math.Inf(1)
	for i, x := range v {
		if d := math.Abs(x - m); d < bestDiff {
			best, bestDiff = i, d
		}
	}
	return best
}
