package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
)

// chartColors are the series colours, one per variant in report order.
var chartColors = []string{"#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"}

// WriteLatencyChart draws the latency (p50 solid, p99 dashed) against the
// offered load of every variant as an SVG image, both axes logarithmic.
func (r *Report) WriteLatencyChart(w io.Writer) error {
	const (
		width, height = 820, 480
		left, right   = 70, 230
		top, bottom   = 50, 60
	)
	plotW := float64(width - left - right)
	plotH := float64(height - top - bottom)

	// The axis shows every load the run offered, measured or not.
	var loads []int
	seen := map[int]bool{}
	for _, l := range r.Settings.Loads {
		if !seen[l] {
			seen[l] = true
			loads = append(loads, l)
		}
	}
	yMax, yMin := 1.0, math.Inf(1)
	for _, p := range r.Latency {
		if !seen[p.Load] {
			seen[p.Load] = true
			loads = append(loads, p.Load)
		}
		yMax = math.Max(yMax, math.Max(p.P50, p.P99))
		if p.P50 > 0 {
			yMin = math.Min(yMin, p.P50)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="15" font-weight="bold">End-to-end latency (commit to handled) against offered load</text>`+"\n", left)
	if len(r.Latency) == 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d">no latency measured</text>`+"\n", left, top+40)
		b.WriteString("</svg>\n")
		_, err := io.WriteString(w, b.String())
		return err
	}
	slices.Sort(loads)
	// Loads grow by factors (100, 200, 500, ...): both axes are logarithmic.
	xLo := math.Log10(float64(loads[0]) / 1.4)
	xHi := math.Log10(float64(loads[len(loads)-1]) * 1.4)
	// The log scale spans whole decades around the values, in milliseconds.
	yLo := math.Pow(10, math.Floor(math.Log10(math.Min(yMin, 1))))
	yHi := math.Pow(10, math.Ceil(math.Log10(yMax*1.05)))
	xAt := func(load float64) float64 { return float64(left) + (math.Log10(load)-xLo)/(xHi-xLo)*plotW }
	y := func(ms float64) float64 {
		ms = math.Max(ms, yLo)
		return float64(top) + plotH*(1-(math.Log10(ms)-math.Log10(yLo))/(math.Log10(yHi)-math.Log10(yLo)))
	}

	// Axes, grid and ticks.
	for d := yLo; d <= yHi*1.0001; d *= 10 {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, y(d), float64(left)+plotW, y(d))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(d)+4, trimFloat(d))
	}
	for _, l := range loads {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", xAt(float64(l)), top, xAt(float64(l)), float64(top)+plotH)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%d</text>`+"\n", xAt(float64(l)), float64(top)+plotH+18, l)
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%.1f" fill="none" stroke="#333"/>`+"\n", left, top, plotW, plotH)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">offered load (events/s, log scale)</text>`+"\n", float64(left)+plotW/2, height-18)
	fmt.Fprintf(&b, `<text x="18" y="%.1f" text-anchor="middle" transform="rotate(-90 18 %.1f)">latency (ms, log scale)</text>`+"\n", float64(top)+plotH/2, float64(top)+plotH/2)

	// Series. Each variant's markers sit a little apart from the others'
	// so that equal values stay visible.
	legendY := top + 10
	nSeries := 0
	for _, v := range r.Variants {
		for _, p := range r.Latency {
			if p.Variant == v.Key {
				nSeries++
				break
			}
		}
	}
	series := 0
	for i, v := range r.Variants {
		var pts []LatencyPoint
		for _, p := range r.Latency {
			if p.Variant == v.Key {
				pts = append(pts, p)
			}
		}
		if len(pts) == 0 {
			continue
		}
		shift := (float64(series) - float64(nSeries-1)/2) * 4
		series++
		x := func(load float64) float64 { return xAt(load) + shift }
		color := chartColors[i%len(chartColors)]
		for _, s := range []struct {
			name  string
			dash  string
			value func(LatencyPoint) float64
		}{
			{"p50", "", func(p LatencyPoint) float64 { return p.P50 }},
			{"p99", ` stroke-dasharray="6 4"`, func(p LatencyPoint) float64 { return p.P99 }},
		} {
			var path []string
			for _, p := range pts {
				path = append(path, fmt.Sprintf("%.1f,%.1f", x(float64(p.Load)), y(s.value(p))))
			}
			if len(path) > 1 {
				fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(path, " "), color, s.dash)
			}
			for _, p := range pts {
				if s.name == "p50" {
					fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s"><title>%s p50 %.2f ms at %d/s</title></circle>`+"\n",
						x(float64(p.Load)), y(p.P50), color, html.EscapeString(v.Label), p.P50, p.Load)
				} else {
					fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="8" height="8" fill="white" stroke="%s" stroke-width="2"><title>%s p99 %.2f ms at %d/s</title></rect>`+"\n",
						x(float64(p.Load))-4, y(p.P99)-4, color, html.EscapeString(v.Label), p.P99, p.Load)
				}
			}
		}
		lx := width - right + 16
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", lx, legendY, lx+22, legendY, color)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", lx+28, legendY+4, html.EscapeString(v.Label))
		legendY += 20
	}
	lx := width - right + 16
	legendY += 10
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333" stroke-width="2"/><circle cx="%d" cy="%d" r="4" fill="#333"/>`+"\n", lx, legendY, lx+22, legendY, lx+11, legendY)
	fmt.Fprintf(&b, `<text x="%d" y="%d">p50</text>`+"\n", lx+28, legendY+4)
	legendY += 20
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333" stroke-width="2" stroke-dasharray="6 4"/><rect x="%d" y="%d" width="8" height="8" fill="white" stroke="#333" stroke-width="2"/>`+"\n", lx, legendY, lx+22, legendY, lx+7, legendY-4)
	fmt.Fprintf(&b, `<text x="%d" y="%d">p99</text>`+"\n", lx+28, legendY+4)
	legendY += 28
	for _, line := range []string{
		fmt.Sprintf("Loads above %.0f%% of a", 100*r.Settings.CapacityShare),
		"variant's best end-to-end", "throughput are not run.",
	} {
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#555" font-size="11">%s</text>`+"\n", lx, legendY, line)
		legendY += 14
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func trimFloat(v float64) string {
	if v >= 1 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%g", v)
}
