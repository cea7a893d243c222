package main

import (
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// plotCDFs draws one empirical CDF per scheme (values × scale) into dir/file, on a log x axis:
// goodputs and completion times span orders of magnitude, and a linear axis squeezes all but
// the worst outliers into its left edge. Values of 0 (a starved flow) cannot be drawn there:
// a line starts at its first positive value, its height counting the zeros.
func plotCDFs(dir, file, title, xlabel string, data map[string][]float64, order []string, scale float64) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = "CDF"
	p.Legend.Top = false
	p.Legend.Left = false
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	for i, scheme := range order {
		x := slices.Sorted(slices.Values(data[scheme]))
		if len(x) == 0 {
			continue
		}
		var pts plotter.XYs
		for j, v := range x {
			if v > 0 {
				pts = append(pts, plotter.XY{X: v * scale, Y: float64(j+1) / float64(len(x))})
			}
		}
		if len(pts) == 0 {
			continue
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(scheme, l)
	}
	return p.Save(6*vg.Inch, 4*vg.Inch, filepath.Join(dir, file))
}
