package bench

import (
	"fmt"
	"math"
	"strings"
)

// ScaleChart draws the scale section's results against cluster size as an
// SVG image: on the left the agent's one-pod sync (p50 and max) and full
// sync, on the right its RSS, each against the pod count on a log axis.
// Sizes without results are left out; an error says when nothing can be
// drawn.
func ScaleChart(r *Result) (string, error) {
	type size struct {
		name string
		pods float64
	}
	var sizes []size
	for _, sz := range scaleSizes(r) {
		sizes = append(sizes, size{sz, float64(sizePods(sz))})
	}
	if len(sizes) < 2 {
		return "", fmt.Errorf("scale chart: results for %d cluster sizes, need at least 2", len(sizes))
	}
	series := func(prefix string) []point {
		var out []point
		for _, s := range sizes {
			if v := r.Float(prefix + s.name); !math.IsNaN(v) {
				out = append(out, point{s.pods, v})
			}
		}
		return out
	}
	const w, h = 1000, 440
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	left := panel{x: 70, y: 40, w: 390, h: 270, title: "sync time (ms, log scale)", logY: true}
	right := panel{x: 580, y: 40, w: 390, h: 270, title: "agent RSS (MiB)"}
	var xs []float64
	for _, s := range sizes {
		xs = append(xs, s.pods)
	}
	left.draw(&b, xs, []line{
		{"one-pod change, p50", "#1f77b4", series("incr_sync_ms_")},
		{"one-pod change, max", "#aec7e8", series("incr_sync_ms_max_")},
		{"full sync", "#d62728", series("full_sync_ms_")},
	}, goalLine{1, "one-pod target at 150k: 1 ms"}, goalLine{1000, "full sync target at 100k: 1 s"})
	right.draw(&b, xs, []line{
		{"RSS after settling", "#2ca02c", series("rss_mb_")},
		{"peak RSS (start-up and full builds)", "#bcbd22", series("rss_peak_mb_")},
		{"Go heap in use", "#98df8a", series("go_heap_mb_")},
	}, goalLine{210, "target at 150k: 210 MiB"}, goalLine{300, "peak target at 150k: 300 MiB"})
	b.WriteString("</svg>\n")
	return b.String(), nil
}

type point struct{ x, y float64 }

type line struct {
	label, color string
	pts          []point
}

// goalLine is a dashed horizontal line at a goal.
type goalLine struct {
	y     float64
	label string
}

type panel struct {
	x, y, w, h float64
	title      string
	logY       bool
}

func (p panel) draw(b *strings.Builder, xs []float64, lines []line, targets ...goalLine) {
	minX, maxX := xs[0], xs[len(xs)-1]
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, l := range lines {
		for _, pt := range l.pts {
			lo, hi = math.Min(lo, pt.y), math.Max(hi, pt.y)
		}
	}
	for _, t := range targets {
		hi = math.Max(hi, t.y)
	}
	if math.IsInf(lo, 0) {
		return
	}
	sx := func(v float64) float64 {
		return p.x + (math.Log10(v)-math.Log10(minX))/(math.Log10(maxX)-math.Log10(minX))*p.w
	}
	sy := p.frame(b, lo, hi)
	// X ticks at the measured sizes.
	for _, v := range xs {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#eee"/>`+"\n", sx(v), p.y, sx(v), p.y+p.h)
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", sx(v), p.y+p.h+16, podsLabel(v))
	}
	for _, t := range targets {
		y := sy(t.y)
		fmt.Fprintf(b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#555" stroke-dasharray="5,4"/>`+"\n", p.x, y, p.x+p.w, y)
		fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end" fill="#555" font-size="10">%s</text>`+"\n", p.x+p.w-4, y-4, t.label)
	}
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" text-anchor="middle">pods in the cluster (log scale)</text>`+"\n", p.x+p.w/2, p.y+p.h+34)
	for i, l := range lines {
		if len(l.pts) == 0 {
			continue
		}
		var path strings.Builder
		for j, pt := range l.pts {
			cmd := "L"
			if j == 0 {
				cmd = "M"
			}
			fmt.Fprintf(&path, "%s%.1f,%.1f ", cmd, sx(pt.x), sy(pt.y))
		}
		fmt.Fprintf(b, `<path d="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.TrimSpace(path.String()), l.color)
		for _, pt := range l.pts {
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s: %s at %s pods</title></circle>`+"\n",
				sx(pt.x), sy(pt.y), l.color, l.label, trimFloat(pt.y), podsLabel(pt.x))
		}
		ly := p.y + p.h + 56 + float64(i)*16
		fmt.Fprintf(b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="2"/>`+"\n", p.x+8, ly-4, p.x+28, ly-4, l.color)
		fmt.Fprintf(b, `<text x="%.0f" y="%.0f">%s</text>`+"\n", p.x+32, ly, l.label)
	}
}

// frame draws the panel's title, border and y ticks (decades on a log
// axis, fifths from 0 otherwise) for values from lo to hi, and returns the
// y coordinate of a value.
func (p panel) frame(b *strings.Builder, lo, hi float64) func(float64) float64 {
	ty := func(v float64) float64 { return v }
	if p.logY {
		lo, hi = math.Pow(10, math.Floor(math.Log10(math.Max(lo, 0.01)))), math.Pow(10, math.Ceil(math.Log10(hi)))
		ty = func(v float64) float64 { return math.Log10(math.Max(v, lo)) }
	} else {
		lo, hi = 0, niceCeil(hi)
	}
	sy := func(v float64) float64 { return p.y + p.h - (ty(v)-ty(lo))/(ty(hi)-ty(lo))*p.h }
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" font-weight="bold">%s</text>`+"\n", p.x, p.y-15, p.title)
	fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#888"/>`+"\n", p.x, p.y, p.w, p.h)
	var ticks []float64
	if p.logY {
		for v := lo; v <= hi*1.0001; v *= 10 {
			ticks = append(ticks, v)
		}
	} else {
		for i := 0; i <= 5; i++ {
			ticks = append(ticks, lo+(hi-lo)*float64(i)/5)
		}
	}
	for _, v := range ticks {
		y := sy(v)
		fmt.Fprintf(b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/>`+"\n", p.x, y, p.x+p.w, y)
		fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", p.x-5, y+4, trimFloat(v))
	}
	return sy
}

func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*e >= v {
			return m * e
		}
	}
	return 10 * e
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.3g", v)
	if strings.Contains(s, "e") {
		s = fmt.Sprintf("%.0f", v)
	}
	return s
}

func podsLabel(v float64) string {
	if v >= 1000 {
		return trimFloat(v/1000) + "k"
	}
	return trimFloat(v)
}
