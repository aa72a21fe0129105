// Package waterfall draws a message's trace, as Jaeger returns it, in the terminal: a
// summary of the message's life (attempts, retries, final outcome, dead letter) and one row
// per span, indented by its parent chain, with a bar scaled to the trace's duration.
//
// Rendering is pure: the output depends only on the trace and the options, so it can be
// compared with golden files.
package waterfall

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluice-go/sluice/telemetry"
	"github.com/sluice-go/sluice/telemetry/jaeger"
)

// DefaultWidth is the timeline's width, in character cells, when Options.Width is zero.
const DefaultWidth = 40

// minWidth keeps the timeline wide enough to tell spans apart.
const minWidth = 10

// maxDetail bounds the text after a row's bar, in characters: an error message can be a
// whole panic stack, and one row must stay one line.
const maxDetail = 120

// Options tune Render.
type Options struct {
	// Width is the timeline's width in character cells. Zero means DefaultWidth; values
	// below 10 mean 10.
	Width int
	// MessageID is the message the summary is about (a trace can also hold the messages a
	// handler published). Empty means the first message the trace shows consumed.
	MessageID string
}

// Glyphs of the drawing.
const (
	markFailed = "✗"
	markOK     = "✓"
	barSpan    = '█'
	barWait    = '░'
	barEvent   = '◆'
)

// Render writes the waterfall of t to w.
func Render(w io.Writer, t jaeger.Trace, opts Options) error {
	width := opts.Width
	switch {
	case width == 0:
		width = DefaultWidth
	case width < minWidth:
		width = minWidth
	}
	var b strings.Builder
	if len(t.Spans) == 0 {
		fmt.Fprintf(&b, "Trace %s has no spans.\n", t.TraceID)
		_, err := io.WriteString(w, b.String())
		return err
	}
	d := newDrawing(t, width, opts.MessageID)
	d.header(&b)
	b.WriteString("\n")
	d.table(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// drawing is one trace being drawn.
type drawing struct {
	t        jaeger.Trace
	width    int
	start    time.Time
	total    time.Duration
	children map[string][]jaeger.Span

	message      string         // the message the summary is about
	service      string         // the service that consumed it
	attempts     []jaeger.Span  // its consumer spans, in start order
	deadLetters  []jaeger.Span  // its dead-letter hand-offs, in start order
	attemptIndex map[string]int // span ID -> index in attempts
}

func newDrawing(t jaeger.Trace, width int, messageID string) *drawing {
	d := &drawing{t: t, width: width, children: map[string][]jaeger.Span{}, attemptIndex: map[string]int{}}
	d.start = t.Spans[0].StartTime
	var end time.Time
	for _, s := range t.Spans {
		if s.StartTime.Before(d.start) {
			d.start = s.StartTime
		}
		if e := s.StartTime.Add(s.Duration); e.After(end) {
			end = e
		}
		if s.ParentSpanID != "" {
			d.children[s.ParentSpanID] = append(d.children[s.ParentSpanID], s)
		}
	}
	d.total = end.Sub(d.start)

	d.message = messageID
	if d.message == "" {
		for _, s := range t.Spans {
			if isSluiceAttempt(s) && messageOf(s) != "" {
				d.message = messageOf(s)
				break
			}
		}
	}
	if d.message == "" {
		for _, s := range t.Spans {
			if id := messageOf(s); id != "" {
				d.message = id
				break
			}
		}
	}
	for _, s := range t.Spans {
		if d.message != "" && messageOf(s) != d.message {
			continue
		}
		switch {
		case isSluiceAttempt(s):
			d.attemptIndex[s.SpanID] = len(d.attempts)
			d.attempts = append(d.attempts, s)
		case isDeadLetter(s):
			d.deadLetters = append(d.deadLetters, s)
		}
	}
	switch {
	case len(d.attempts) > 0:
		d.service = d.attempts[0].Service
	default:
		d.service = t.Spans[0].Service
	}
	return d
}

// header writes the summary lines above the table.
func (d *drawing) header(b *strings.Builder) {
	fmt.Fprintf(b, "Trace %s\n", d.t.TraceID)
	var about []string
	if d.message != "" {
		about = append(about, "message "+d.message)
	}
	if len(d.attempts) > 0 {
		if q := d.attempts[0].TagString("messaging.destination.name"); q != "" {
			about = append(about, "queue "+q)
		}
	}
	if d.service != "" {
		about = append(about, "service "+d.service)
	}
	if len(about) > 0 {
		b.WriteString(upperFirst(strings.Join(about, " · ")) + "\n")
	}
	fmt.Fprintf(b, "Started %s · took %s · %s\n", d.start.UTC().Format("2006-01-02 15:04:05.000000 MST"),
		fmtDuration(d.total), plural(len(d.t.Spans), "span", "spans"))
	missing := map[string]bool{}
	for _, r := range d.t.Roots() {
		if r.ParentSpanID != "" && !missing[r.ParentSpanID] {
			missing[r.ParentSpanID] = true
			fmt.Fprintf(b, "Continued from span %s, which is not in this trace (a producer outside sluice, or not in Jaeger yet)\n", r.ParentSpanID)
		}
	}
	b.WriteString(d.outcome() + "\n")
	for _, dl := range d.deadLetters {
		line := fmt.Sprintf("Dead letter: sent to %s at +%s", dl.TagString("messaging.destination.name"), fmtDuration(dl.StartTime.Sub(d.start)))
		if i, ok := d.attemptIndex[dl.ParentSpanID]; ok {
			line += " by attempt " + d.attempts[i].TagString(string(telemetry.AttrAttempt))
		}
		if dl.Failed() {
			line += " " + markFailed + " the publish failed: " + firstLine(errorText(dl))
		}
		// A replay keeps the dead letter's trace context: the next attempt is its child.
		for _, c := range d.children[dl.SpanID] {
			if isSluiceAttempt(c) {
				line += fmt.Sprintf(", replayed %s later", fmtDuration(c.StartTime.Sub(dl.StartTime.Add(dl.Duration))))
				break
			}
		}
		b.WriteString(line + "\n")
	}
}

// outcome is the summary's verdict: how the last attempt ended, after how many.
func (d *drawing) outcome() string {
	if len(d.attempts) == 0 {
		return "Outcome: not consumed (no attempt in this trace)"
	}
	last := d.attempts[len(d.attempts)-1]
	mark := markOK
	if last.Failed() {
		mark = markFailed
	}
	outcome := last.TagString(string(telemetry.AttrOutcome))
	if outcome == "" {
		outcome = "unknown"
	}
	var retries, deferrals int
	for _, a := range d.attempts {
		switch a.TagString(string(telemetry.AttrOutcome)) {
		case "retry":
			retries++
		case "deferred":
			deferrals++
		}
	}
	var extra []string
	if retries > 0 {
		extra = append(extra, plural(retries, "retry", "retries"))
	}
	if deferrals > 0 {
		extra = append(extra, plural(deferrals, "deferral", "deferrals"))
	}
	s := fmt.Sprintf("Outcome: %s %s after %s", mark, outcome, plural(len(d.attempts), "attempt", "attempts"))
	if len(extra) > 0 {
		s += " (" + strings.Join(extra, ", ") + ")"
	}
	return s
}

// row is one line of the table.
type row struct {
	name     string // tree glyphs, mark and name
	offset   time.Duration
	duration time.Duration
	showDur  bool
	from, to time.Duration // the bar's extent, relative to the trace's start
	fill     rune
	detail   string
}

// table writes the column headings and one row per span, wait and event.
func (d *drawing) table(b *strings.Builder) {
	var rows []row
	seen := map[string]bool{}
	var walk func(s jaeger.Span, lead, branch string)
	walk = func(s jaeger.Span, lead, branch string) {
		if seen[s.SpanID] {
			return
		}
		seen[s.SpanID] = true
		if p, ok := d.t.Span(s.ParentSpanID); ok && s.Kind() == "consumer" && p.Kind() == "producer" {
			if wait := s.StartTime.Sub(p.StartTime.Add(p.Duration)); wait > 0 {
				rows = append(rows, d.waitRow(lead+waitGlyph(branch), p, s, wait))
			}
		}
		rows = append(rows, d.spanRow(lead+branch, s))
		kids := d.children[s.SpanID]
		below := lead + continuation(branch)
		for _, l := range s.Logs {
			if ev := d.eventRow(below, l, len(kids) > 0); ev != nil {
				rows = append(rows, *ev)
			}
		}
		for i, c := range kids {
			if i == len(kids)-1 {
				walk(c, below, "└─ ")
			} else {
				walk(c, below, "├─ ")
			}
		}
	}
	for _, r := range d.t.Roots() {
		walk(r, "", "")
	}
	// Spans in a parent cycle have no root; they are drawn rather than lost.
	for _, s := range d.t.Spans {
		walk(s, "", "")
	}

	nameW, offW, durW := len("SPAN"), len("START"), len("DURATION")
	for _, r := range rows {
		nameW = max(nameW, utf8.RuneCountInString(r.name))
		offW = max(offW, len(fmtOffset(r.offset)))
		if r.showDur {
			durW = max(durW, len(fmtDuration(r.duration)))
		}
	}
	axis := []rune(strings.Repeat(" ", d.width))
	total := []rune(fmtDuration(d.total))
	if len(total)+2 <= d.width {
		axis[0] = '0'
		copy(axis[d.width-len(total):], total)
	}
	writeLine(b, fmt.Sprintf("%s  %*s  %*s  │%s│", pad("SPAN", nameW), offW, "START", durW, "DURATION", string(axis)))
	for _, r := range rows {
		dur := ""
		if r.showDur {
			dur = fmtDuration(r.duration)
		}
		line := fmt.Sprintf("%s  %*s  %*s  │%s│", pad(r.name, nameW), offW, fmtOffset(r.offset), durW, dur, d.bar(r))
		if r.detail != "" {
			line += "  " + r.detail
		}
		writeLine(b, line)
	}
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
		detail = append(detail, "attempt "+s.TagString(string(telemetry.AttrAttempt)))
		outcome := s.TagString(string(telemetry.AttrOutcome))
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
		if reason := s.TagString(string(telemetry.AttrDeferReason)); reason != "" {
			detail = append(detail, reason)
		}
		if text := errorText(s); text != "" {
			detail = append(detail, firstLine(text))
		}
	} else {
		switch {
		case s.TagString("messaging.destination.name") == telemetry.DelayDestination:
			if delay := delayOf(s); delay != "" {
				detail = append(detail, "delay "+delay)
			}
		case isDeadLetter(s):
			text := "dead letter"
			if typ := s.TagString(string(telemetry.AttrLastError)); typ != "" {
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
	r.detail = clip(strings.Join(detail, " · "))
	return r
}

// waitRow draws the time a message spent in the broker between a hand-off or publish
// (parent) and the attempt that consumed it.
func (d *drawing) waitRow(tree string, parent, consumer jaeger.Span, wait time.Duration) row {
	from := parent.StartTime.Add(parent.Duration).Sub(d.start)
	r := row{offset: from, duration: wait, showDur: true, from: from, to: from + wait, fill: barWait}
	where := parent.TagString("messaging.destination.name")
	switch {
	case where == telemetry.DelayDestination:
		r.name = tree + "waiting in the delay"
		if delay := delayOf(parent); delay != "" {
			r.detail = "asked " + delay
		}
	case where != "":
		r.name = tree + "waiting in " + where
	default:
		r.name = tree + "waiting"
	}
	if isDeadLetter(parent) {
		r.detail = "until replayed"
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
		offset: at,
		from:   at,
		to:     at,
		fill:   barEvent,
		detail: clip(firstLine(strings.Join(fields, " "))),
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

// isSluiceAttempt reports whether s is the consumer span of a delivery attempt that
// sluice's tracing step recorded.
func isSluiceAttempt(s jaeger.Span) bool {
	_, ok := s.Tag(string(telemetry.AttrAttempt))
	return ok && s.Kind() == "consumer"
}

// isDeadLetter reports whether s is a hand-off to a dead-letter queue.
func isDeadLetter(s jaeger.Span) bool {
	return s.Kind() == "producer" && strings.HasSuffix(s.TagString("messaging.destination.name"), telemetry.DeadLetterSuffix)
}

func messageOf(s jaeger.Span) string { return s.TagString("messaging.message.id") }

// delayOf is sluice.retry.delay_ms as a duration, or "".
func delayOf(s jaeger.Span) string {
	v, ok := s.Tag(string(telemetry.AttrRetryDelayMS))
	if !ok {
		return ""
	}
	ms, ok := v.(int64)
	if !ok {
		return fmt.Sprintf("%vms", v)
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

// errorText is why s failed: its status description, else the message of its exception
// event (a discarded message records its error without an error status).
func errorText(s jaeger.Span) string {
	if text := s.TagString("otel.status_description"); text != "" {
		return text
	}
	for _, l := range s.Logs {
		if l.Fields["event"] == "exception" {
			if m, ok := l.Fields["exception.message"].(string); ok {
				return m
			}
		}
	}
	return ""
}

// continuation is what the rows below a span draw in its branch's place.
func continuation(branch string) string {
	switch branch {
	case "├─ ":
		return "│  "
	case "└─ ":
		return "   "
	}
	return ""
}

// waitGlyph is drawn in a branch's place on the row of the wait before it.
func waitGlyph(branch string) string {
	if branch == "" {
		return ""
	}
	return "┆  "
}

// fmtDuration formats d with three significant digits or so, the way people read
// waterfalls: 412µs, 5.16ms, 104.7ms, 1.25s, 2m05s.
func fmtDuration(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	case d < time.Minute:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	default:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
}

func fmtOffset(d time.Duration) string { return "+" + fmtDuration(d) }

// pad left-aligns s in n characters (runes: every glyph used here is one cell wide).
func pad(s string, n int) string {
	if k := utf8.RuneCountInString(s); k < n {
		return s + strings.Repeat(" ", n-k)
	}
	return s
}

// firstLine is the first non-empty line of s, marked when more follow.
func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		return strings.TrimSpace(s[:i]) + " …"
	}
	return s
}

// clip bounds s to maxDetail characters.
func clip(s string) string {
	if utf8.RuneCountInString(s) <= maxDetail {
		return s
	}
	r := []rune(s)
	return string(r[:maxDetail-1]) + "…"
}

func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	r, n := utf8.DecodeRuneInString(s)
	return strings.ToUpper(string(r)) + s[n:]
}
