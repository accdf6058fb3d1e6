package main

import (
	"fmt"
	"math"
	"strings"
)

// Plot returns an SVG chart of the hit rate against store capacity (log
// scale), local and total, with the trace's theoretical maximum as a line
// (which an unbounded run reaches: it is not plotted as a point).
// It is written by hand: a chart of a few points needs no plotting library,
// and the module takes no dependency for an example.
func Plot(rep *Report) string {
	const w, h, left, right, top, bottom = 640, 400, 70, 20, 40, 60
	pw, ph := float64(w-left-right), float64(h-top-bottom)
	var caps []float64
	var runs []*Result
	for _, r := range rep.Runs {
		if r.CapacityTokens > 0 {
			caps = append(caps, float64(r.CapacityTokens))
			runs = append(runs, r)
		}
	}
	if len(runs) == 0 {
		caps, runs = []float64{1}, []*Result{{}}
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range caps {
		lo, hi = min(lo, c), max(hi, c)
	}
	lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
	if hi <= lo {
		hi = lo * 10
	}
	x := func(c float64) float64 {
		return left + pw*(math.Log10(c)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))
	}
	y := func(rate float64) float64 { return top + ph*(1-rate) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">%s: hit rate against store capacity (%d-token blocks, %d instance(s))</text>`+"\n",
		left, escape(rep.Trace), rep.Setup.BlockSize, rep.Setup.Instances)
	for i := 0; i <= 10; i += 2 {
		r := float64(i) / 10
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y(r), w-right, y(r))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%d%%</text>`+"\n", left-6, y(r)+4, i*10)
	}
	for d := lo; d <= hi*1.0001; d *= 10 {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x(d), top, x(d), h-bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(d), h-bottom+16, tokensString(int64(d)))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">store capacity, tokens of KV (log scale)</text>`+"\n", left+pw/2, h-bottom+36)
	bound := rep.Bound.HitRate()
	fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#888" stroke-dasharray="6 4"/>`+"\n", left, y(bound), w-right, y(bound))
	fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" fill="#555">theoretical maximum %.1f%%</text>`+"\n", w-right-4, y(bound)-6, 100*bound)
	series := []struct {
		name, color string
		rate        func(*Result) float64
	}{
		{"total (local + store)", "#1f77b4", func(r *Result) float64 { return r.HitRate }},
		{"local prefix cache", "#ff7f0e", func(r *Result) float64 { return r.LocalHitRate }},
	}
	for k, s := range series {
		var pts []string
		for i, r := range runs {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(caps[i]), y(s.rate(r))))
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), s.color)
		for i, r := range runs {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s: %.1f%%</title></circle>`+"\n", x(caps[i]), y(s.rate(r)), s.color, tokensString(int64(caps[i])), 100*s.rate(r))
			if k == 0 {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%.1f%%</text>`+"\n", x(caps[i]), y(s.rate(r))-8, 100*s.rate(r))
			}
		}
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/><text x="%d" y="%d">%s</text>`+"\n",
			left+10, h-12-16*(1-k)+0, left+34, h-12-16*(1-k), s.color, left+40, h-8-16*(1-k), s.name)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
