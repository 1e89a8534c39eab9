package bench

import (
	"fmt"
	"math"
	"strings"
)

// compareChartModes are the modes CompareChart draws, in RunConn's names,
// with their labels and colours.
var compareChartModes = []struct{ mode, label, color string }{
	{ModeControl, "no policy", "#7f7f7f"},
	{ModeConntrack, "conntrack only", "#bcbd22"},
	{ModeHybrid, "nftpolicy hybrid", "#1f77b4"},
	{ModeQueue, "nftpolicy queue", "#2ca02c"},
	{ModeQueueWide, "nftpolicy queue, share raised", "#98df8a"},
	{ModeKNP, "kube-network-policies", "#d62728"},
}

// compareChartPaths are RunConn's paths with their labels.
var compareChartPaths = []struct{ path, label string }{{PathSame, "same node"}, {PathCross, "cross node"}}

// CompareChart draws hack/compare.sh's connection figures (RunConn's
// <mode>_rate_<path>, <mode>_p50_us_<path> and <mode>_p99_us_<path>, as
// TestCompareConn prints them) as an SVG image of three grouped bar
// panels: connection rate, connect latency p50 and p99 (log scale), each
// with a group per path and a bar per mode (no policy, conntrack only,
// nftpolicy hybrid, queue and queue with its per-source share raised,
// kube-network-policies). A figure the run did
// not give is left out of its group; an error says when a panel would be
// empty.
func CompareChart(r *Result) (string, error) {
	var series []line
	for _, m := range compareChartModes {
		series = append(series, line{label: m.label, color: m.color})
	}
	values := func(suffix string) ([][]float64, error) {
		out := make([][]float64, len(compareChartPaths))
		n := 0
		for i, p := range compareChartPaths {
			for _, m := range compareChartModes {
				v := r.Float(m.mode + suffix + p.path)
				if !(v > 0) {
					v = math.NaN()
				} else {
					n++
				}
				out[i] = append(out[i], v)
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("compare chart: no <mode>%s<path> figure among the lines", suffix)
		}
		return out, nil
	}
	rate, err := values("_rate_")
	if err != nil {
		return "", err
	}
	p50, err := values("_p50_us_")
	if err != nil {
		return "", err
	}
	p99, err := values("_p99_us_")
	if err != nil {
		return "", err
	}
	const w, h = 1080, 420
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	groups := []string{compareChartPaths[0].label, compareChartPaths[1].label}
	barPanel{panel: panel{x: 60, y: 40, w: 290, h: 260, title: "connections/s (median of rounds)"}}.draw(&b, groups, series, rate)
	barPanel{panel: panel{x: 420, y: 40, w: 290, h: 260, title: "connect latency p50 (µs, log scale)", logY: true}}.draw(&b, groups, series, p50)
	barPanel{panel: panel{x: 780, y: 40, w: 290, h: 260, title: "connect latency p99 (µs, log scale)", logY: true}}.draw(&b, groups, series, p99)
	for i, s := range series {
		x := 60 + float64(i)*200
		fmt.Fprintf(&b, `<rect x="%.0f" y="%d" width="14" height="14" fill="%s"/>`+"\n", x, h-40, s.color)
		fmt.Fprintf(&b, `<text x="%.0f" y="%d">%s</text>`+"\n", x+20, h-28, s.label)
	}
	b.WriteString("</svg>\n")
	return b.String(), nil
}

// barPanel draws grouped bars: a group per category, a bar per series
// (vals[group][series]; NaN is no bar).
type barPanel struct{ panel }

func (p barPanel) draw(b *strings.Builder, groups []string, series []line, vals [][]float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, g := range vals {
		for _, v := range g {
			if !math.IsNaN(v) {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if math.IsInf(lo, 0) {
		return
	}
	sy := p.frame(b, lo, hi)
	gw := p.w / float64(len(groups))
	bw := gw * 0.8 / float64(len(series))
	for gi, g := range groups {
		x0 := p.x + float64(gi)*gw + gw*0.1
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", p.x+float64(gi)*gw+gw/2, p.y+p.h+16, g)
		for si, s := range series {
			v := vals[gi][si]
			if math.IsNaN(v) {
				continue
			}
			x, y := x0+float64(si)*bw, sy(v)
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s, %s: %s</title></rect>`+"\n",
				x, y, bw-2, p.y+p.h-y, s.color, s.label, g, trimFloat(v))
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="7">%s</text>`+"\n", x+(bw-2)/2, y-3, trimFloat(v))
		}
	}
}
