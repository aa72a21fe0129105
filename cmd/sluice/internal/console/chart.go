package console

import (
	"fmt"
	"strings"
	"time"

	"github.com/sluice-go/sluice/internal/jaeger"
	"github.com/sluice-go/sluice/internal/otelnames"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/internal/waterfall"
)

// The graphical waterfall: one SVG row per span of a message's trace and one per wait in
// the broker between a hand-off and the attempt that consumed it, each a bar on a time
// axis; a delay's wait shows the delay asked (an outline) behind the time waited (the
// bar). The text drawing (internal/waterfall) stays on the page for screen readers and
// copying.

// Chart geometry, in SVG user units.
const (
	chartWidth = 1000
	chartLeft  = 340
	chartRight = 990
	chartRowH  = 24
	chartTop   = 26
	chartBarH  = 14
)

// Chart is a trace drawn as SVG bars.
type Chart struct {
	Width, Height int
	// AxisY is where the axis line is; Ticks are its labels.
	AxisY int
	Ticks []ChartTick
	Rows  []ChartRow
	// Attempts counts the attempt rows of the message.
	Attempts int
	// Omitted counts the rows past maxChartRows, not drawn (the text form has them).
	Omitted int
}

// maxChartRows bounds a chart's rows: a handler's own spans can make a trace long.
const maxChartRows = 120

// ChartTick is one label of the time axis.
type ChartTick struct {
	X     float64
	Label string
	// Class anchors the first and last labels inside the chart.
	Class string
}

// ChartRow is one bar.
type ChartRow struct {
	// Kind is the bar's class: "attempt", "attempt failed", "wait", "delay", "deadletter"
	// or "span".
	Kind string
	// Attempt is the attempt number of an attempt row ("" otherwise).
	Attempt string
	Label   string
	// LabelX indents the label by the span's depth.
	LabelX int
	// Title is the row's tooltip: its name, start, duration and details.
	Title string
	// Detail is the text right of the label (outcome, asked delay).
	Detail string
	Y      int
	TextY  int
	X, W   float64
	// AskedW, when not zero, is the width of the delay asked, drawn from X.
	AskedW float64
	// DetailX is where Detail starts (or, DetailEnd, ends).
	DetailX   float64
	DetailEnd bool
}

// newChart draws t about the message messageID.
func newChart(t jaeger.Trace, messageID string) *Chart {
	if len(t.Spans) == 0 {
		return nil
	}
	start, end := t.Spans[0].StartTime, t.Spans[0].StartTime
	for _, s := range t.Spans {
		if s.StartTime.Before(start) {
			start = s.StartTime
		}
		if e := s.StartTime.Add(s.Duration); e.After(end) {
			end = e
		}
	}
	total := end.Sub(start)
	scale := func(d time.Duration) float64 {
		if total <= 0 {
			return 0
		}
		return float64(d) / float64(total) * (chartRight - chartLeft)
	}
	c := &Chart{Width: chartWidth, AxisY: chartTop - 6}
	for i := range 5 {
		d := total * time.Duration(i) / 4
		c.Ticks = append(c.Ticks, ChartTick{X: chartLeft + scale(d), Label: waterfall.FormatDuration(d), Class: map[int]string{0: "first", 4: "last"}[i]})
	}
	add := func(r ChartRow, from, dur time.Duration) {
		if len(c.Rows) >= maxChartRows {
			c.Omitted++
			return
		}
		r.Y = chartTop + len(c.Rows)*chartRowH
		r.TextY = r.Y + chartBarH - 3
		r.X = chartLeft + scale(from)
		r.W = max(scale(dur), 2)
		if r.X+r.W > chartRight {
			r.W = max(chartRight-r.X, 2)
		}
		r.AskedW = min(r.AskedW, chartRight-r.X)
		r.DetailX = max(r.X+r.W, r.X+r.AskedW) + 6
		if r.DetailX > chartRight-220 {
			r.DetailX, r.DetailEnd = r.X-6, true
		}
		r.Title = strings.TrimSpace(fmt.Sprintf("%s · +%s · %s %s", r.Label, waterfall.FormatDuration(from), waterfall.FormatDuration(dur), r.Detail))
		c.Rows = append(c.Rows, r)
	}
	children := map[string][]jaeger.Span{}
	byID := map[string]jaeger.Span{}
	for _, s := range t.Spans {
		byID[s.SpanID] = s
	}
	for _, s := range t.Spans {
		if _, ok := byID[s.ParentSpanID]; ok {
			children[s.ParentSpanID] = append(children[s.ParentSpanID], s)
		}
	}
	seen := map[string]bool{}
	var walk func(s jaeger.Span, depth int)
	walk = func(s jaeger.Span, depth int) {
		if seen[s.SpanID] {
			return
		}
		seen[s.SpanID] = true
		indent := 4 + 12*min(depth, 10)
		if p, ok := byID[s.ParentSpanID]; ok && s.Kind() == "consumer" && (p.Kind() == "producer" || waterfall.IsRejection(p)) {
			if wait := s.StartTime.Sub(p.StartTime.Add(p.Duration)); wait > 0 {
				r := ChartRow{Kind: "wait", Label: "waiting", LabelX: indent}
				switch where := p.TagString("messaging.destination.name"); {
				case where == topology.DelayDestination || waterfall.IsRejection(p):
					r.Label = "waiting in the delay"
					if where != topology.DelayDestination {
						r.Label = "held back by " + where
					}
					if asked, ok := delayMS(p); ok {
						r.Detail = "asked " + waterfall.FormatDuration(asked) + ", waited " + waterfall.FormatDuration(wait)
						r.AskedW = scale(asked)
					}
				case strings.HasSuffix(where, topology.DeadLetterSuffix):
					r.Label, r.Detail = "in "+where, "until replayed"
				case where != "":
					r.Label = "waiting in " + where
				}
				from := p.StartTime.Add(p.Duration).Sub(start)
				add(r, from, wait)
			}
		}
		r := ChartRow{Kind: "span", Label: s.OperationName, LabelX: indent}
		_, attempt := s.Tag(string(otelnames.AttrAttempt))
		msg := s.TagString("messaging.message.id")
		switch {
		case attempt && s.Kind() == "consumer":
			r.Kind, r.Attempt = "attempt", s.TagString(string(otelnames.AttrAttempt))
			if s.Failed() {
				r.Kind = "attempt failed"
			}
			r.Label = "attempt " + r.Attempt
			r.Detail = s.TagString(string(otelnames.AttrOutcome))
			if d, ok := delayMS(s); ok && r.Detail == "retry" {
				r.Detail += " in " + waterfall.FormatDuration(d)
			}
			if messageID != "" && msg != "" && msg != messageID {
				r.Detail += " · message " + msg
			}
		case s.Kind() == "producer" && strings.HasSuffix(s.TagString("messaging.destination.name"), topology.DeadLetterSuffix):
			r.Kind, r.Detail = "deadletter", "dead letter"
			if typ := s.TagString(string(otelnames.AttrLastError)); typ != "" {
				r.Detail += " (" + typ + ")"
			}
		case s.TagString("messaging.destination.name") == topology.DelayDestination:
			r.Kind = "delay"
			if d, ok := delayMS(s); ok {
				r.Detail = "delay " + waterfall.FormatDuration(d)
			}
		case waterfall.IsRejection(s):
			r.Kind, r.Detail = "delay", "native retry"
			if d, ok := delayMS(s); ok {
				r.Detail += " · delay " + waterfall.FormatDuration(d)
			}
		}
		add(r, s.StartTime.Sub(start), s.Duration)
		if r.Attempt != "" && (messageID == "" || msg == "" || msg == messageID) {
			c.Attempts++
		}
		for _, k := range children[s.SpanID] {
			walk(k, depth+1)
		}
	}
	for _, s := range t.Spans {
		if _, ok := byID[s.ParentSpanID]; !ok {
			walk(s, 0)
		}
	}
	for _, s := range t.Spans { // spans in a parent cycle
		walk(s, 0)
	}
	c.Height = chartTop + len(c.Rows)*chartRowH + 4
	return c
}

// delayMS is a span's sluice.retry.delay_ms.
func delayMS(s jaeger.Span) (time.Duration, bool) {
	v, ok := s.Tag(string(otelnames.AttrRetryDelayMS))
	if !ok {
		return 0, false
	}
	switch n := v.(type) {
	case int64:
		return time.Duration(n) * time.Millisecond, true
	case float64:
		return time.Duration(n * float64(time.Millisecond)), true
	}
	return 0, false
}
