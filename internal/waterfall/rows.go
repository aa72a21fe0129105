package waterfall

import (
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluice-go/sluice/internal/jaeger"
	"github.com/sluice-go/sluice/internal/otelnames"
	"github.com/sluice-go/sluice/internal/topology"
)

// row is one line of the table.
type row struct {
	name     string // tree glyphs, mark and name
	offset   time.Duration
	duration time.Duration
	showDur  bool
	from, to time.Duration // the bar's extent, relative to the trace's start
	fill     rune
	// parts are the text after the bar, joined by " · ".
	parts []string
	// cont is what a line of the row's own below it starts with (the parts that do not
	// fit after the bar, with a line width): the tree's lines carried on, then an indent.
	cont string
}

// detail is the text after the bar, bounded to maxDetail characters.
func (r row) detail() string { return clip(strings.Join(r.parts, " · ")) }

// table writes the column headings and one row per span, wait and event.
func (d *drawing) table(b *strings.Builder) {
	rows := d.rows()
	nameW, offW, durW := len("SPAN"), len("START"), len("DURATION")
	for _, r := range rows {
		nameW = max(nameW, utf8.RuneCountInString(r.name))
		offW = max(offW, len(fmtOffset(r.offset)))
		if r.showDur {
			durW = max(durW, len(FormatDuration(r.duration)))
		}
	}
	// Everything but the name, the timeline and the detail: the gaps, START, DURATION
	// and the timeline's two edges.
	fixed := 2 + offW + 2 + durW + 2 + 2
	if d.lineWidth > 0 {
		// The names are cut when even the narrowest timeline leaves them too little.
		nameW = min(nameW, max(d.lineWidth-fixed-minWidth, len("SPAN")))
		d.width = d.fitWidth(rows, min(d.width, max(d.lineWidth-fixed-nameW, minWidth)), fixed+nameW)
	}
	axis := []rune(strings.Repeat(" ", d.width))
	total := []rune(FormatDuration(d.total))
	if len(total)+2 <= d.width {
		axis[0] = '0'
		copy(axis[d.width-len(total):], total)
	}
	writeLine(b, fmt.Sprintf("%s  %*s  %*s  │%s│", pad("SPAN", nameW), offW, "START", durW, "DURATION", string(axis)))
	for _, r := range rows {
		dur := ""
		if r.showDur {
			dur = FormatDuration(r.duration)
		}
		line := fmt.Sprintf("%s  %*s  %*s  │%s│", pad(cut(r.name, nameW), nameW), offW, fmtOffset(r.offset), durW, dur, d.bar(r))
		if d.lineWidth == 0 {
			if detail := r.detail(); detail != "" {
				line += "  " + detail
			}
			writeLine(b, line)
			continue
		}
		inline, rest := splitParts(r.parts, d.lineWidth-utf8.RuneCountInString(line)-2)
		if inline != "" {
			line += "  " + inline
		}
		writeLine(b, line)
		for _, l := range wrapDetail(rest, d.lineWidth-utf8.RuneCountInString(r.cont)) {
			writeLine(b, r.cont+l)
		}
	}
}

// maxDetailLines bounds the lines a row's detail takes below it, with a line width.
const maxDetailLines = 2

// fitWidth is the widest timeline, from widest down to minWidth cells, that needs the
// fewest lines below the rows for their details: narrowing the timeline lets short
// details (a delay, a wait) stay on their row. others is the width of the rest of a row.
func (d *drawing) fitWidth(rows []row, widest, others int) int {
	best, bestLines := widest, -1
	for w := widest; w >= minWidth; w-- {
		lines := 0
		for _, r := range rows {
			_, rest := splitParts(r.parts, d.lineWidth-others-w-2)
			lines += len(wrapDetail(rest, d.lineWidth-utf8.RuneCountInString(r.cont)))
		}
		if bestLines < 0 || lines < bestLines {
			best, bestLines = w, lines
		}
	}
	return best
}

// splitParts returns the leading parts that fit in room characters, joined, and the
// rest.
func splitParts(parts []string, room int) (inline string, rest []string) {
	for i, p := range parts {
		next := p
		if inline != "" {
			next = inline + " · " + p
		}
		if utf8.RuneCountInString(next) > room {
			return inline, parts[i:]
		}
		inline = next
	}
	return inline, nil
}

// wrapDetail lays parts out on lines of at most width characters, at most
// maxDetailLines of them, the last cut when more would follow. Lines break between parts
// where they can, so a part (an error message) is not split when it fits a line of its own.
func wrapDetail(parts []string, width int) []string {
	var lines []string
	cur := ""
	for _, p := range parts {
		if strings.TrimSpace(p) == "" {
			continue
		}
		switch {
		case cur == "" && utf8.RuneCountInString(p) <= width:
			cur = p
		case cur != "" && utf8.RuneCountInString(cur)+3+utf8.RuneCountInString(p) <= width:
			cur += " · " + p
		case utf8.RuneCountInString(p) <= width:
			lines = append(lines, cur)
			cur = p
		default:
			// Longer than a line: wrapped at spaces, after what the line holds already.
			text := p
			if cur != "" {
				text = cur + " · " + p
			}
			wrapped := wrap(text, width)
			lines = append(lines, wrapped[:len(wrapped)-1]...)
			cur = wrapped[len(wrapped)-1]
		}
	}
	if cur != "" {
		lines = append(lines, cur)
	}
	if len(lines) > maxDetailLines {
		last := lines[maxDetailLines-1]
		lines = lines[:maxDetailLines]
		lines[maxDetailLines-1] = cut(last+" …", width)
	}
	return lines
}

// rows walks the trace depth first from its roots: a row per span, per wait before a
// consumer and per event. With a line width, a span that is its parent's only child is
// drawn at its parent's indentation, so that a message's chain of attempts stays narrow.
func (d *drawing) rows() []row {
	var rows []row
	seen := map[string]bool{}
	var walk func(s jaeger.Span, lead, branch string, onlyChild bool)
	walk = func(s jaeger.Span, lead, branch string, onlyChild bool) {
		if seen[s.SpanID] {
			return
		}
		seen[s.SpanID] = true
		if p, ok := d.t.Span(s.ParentSpanID); ok && s.Kind() == "consumer" && (p.Kind() == "producer" || IsRejection(p)) {
			if wait := s.StartTime.Sub(p.StartTime.Add(p.Duration)); wait > 0 {
				glyph := waitGlyph(branch)
				if onlyChild {
					// Drawn without a branch, the consumer still shows the wait's link.
					glyph = waitGlyph("└─ ")
				}
				w := d.waitRow(lead+glyph, p, s, wait)
				w.cont = lead + glyph
				rows = append(rows, w)
			}
		}
		kids := d.children[s.SpanID]
		below := lead + continuation(branch)
		flat := d.lineWidth > 0 && len(kids) == 1
		r := d.spanRow(lead+branch, s)
		r.cont = below + "   "
		if len(kids) > 0 && !flat {
			r.cont = below + "│  "
		}
		rows = append(rows, r)
		for _, l := range s.Logs {
			if ev := d.eventRow(below, l, len(kids) > 0 && !flat); ev != nil {
				rows = append(rows, *ev)
			}
		}
		for i, c := range kids {
			switch {
			case flat:
				walk(c, below, "", true)
			case i == len(kids)-1:
				walk(c, below, "└─ ", false)
			default:
				walk(c, below, "├─ ", false)
			}
		}
	}
	for _, r := range d.t.Roots() {
		walk(r, "", "", false)
	}
	// Spans in a parent cycle have no root; they are drawn rather than lost.
	for _, s := range d.t.Spans {
		walk(s, "", "", false)
	}
	return rows
}

// writeLine writes line without trailing blanks, so golden files and terminals agree.
func writeLine(b *strings.Builder, line string) {
	b.WriteString(strings.TrimRight(line, " "))
	b.WriteString("\n")
}

// spanRow draws one span.
func (d *drawing) spanRow(tree string, s jaeger.Span) row {
	r := row{
		offset:   s.StartTime.Sub(d.start),
		duration: s.Duration,
		showDur:  true,
		fill:     barSpan,
	}
	r.from, r.to = r.offset, r.offset+s.Duration
	mark := ""
	if s.Failed() {
		mark = markFailed + " "
	}
	var detail []string
	if s.Service != "" && s.Service != d.service {
		detail = append(detail, "["+s.Service+"]")
	}
	if id := messageOf(s); id != "" && id != d.message {
		detail = append(detail, "message "+id)
	}
	if isSluiceAttempt(s) {
		if mark == "" {
			mark = markOK + " "
		}
		detail = append(detail, "attempt "+s.TagString(string(otelnames.AttrAttempt)))
		outcome := s.TagString(string(otelnames.AttrOutcome))
		if delay := delayOf(s); delay != "" {
			switch outcome {
			case "retry":
				outcome += " in " + delay
			case "deferred":
				outcome += " for " + delay
			}
		}
		if outcome != "" {
			detail = append(detail, outcome)
		}
		if reason := s.TagString(string(otelnames.AttrDeferReason)); reason != "" {
			detail = append(detail, reason)
		}
		if text := errorText(s); text != "" {
			detail = append(detail, firstLine(text))
		}
	} else {
		switch {
		case s.TagString("messaging.destination.name") == topology.DelayDestination:
			if delay := delayOf(s); delay != "" {
				detail = append(detail, "delay "+delay)
			}
		case IsRejection(s):
			text := "native retry"
			if delay := delayOf(s); delay != "" {
				text += " · delay " + delay
			}
			detail = append(detail, text)
		case isDeadLetter(s):
			text := "dead letter"
			if typ := s.TagString(string(otelnames.AttrLastError)); typ != "" {
				text += " (error type " + typ + ")"
			}
			detail = append(detail, text)
		}
		if s.Failed() {
			if text := errorText(s); text != "" {
				detail = append(detail, firstLine(text))
			}
		}
	}
	r.name = tree + mark + s.OperationName
	r.parts = detail
	return r
}

// waitRow draws the time a message spent in the broker between a hand-off or publish
// (parent) and the attempt that consumed it.
func (d *drawing) waitRow(tree string, parent, consumer jaeger.Span, wait time.Duration) row {
	from := parent.StartTime.Add(parent.Duration).Sub(d.start)
	r := row{offset: from, duration: wait, showDur: true, from: from, to: from + wait, fill: barWait}
	where := parent.TagString("messaging.destination.name")
	switch {
	case where == topology.DelayDestination:
		r.name = tree + "waiting in the delay"
		if delay := delayOf(parent); delay != "" {
			r.parts = []string{"asked " + delay}
		}
	case IsRejection(parent):
		r.name = tree + "held back by " + where
		if delay := delayOf(parent); delay != "" {
			r.parts = []string{"asked " + delay}
		}
	case where != "":
		r.name = tree + "waiting in " + where
	default:
		r.name = tree + "waiting"
	}
	if isDeadLetter(parent) {
		r.parts = []string{"until replayed"}
	}
	return r
}

// eventRow draws a span event (a breaker or idempotency decision); exceptions are not
// drawn, their message is on the span's own row.
func (d *drawing) eventRow(lead string, l jaeger.Log, more bool) *row {
	name, _ := l.Fields["event"].(string)
	if name == "" || name == "exception" {
		return nil
	}
	// The event belongs to the span: it hangs below it, beside the line to its children.
	glyph := "  "
	if more {
		glyph = "│ "
	}
	at := l.Timestamp.Sub(d.start)
	keys := make([]string, 0, len(l.Fields))
	for k := range l.Fields {
		if k != "event" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	fields := make([]string, len(keys))
	for i, k := range keys {
		fields[i] = fmt.Sprintf("%s=%v", k, l.Fields[k])
	}
	return &row{
		name:   lead + glyph + "• " + name,
		cont:   lead + glyph + "  ",
		offset: at,
		from:   at,
		to:     at,
		fill:   barEvent,
		parts:  []string{firstLine(strings.Join(fields, " "))},
	}
}

// bar draws r's extent on the timeline: a cell is lit if the extent overlaps it, and every
// extent lights at least one cell, so that a span of microseconds is still seen.
func (d *drawing) bar(r row) string {
	cells := []rune(strings.Repeat(" ", d.width))
	total := d.total
	if total <= 0 {
		total = 1
	}
	w := int64(d.width)
	from := int64(r.from) * w / int64(total)
	to := (int64(r.to)*w + int64(total) - 1) / int64(total)
	if to <= from {
		to = from + 1
	}
	from = min(max(from, 0), w-1)
	to = min(max(to, from+1), w)
	for i := from; i < to; i++ {
		cells[i] = r.fill
	}
	return string(cells)
}
