package benchplot

import (
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Comparison is one side-by-side run of the bench harness (go run
// ./bench): several targets, or paths, on the same workloads.
type Comparison struct {
	Title string `json:"title"`
	// Targets in the order to draw them; the first is the reference the
	// others are drawn against.
	Targets []string `json:"targets"`
	Rows    []Row    `json:"rows"`
}

// Row is one workload: each target's runs.
type Row struct {
	Name string `json:"workload"`
	Unit string `json:"unit"`
	// Higher says whether a higher figure is better (IOPS, MB/s) or a
	// lower one (latency).
	Higher bool                 `json:"higher_is_better"`
	Runs   map[string][]float64 `json:"runs"`
}

// DecodeComparison reads a Comparison written as JSON by the harness.
func DecodeComparison(r io.Reader) (Comparison, error) {
	var c Comparison
	if err := json.NewDecoder(r).Decode(&c); err != nil {
		return c, fmt.Errorf("reading a bench comparison: %w", err)
	}
	if len(c.Targets) < 2 || len(c.Rows) == 0 {
		return c, errors.New("a comparison needs two targets or more and one workload or more")
	}
	return c, nil
}

// Median of v (0 for none).
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Ratio is a target's median over the reference's on a row, turned so
// that above 1 is better whatever the unit (NaN where either is missing).
func (r Row) Ratio(target, reference string) float64 {
	a, b := Median(r.Runs[target]), Median(r.Runs[reference])
	if a == 0 || b == 0 {
		return math.NaN()
	}
	if r.Higher {
		return a / b
	}
	return b / a
}

// DrawComparison writes c as SVG: for each workload a group of bars, one
// per target, each the target's median relative to the first target's
// (above 1: better than it), with a line at 1.
func DrawComparison(w io.Writer, c Comparison) error {
	ref := c.Targets[0]
	p := plot.New()
	p.Title.Text = c.Title
	p.Y.Label.Text = fmt.Sprintf("relative to %s (median; above 1 = better)", ref)
	p.Add(plotter.NewGrid())
	names := make([]string, len(c.Rows))
	for i, r := range c.Rows {
		names[i] = r.Name
	}
	width := vg.Points(60 / float64(len(c.Targets)))
	top := 1.0
	for i, t := range c.Targets {
		vals := make(plotter.Values, len(c.Rows))
		for j, r := range c.Rows {
			v := r.Ratio(t, ref)
			if math.IsNaN(v) {
				v = 0 // a run that failed draws no bar
			}
			vals[j] = v
			top = max(top, v)
		}
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return err
		}
		bars.LineStyle.Width = 0
		bars.Color = seriesColor(i)
		bars.Offset = vg.Length(float64(i)-float64(len(c.Targets)-1)/2) * width
		p.Add(bars)
		p.Legend.Add(t, bars)
	}
	one := plotter.NewFunction(func(float64) float64 { return 1 })
	one.Color = color.Black
	one.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(one)
	p.Legend.Top = true
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.6, float64(len(c.Rows))-0.4 // room for the outer bars and labels
	p.Y.Min, p.Y.Max = 0, top*1.15
	cv := vgsvg.New(vg.Length(max(8, 2*float64(len(c.Rows))))*vg.Inch, 5*vg.Inch)
	p.Draw(draw.New(cv))
	if _, err := cv.WriteTo(w); err != nil {
		return fmt.Errorf("writing the SVG: %w", err)
	}
	return nil
}
