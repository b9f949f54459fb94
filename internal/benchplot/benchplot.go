// Package benchplot draws a run of blockwire bench (its --json output,
// docs/json.md) as SVG with gonum/plot: the latency distribution and the
// I/Os per second over the run. It lives apart from cmd/blockwire, so the
// daemon's binary carries no plotting library and its fonts.
package benchplot

import (
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"io"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Result is what Draw needs of bench --json's output.
type Result struct {
	RW          string  `json:"rw"`
	BlockSize   int     `json:"bs"`
	QueueDepth  int     `json:"qd"`
	IOPS        float64 `json:"iops"`
	IOsBySecond []int64 `json:"ios_by_second"`
	// Latency is the distribution: the latency (µs) at each percentile.
	Latency []Point `json:"latency_distribution_us"`
}

// Point is one percentile of the latency distribution.
type Point struct {
	Percentile float64 `json:"percentile"`
	US         float64 `json:"us"`
}

// Decode reads one bench --json result.
func Decode(r io.Reader) (Result, error) {
	var res Result
	if err := json.NewDecoder(r).Decode(&res); err != nil {
		return res, fmt.Errorf("reading bench --json output: %w", err)
	}
	if len(res.Latency) == 0 {
		return res, errors.New("the bench result has no latency_distribution_us (from blockwire bench --json)")
	}
	return res, nil
}

// Draw writes the run as SVG: percentile against latency (log scale)
// above, I/Os completed in each second below.
func Draw(w io.Writer, r Result) error {
	title := fmt.Sprintf("%s bs=%d qd=%d: %.0f IOPS", r.RW, r.BlockSize, r.QueueDepth, r.IOPS)
	dist := plot.New()
	dist.Title.Text = title + ", latency distribution"
	dist.X.Label.Text = "latency (µs)"
	dist.Y.Label.Text = "percentile"
	dist.X.Scale = plot.LogScale{}
	dist.X.Tick.Marker = plot.LogTicks{Prec: -1}
	dist.Add(plotter.NewGrid())
	pts := make(plotter.XYs, 0, len(r.Latency))
	for _, p := range r.Latency {
		pts = append(pts, plotter.XY{X: max(p.US, 1), Y: p.Percentile})
	}
	if len(pts) > 0 {
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		dist.Add(l)
	}

	rate := plot.New()
	rate.Title.Text = "IOPS over time"
	rate.X.Label.Text = "second of the run"
	rate.Y.Label.Text = "I/Os per second"
	rate.Add(plotter.NewGrid())
	xy := make(plotter.XYs, len(r.IOsBySecond))
	for i, n := range r.IOsBySecond {
		xy[i] = plotter.XY{X: float64(i) + 0.5, Y: float64(n)}
	}
	if len(xy) > 0 {
		l, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		rate.Add(l)
	}
	rate.Y.Min = 0

	c := vgsvg.New(8*vg.Inch, 8*vg.Inch)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadTop: vg.Points(4), PadBottom: vg.Points(4), PadY: vg.Points(12),
		PadLeft: vg.Points(4), PadRight: vg.Points(12)}
	plots := [][]*plot.Plot{{dist}, {rate}}
	canvases := plot.Align(plots, tiles, draw.New(c))
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	if _, err := c.WriteTo(w); err != nil {
		return fmt.Errorf("writing the SVG: %w", err)
	}
	return nil
}

// seriesColor is the colour of a chart's i-th series: gonum's soft
// palette, then its dark one, so up to 14 series (the file LUN charts
// have 8) are told apart before a colour comes back.
func seriesColor(i int) color.Color {
	soft, dark := plotutil.SoftColors, plotutil.DarkColors
	if i %= len(soft) + len(dark); i < len(soft) {
		return soft[i]
	}
	return dark[i-len(soft)]
}
