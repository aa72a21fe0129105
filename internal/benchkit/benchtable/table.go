package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
)

// Sub-benchmark names of one comparison: sluice's figure and its references.
const (
	subSluice    = "sluice"
	subRaw       = "raw"
	subWatermill = "watermill"
)

// references are the columns sluice is compared with, in table order.
var references = []string{subRaw, subWatermill}

// group is one comparison: the sub-benchmarks of one parent benchmark in one package.
type group struct {
	pkg    string
	parent string
	// subs maps a sub-benchmark name to its metrics, the median of repeated runs (-count
	// or -rounds above 1): on a shared 2-core machine one slow run is common, and the
	// median does not let it move the figure. A benchmark without sub-benchmarks is the
	// sub "".
	subs map[string]map[string]float64
	// runs holds every run's figure per sub and unit, in order, so that a ratio can pair
	// the k-th run of sluice with the k-th of its reference (measured seconds apart).
	runs map[string]map[string][]float64
	// multiOp says which subs ran more than one iteration. Go's per-op figures of a
	// one-iteration benchmark (a 20s measurement) describe the whole run; they are left out.
	multiOp map[string]bool
	// order is the sub names in order of first appearance.
	order []string
}

// groupResults groups results by package and parent benchmark (the name up to its last
// "/"), in order of first appearance.
func groupResults(results []result) []*group {
	var groups []*group
	byKey := map[string]*group{}
	for _, r := range results {
		parent, sub := r.name, ""
		if i := strings.LastIndexByte(r.name, '/'); i >= 0 {
			parent, sub = r.name[:i], r.name[i+1:]
		}
		key := r.pkg + "\x00" + parent
		g, ok := byKey[key]
		if !ok {
			g = &group{pkg: r.pkg, parent: parent, subs: map[string]map[string]float64{},
				runs: map[string]map[string][]float64{}, multiOp: map[string]bool{}}
			byKey[key] = g
			groups = append(groups, g)
		}
		if _, ok := g.runs[sub]; !ok {
			g.runs[sub] = map[string][]float64{}
			g.order = append(g.order, sub)
		}
		if r.n > 1 {
			g.multiOp[sub] = true
		}
		for unit, v := range r.metrics {
			g.runs[sub][unit] = append(g.runs[sub][unit], v)
		}
	}
	for _, g := range groups {
		for sub, units := range g.runs {
			g.subs[sub] = make(map[string]float64, len(units))
			for unit, vs := range units {
				g.subs[sub][unit] = median(vs)
			}
		}
	}
	return groups
}

// median returns the middle of vs, or the mean of the two middle values.
func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// row is one line of the table.
type row struct {
	benchmark string
	unit      string
	sluice    string
	refs      []string // one per references entry
	ratios    []string // sluice ÷ reference, one per references entry
}

// rows turns a group into table rows. A group with a sluice sub-benchmark gives one row per
// unit with its references beside it, and one more set of rows per variant of the raw
// reference (a sub-benchmark named "raw-<variant>", e.g. raw-record: the raw loop doing
// more of what sluice does), sluice's figure beside the variant's in the raw column. A
// variant of sluice (a sub-benchmark named "sluice-<variant>", e.g. sluice-nojournal: the
// stack with a default turned off) gets rows of its own right after sluice's, beside the
// same references of the same rounds, and beside each variant of raw after sluice's. Any
// other sub-benchmark, or a benchmark without sub-benchmarks, gives rows of its own with
// its figure in the sluice column.
func (g *group) rows() []row {
	label := g.label()
	// sluices are sluice's sub-benchmark and its variants, each with its rows' label.
	type labelled struct{ sub, label string }
	var sluices []labelled
	_, hasSluice := g.subs[subSluice]
	if hasSluice {
		sluices = append(sluices, labelled{subSluice, label})
	}
	for _, sub := range g.order {
		if variant, ok := strings.CutPrefix(sub, subSluice+"-"); ok {
			sluices = append(sluices, labelled{sub, label + " (" + variant + ")"})
		}
	}
	var out []row
	for _, s := range sluices {
		out = append(out, g.unitRows(s.label, s.sub, references)...)
	}
	for _, sub := range g.order {
		if sub == subSluice || strings.HasPrefix(sub, subSluice+"-") || (isReference(sub) && hasSluice) {
			continue
		}
		if hasSluice && strings.HasPrefix(sub, subRaw+"-") {
			refs := make([]string, len(references))
			refs[slices.Index(references, subRaw)] = sub
			for _, s := range sluices {
				out = append(out, g.unitRows(s.label+" vs "+sub, s.sub, refs)...)
			}
			continue
		}
		name := label
		if sub != "" {
			name += "/" + sub
		}
		out = append(out, g.unitRows(name, sub, nil)...)
	}
	return out
}

// unitRows gives sub's rows, one per unit; refs names the sub-benchmark shown in each
// references column ("" or a nil refs: none).
func (g *group) unitRows(label, sub string, refs []string) []row {
	units := map[string]bool{}
	for _, s := range g.subs {
		for u := range s {
			units[u] = true
		}
	}
	var out []row
	for _, unit := range orderUnits(units) {
		v, ok := g.subs[sub][unit]
		if !ok || (goPerOp(unit) && !g.multiOp[sub]) {
			continue
		}
		r := row{benchmark: label, unit: unit, sluice: formatValue(v)}
		for i := range references {
			ref := ""
			if refs != nil {
				ref = refs[i]
			}
			refV, has := g.subs[ref][unit]
			if ref == "" || !has {
				r.refs = append(r.refs, "")
				r.ratios = append(r.ratios, "")
				continue
			}
			r.refs = append(r.refs, formatValue(refV))
			r.ratios = append(r.ratios, g.ratio(sub, ref, unit))
		}
		out = append(out, r)
	}
	return out
}

// ratio is sub's figure over ref's for unit: with repeated runs, the median of the ratios
// of runs paired in order (the k-th of each), which cancels what a slow minute did to
// both; otherwise the ratio of the two figures.
func (g *group) ratio(sub, ref, unit string) string {
	a, b := g.runs[sub][unit], g.runs[ref][unit]
	n := min(len(a), len(b))
	var ratios []float64
	for k := 0; k < n; k++ {
		if b[k] != 0 {
			ratios = append(ratios, a[k]/b[k])
		}
	}
	if n < 2 || len(ratios) < n {
		return formatRatio(g.subs[sub][unit], g.subs[ref][unit])
	}
	return fmt.Sprintf("%.2fx", median(ratios))
}

// label names a group: its package path below the module, then the benchmark without
// its "Benchmark" prefix.
func (g *group) label() string {
	name := strings.TrimPrefix(g.parent, "Benchmark")
	pkg := g.pkg
	if i := strings.Index(pkg, "/sluice/"); i >= 0 {
		pkg = pkg[i+len("/sluice/"):]
	} else if strings.HasSuffix(pkg, "/sluice") {
		pkg = "." // the module's root package
	}
	if pkg == "" {
		return name
	}
	return pkg + " " + name
}

// goPerOp says whether unit is one of the per-op figures go test itself reports.
func goPerOp(unit string) bool {
	return unit == "ns/op" || unit == "B/op" || unit == "allocs/op"
}

func isReference(sub string) bool {
	for _, r := range references {
		if sub == r {
			return true
		}
	}
	return false
}

// orderUnits puts throughput first, then custom metrics by name, then Go's own. ns/op is
// left out where a throughput metric says the same thing.
func orderUnits(units map[string]bool) []string {
	rank := func(u string) int {
		switch {
		case strings.HasSuffix(u, "/s"):
			return 0
		case u == "ns/op":
			return 2
		case u == "B/op":
			return 3
		case u == "allocs/op":
			return 4
		default:
			return 1
		}
	}
	hasRate := false
	var out []string
	for u := range units {
		if rank(u) == 0 {
			hasRate = true
		}
		out = append(out, u)
	}
	if hasRate {
		kept := out[:0]
		for _, u := range out {
			if u != "ns/op" {
				kept = append(kept, u)
			}
		}
		out = kept
	}
	sort.Slice(out, func(i, j int) bool {
		if ri, rj := rank(out[i]), rank(out[j]); ri != rj {
			return ri < rj
		}
		return out[i] < out[j]
	})
	return out
}

func formatValue(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1000:
		return fmt.Sprintf("%.0f", v)
	case a >= 100:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	case a == 0:
		return "0"
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

func formatRatio(v, ref float64) string {
	if ref == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2fx", v/ref)
}

// render writes the groups as one table, columns aligned.
func render(w io.Writer, groups []*group) error {
	header := []string{"benchmark", "metric", "sluice"}
	for _, ref := range references {
		header = append(header, referenceTitle(ref))
	}
	for _, ref := range references {
		header = append(header, "sluice÷"+ref)
	}
	lines := [][]string{header}
	for _, g := range groups {
		for _, r := range g.rows() {
			line := []string{r.benchmark, r.unit, r.sluice}
			line = append(line, r.refs...)
			line = append(line, r.ratios...)
			lines = append(lines, line)
		}
	}
	if len(lines) == 1 {
		_, err := fmt.Fprintln(w, "benchtable: no benchmark results")
		return err
	}
	widths := make([]int, len(header))
	for _, l := range lines {
		for i, c := range l {
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	var sb strings.Builder
	writeLine := func(l []string) {
		sb.WriteString("|")
		for i, c := range l {
			pad := widths[i] - len([]rune(c))
			if i >= 2 { // numbers right-aligned
				sb.WriteString(" " + strings.Repeat(" ", pad) + c + " |")
			} else {
				sb.WriteString(" " + c + strings.Repeat(" ", pad) + " |")
			}
		}
		sb.WriteString("\n")
	}
	writeLine(lines[0])
	sb.WriteString("|")
	for i, wd := range widths {
		if i >= 2 {
			sb.WriteString(" " + strings.Repeat("-", wd-1) + ": |")
		} else {
			sb.WriteString(" " + strings.Repeat("-", wd) + " |")
		}
	}
	sb.WriteString("\n")
	for _, l := range lines[1:] {
		writeLine(l)
	}
	sb.WriteString("\nsluice÷ref is sluice's figure divided by the reference's (over several runs, the median\nof each run's ratio): for a rate (…/s) higher is better, for every other metric (per op,\nms) lower is better.\n")
	_, err := io.WriteString(w, sb.String())
	return err
}

func referenceTitle(ref string) string {
	switch ref {
	case subRaw:
		return "raw amqp091"
	case subWatermill:
		return "watermill"
	}
	return ref
}
