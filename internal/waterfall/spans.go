package waterfall

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluice-go/sluice/internal/jaeger"
	"github.com/sluice-go/sluice/internal/otelnames"
	"github.com/sluice-go/sluice/internal/topology"
)

// isSluiceAttempt reports whether s is the consumer span of a delivery attempt that
// sluice's tracing step recorded.
func isSluiceAttempt(s jaeger.Span) bool {
	_, ok := s.Tag(string(otelnames.AttrAttempt))
	return ok && s.Kind() == "consumer"
}

// isDeadLetter reports whether s is a hand-off to a dead-letter queue.
func isDeadLetter(s jaeger.Span) bool {
	return s.Kind() == "producer" && strings.HasSuffix(s.TagString("messaging.destination.name"), topology.DeadLetterSuffix)
}

// IsRejection reports whether s is the rejection of a message into its queue's native
// delayed retry (RabbitMQ 4.3), which telemetry draws as a settle span "reject <queue>".
func IsRejection(s jaeger.Span) bool {
	return s.Kind() == "client" && s.TagString("messaging.operation.name") == "reject"
}

func messageOf(s jaeger.Span) string { return s.TagString("messaging.message.id") }

// delayOf is sluice.retry.delay_ms as a duration, or "".
func delayOf(s jaeger.Span) string {
	v, ok := s.Tag(string(otelnames.AttrRetryDelayMS))
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

// FormatDuration formats d with three significant digits or so, the way people read
// waterfalls: 412µs, 5.16ms, 104.7ms, 1.25s, 2m05s.
func FormatDuration(d time.Duration) string {
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

func fmtOffset(d time.Duration) string { return "+" + FormatDuration(d) }

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

// cut bounds s to n characters, its end replaced by "…" when cut.
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	if n <= 0 {
		return ""
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// wrap breaks line at spaces into lines of at most width characters, the ones after the
// first indented by two; a word longer than a line is cut, and a " · " between two parts
// that falls on a break is dropped.
func wrap(line string, width int) []string {
	var out []string
	cur := ""
	for _, word := range strings.Fields(line) {
		switch {
		case cur == "":
			cur = word
		case utf8.RuneCountInString(cur)+1+utf8.RuneCountInString(word) <= width:
			cur += " " + word
		default:
			// A line ends on a word, not on the dot between two parts.
			out = append(out, strings.TrimSuffix(cur, " ·"))
			cur = "  " + word
		}
	}
	out = append(out, cur)
	for i, l := range out {
		out[i] = cut(l, width)
	}
	return out
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
