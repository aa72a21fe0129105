package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/jaeger"
	"github.com/sluice-go/sluice/internal/waterfall"
)

// timelineLookback bounds the search of a message's traces by id.
const timelineLookback = 7 * 24 * time.Hour

// jaegerTimeout keeps a slow Jaeger from holding the message page.
const jaegerTimeout = 5 * time.Second

// Timeline is a message's life as Jaeger saw it, or why it is missing.
type Timeline struct {
	// Traces are the message's traces drawn by internal/waterfall (every attempt, each
	// delay asked and waited, the dead letter), oldest first.
	Traces []DrawnTrace
	// Missing says why there is no timeline; empty when Traces is not.
	Missing string
}

// DrawnTrace is one trace and its drawing.
type DrawnTrace struct {
	TraceID string
	// Drawing is the text form (internal/waterfall); Chart the SVG bars.
	Drawing string
	Chart   *Chart
	// UILink is the trace in Jaeger's UI, empty without Config.JaegerUIURL.
	UILink string
}

// timeline asks Jaeger for rec's traces: the one its traceparent names, else those whose
// spans carry its message id.
func (s *Server) timeline(ctx context.Context, rec dlq.Record) Timeline {
	if s.cfg.JaegerQueryURL == "" {
		return Timeline{Missing: "No timeline: Jaeger is not configured (set JAEGER_QUERY_URL to its query API)."}
	}
	ctx, cancel := context.WithTimeout(ctx, jaegerTimeout)
	defer cancel()
	c := &jaeger.Client{BaseURL: s.cfg.JaegerQueryURL, HTTPClient: &http.Client{Timeout: jaegerTimeout}}
	base := s.mask(s.cfg.JaegerQueryURL)
	if _, err := c.Services(ctx); err != nil {
		return Timeline{Missing: fmt.Sprintf("No timeline: Jaeger's query API at %s cannot be reached (%s).", base, s.mask(err.Error()))}
	}
	var traces []jaeger.Trace
	if id := traceIDOf(rec.Headers[headers.TraceParent]); id != "" {
		t, err := c.GetTrace(ctx, id)
		switch {
		case err == nil:
			traces = append(traces, t)
		case !errors.Is(err, jaeger.ErrNotFound):
			return Timeline{Missing: fmt.Sprintf("No timeline: Jaeger at %s failed to return trace %s (%s).", base, id, s.mask(err.Error()))}
		}
	}
	if len(traces) == 0 {
		found, err := c.FindTraces(ctx, s.cfg.Service, map[string]string{"messaging.message.id": rec.ID}, timelineLookback)
		if err != nil && !errors.Is(err, jaeger.ErrNotFound) {
			return Timeline{Missing: fmt.Sprintf("No timeline: searching Jaeger at %s for message %s failed (%s).", base, rec.ID, s.mask(err.Error()))}
		}
		traces = found
	}
	if len(traces) == 0 {
		return Timeline{Missing: fmt.Sprintf("No timeline: Jaeger at %s has no trace of message %s (not its traceparent's, nor one of service %q in the last %s). Spans reach Jaeger seconds after they end, and Jaeger may keep them for less time than a message stays in a DLQ.", base, rec.ID, s.cfg.Service, timelineLookback)}
	}
	var tl Timeline
	for _, t := range traces {
		var b strings.Builder
		if err := waterfall.Render(&b, t, waterfall.Options{Width: waterfall.DefaultWidth, MessageID: rec.ID}); err != nil {
			return Timeline{Missing: fmt.Sprintf("No timeline: drawing trace %s failed (%s).", t.TraceID, err)}
		}
		dt := DrawnTrace{TraceID: t.TraceID, Drawing: b.String(), Chart: newChart(t, rec.ID)}
		if s.cfg.JaegerUIURL != "" {
			dt.UILink = strings.TrimRight(s.cfg.JaegerUIURL, "/") + "/trace/" + t.TraceID
		}
		tl.Traces = append(tl.Traces, dt)
	}
	return tl
}

// traceIDOf returns the trace id of a W3C traceparent, or "".
func traceIDOf(traceparent string) string {
	parts := strings.Split(strings.TrimSpace(traceparent), "-")
	if len(parts) != 4 || len(parts[1]) != 32 || strings.Trim(parts[1], "0") == "" {
		return ""
	}
	for _, r := range parts[1] {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
			return ""
		}
	}
	return parts[1]
}
