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
	"strings"
	"time"

	"github.com/sluice-go/sluice/internal/jaeger"
	"github.com/sluice-go/sluice/internal/otelnames"
)

// DefaultWidth is the timeline's width, in character cells, when Options.Width is zero.
const DefaultWidth = 40

// minWidth keeps the timeline wide enough to tell spans apart.
const minWidth = 10

// MinLineWidth is the narrowest Options.LineWidth: room for a name, the times and a
// timeline of 10 cells.
const MinLineWidth = 60

// maxDetail bounds the text after a row's bar, in characters: an error message can be a
// whole panic stack, and one row must stay one line.
const maxDetail = 120

// Options tune Render.
type Options struct {
	// Width is the timeline's width in character cells. Zero means DefaultWidth; values
	// below 10 mean 10.
	Width int
	// LineWidth, when positive, fits every line in that many character cells (an
	// 80-column terminal): a span that is its parent's only child is drawn at its
	// parent's indentation rather than one step deeper, the timeline narrows (down to 10
	// cells) and then the names are cut, a row's detail that does not fit after its bar
	// goes on the line below it, and the summary's lines wrap. Values below
	// MinLineWidth mean MinLineWidth. Zero draws each row on one line, however wide.
	LineWidth int
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
	if opts.LineWidth > 0 {
		d.lineWidth = max(opts.LineWidth, MinLineWidth)
	}
	d.header(&b)
	b.WriteString("\n")
	d.table(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// drawing is one trace being drawn.
type drawing struct {
	t     jaeger.Trace
	width int
	// lineWidth bounds every line when positive (Options.LineWidth).
	lineWidth int
	start     time.Time
	total     time.Duration
	children  map[string][]jaeger.Span

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
	put := func(line string) {
		if d.lineWidth == 0 {
			b.WriteString(line + "\n")
			return
		}
		for _, l := range wrap(line, d.lineWidth) {
			b.WriteString(l + "\n")
		}
	}
	put("Trace " + d.t.TraceID)
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
		put(upperFirst(strings.Join(about, " · ")))
	}
	put(fmt.Sprintf("Started %s · took %s · %s", d.start.UTC().Format("2006-01-02 15:04:05.000000 MST"),
		FormatDuration(d.total), plural(len(d.t.Spans), "span", "spans")))
	missing := map[string]bool{}
	for _, r := range d.t.Roots() {
		if r.ParentSpanID != "" && !missing[r.ParentSpanID] {
			missing[r.ParentSpanID] = true
			put(fmt.Sprintf("Continued from span %s, which is not in this trace (a producer outside sluice, or not in Jaeger yet)", r.ParentSpanID))
		}
	}
	put(d.outcome())
	for _, dl := range d.deadLetters {
		line := fmt.Sprintf("Dead letter: sent to %s at +%s", dl.TagString("messaging.destination.name"), FormatDuration(dl.StartTime.Sub(d.start)))
		if i, ok := d.attemptIndex[dl.ParentSpanID]; ok {
			line += " by attempt " + d.attempts[i].TagString(string(otelnames.AttrAttempt))
		}
		if dl.Failed() {
			line += " " + markFailed + " the publish failed: " + firstLine(errorText(dl))
		}
		// A replay keeps the dead letter's trace context: the next attempt is its child.
		for _, c := range d.children[dl.SpanID] {
			if isSluiceAttempt(c) {
				line += fmt.Sprintf(", replayed %s later", FormatDuration(c.StartTime.Sub(dl.StartTime.Add(dl.Duration))))
				break
			}
		}
		put(line)
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
	outcome := last.TagString(string(otelnames.AttrOutcome))
	if outcome == "" {
		outcome = "unknown"
	}
	var retries, deferrals int
	for _, a := range d.attempts {
		switch a.TagString(string(otelnames.AttrOutcome)) {
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
