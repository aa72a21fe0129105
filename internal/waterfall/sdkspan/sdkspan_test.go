package sdkspan_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice/internal/waterfall"
	"github.com/sluice-go/sluice/internal/waterfall/sdkspan"
)

// record runs f with a tracer of a provider whose spans a recorder keeps, as service
// "payments", and returns the spans.
func record(t *testing.T, f func(tr trace.Tracer)) []sdktrace.ReadOnlySpan {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	res := resource.NewSchemaless(semconv.ServiceName("payments"), attribute.String("host.name", "box"))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithResource(res))
	defer func() { require.NoError(t, tp.Shutdown(context.Background())) }()
	f(tp.Tracer("github.com/sluice-go/sluice/telemetry"))
	return rec.Ended()
}

func TestSpan_AsJaegerStoresIt(t *testing.T) {
	start := time.Date(2026, 12, 6, 10, 0, 0, 123_456_789, time.UTC)
	var parent, child, linked trace.SpanContext
	spans := record(t, func(tr trace.Tracer) {
		_, l := tr.Start(context.Background(), "elsewhere")
		linked = l.SpanContext()
		l.End()
		ctx, p := tr.Start(context.Background(), "send payments.requested", trace.WithSpanKind(trace.SpanKindProducer), trace.WithTimestamp(start))
		parent = p.SpanContext()
		_, c := tr.Start(ctx, "process payments.requested", trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithTimestamp(start.Add(2*time.Millisecond)), trace.WithLinks(trace.Link{SpanContext: linked}),
			trace.WithAttributes(attribute.Int("sluice.attempt", 2), attribute.String("sluice.outcome", "retry"),
				attribute.Bool("flag", true), attribute.Float64("ratio", 0.5), attribute.StringSlice("tags", []string{"a", "b"})))
		child = c.SpanContext()
		c.RecordError(errors.New("gateway timeout"), trace.WithTimestamp(start.Add(3*time.Millisecond)))
		c.SetStatus(codes.Error, "gateway timeout")
		c.End(trace.WithTimestamp(start.Add(5*time.Millisecond + 999*time.Nanosecond)))
		p.SetStatus(codes.Ok, "")
		p.End(trace.WithTimestamp(start.Add(6 * time.Millisecond)))
	})

	tr := sdkspan.Trace(spans, parent.TraceID())
	assert.Equal(t, parent.TraceID().String(), tr.TraceID)
	require.Len(t, tr.Spans, 2, "the linked span is in another trace")
	p, c := tr.Spans[0], tr.Spans[1]

	assert.Equal(t, "send payments.requested", p.OperationName)
	assert.Empty(t, p.ParentSpanID)
	assert.Equal(t, "producer", p.Kind())
	assert.Equal(t, "OK", p.TagString("otel.status_code"))
	assert.False(t, p.Failed())
	assert.Equal(t, start.Truncate(time.Microsecond), p.StartTime, "to the microsecond, in UTC")
	assert.Equal(t, 6*time.Millisecond, p.Duration)

	assert.Equal(t, child.SpanID().String(), c.SpanID)
	assert.Equal(t, parent.SpanID().String(), c.ParentSpanID)
	require.Len(t, c.References, 2)
	assert.Equal(t, "CHILD_OF", c.References[0].Type, "the parent first")
	assert.Equal(t, "FOLLOWS_FROM", c.References[1].Type)
	assert.Equal(t, linked.SpanID().String(), c.References[1].SpanID)
	assert.Equal(t, "consumer", c.Kind())
	assert.True(t, c.Failed())
	assert.Equal(t, true, c.Tags["error"])
	assert.Equal(t, "gateway timeout", c.TagString("otel.status_description"))
	assert.Equal(t, "github.com/sluice-go/sluice/telemetry", c.TagString("otel.scope.name"))
	assert.Equal(t, int64(2), c.Tags["sluice.attempt"], "ints are int64, as Jaeger's client reads them")
	assert.Equal(t, true, c.Tags["flag"])
	assert.Equal(t, 0.5, c.Tags["ratio"])
	assert.Equal(t, `["a","b"]`, c.Tags["tags"])
	assert.Equal(t, 3*time.Millisecond, c.Duration, "the duration cut to the microsecond, as Jaeger stores it")
	require.Len(t, c.Logs, 1)
	assert.Equal(t, "exception", c.Logs[0].Fields["event"])
	assert.Equal(t, "gateway timeout", c.Logs[0].Fields["exception.message"])
	assert.Equal(t, start.Add(3*time.Millisecond).Truncate(time.Microsecond), c.Logs[0].Timestamp)
	assert.Equal(t, "payments", c.Service)
	assert.Equal(t, "box", c.ProcessTags["host.name"])
	assert.NotContains(t, c.ProcessTags, "service.name", "service.name is the span's Service")

	// The renderer reads it as it reads Jaeger's: the attempt, its outcome and error.
	var out bytes.Buffer
	require.NoError(t, waterfall.Render(&out, tr, waterfall.Options{}))
	assert.Contains(t, out.String(), "Outcome: ✗ retry after 1 attempt (1 retry)")
	assert.Contains(t, out.String(), "attempt 2 · retry · gateway timeout")
}

func TestTrace_NoSpans(t *testing.T) {
	spans := record(t, func(tr trace.Tracer) {
		_, s := tr.Start(context.Background(), "other")
		s.End()
	})
	id := trace.TraceID{1}
	tr := sdkspan.Trace(spans, id)
	assert.Equal(t, id.String(), tr.TraceID)
	assert.Empty(t, tr.Spans)
}
