package otelstep

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-go/sluice/internal/otelnames"
	"github.com/sluice-go/sluice/internal/topology"
)

// LogLimit bounds the info lines an Instrumentation writes for retries and dead letters:
// at most Lines in each Interval (a fixed window); Config.EventLogLines and
// EventLogInterval. Zero Lines means 10, negative writes none; zero Interval means one
// second.
type LogLimit struct {
	Lines    int
	Interval time.Duration
}

// defaultLogLimit is 10 lines a second: a person can still read a burst, and a storm of
// thousands of failures a second costs 36,000 lines an hour, not millions.
var defaultLogLimit = LogLimit{Lines: 10, Interval: time.Second}

func (l LogLimit) withDefaults() LogLimit {
	if l.Lines == 0 {
		l.Lines = defaultLogLimit.Lines
	}
	if l.Interval <= 0 {
		l.Interval = defaultLogLimit.Interval
	}
	return l
}

// eventLog writes one info line per retry hand-off and dead letter, so an operator can
// follow a message without debug logs, and drops the lines beyond the limit. Dropped
// lines are counted in otelnames.MetricLogDropped and summed up in one warning when the next
// window opens (written on the next event, so no timer outlives the Instrumentation).
type eventLog struct {
	logger *slog.Logger
	limit  LogLimit
	now    func() time.Time
	// attrs are each event's option as the slice Add takes: one built per call allocates.
	attrs map[string][]metric.AddOption

	mu          sync.Mutex
	windowStart time.Time
	used        int
	pending     int64 // dropped since the last summary
}

func newEventLog(logger *slog.Logger, limit LogLimit) *eventLog {
	if logger == nil {
		logger = slog.Default()
	}
	return &eventLog{
		logger: logger,
		limit:  limit.withDefaults(),
		now:    time.Now,
		attrs: map[string][]metric.AddOption{
			outcomeRetry:      {metric.WithAttributes(attribute.String(otelnames.MetricAttrEvent, outcomeRetry))},
			outcomeDeadLetter: {metric.WithAttributes(attribute.String(otelnames.MetricAttrEvent, outcomeDeadLetter))},
		},
	}
}

// createInstruments creates the dropped lines' counter on m.
func (l *eventLog) createInstruments(m *instruments) error {
	c, err := m.meter.Int64Counter(otelnames.MetricLogDropped,
		metric.WithDescription("Retry and dead-letter log lines dropped by the rate limit."),
		metric.WithUnit("{line}"))
	if err != nil {
		return fmt.Errorf("create counter %s: %w", otelnames.MetricLogDropped, err)
	}
	// Both series exist from the start, at 0, so a dashboard or alert reads 0, not nothing.
	for _, opts := range l.attrs {
		c.Add(context.Background(), 0, opts...)
	}
	m.logDropped = c
	return nil
}

// allow reports whether a line may be written now, and how many were dropped before it
// in windows now closed (to be summed up first).
func (l *eventLog) allow(now time.Time) (ok bool, summary int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.windowStart) >= l.limit.Interval {
		l.windowStart, l.used = now, 0
		summary, l.pending = l.pending, 0
	}
	if l.used >= l.limit.Lines {
		l.pending++
		return false, summary
	}
	l.used++
	return true, summary
}

// record logs a retry hand-off or a dead letter of message id.
func (l *eventLog) record(ctx context.Context, dropped metric.Int64Counter, queue, handler, id string, rep attemptReport, errType string) {
	ok, summary := l.allow(l.now())
	if summary > 0 {
		l.logger.LogAttrs(ctx, slog.LevelWarn, "retry and dead-letter log lines dropped by the rate limit",
			slog.Int64("dropped", summary), slog.Int("limit_lines", l.limit.Lines), slog.Duration("limit_interval", l.limit.Interval))
	}
	if !ok {
		dropped.Add(ctx, 1, l.attrs[rep.Outcome]...)
		return
	}
	attrs := []slog.Attr{
		slog.String("queue", queue),
		slog.String("message_id", id),
		slog.Int("attempt", rep.Attempt),
		slog.String("error_type", errType),
	}
	if handler != "" {
		attrs = append(attrs, slog.String("handler", handler))
	}
	msg := "message dead-lettered"
	if rep.Outcome == outcomeRetry {
		msg = "message handed to the broker for a retry"
		attrs = append(attrs, slog.Duration("delay", rep.Delay))
	} else {
		attrs = append(attrs, slog.String("dlq", queue+topology.DeadLetterSuffix))
	}
	l.logger.LogAttrs(ctx, slog.LevelInfo, msg, attrs...)
}
