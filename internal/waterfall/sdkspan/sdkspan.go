// Package sdkspan turns spans recorded in the process by the OpenTelemetry SDK into the
// traces package waterfall draws, the way Jaeger stores them: a program can draw its own
// messages' waterfalls, as `sluice trace` draws them from Jaeger, without a Jaeger.
//
// It is a package of its own so that `sluice trace`, which reads Jaeger, does not compile
// the SDK.
package sdkspan

import (
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice/internal/jaeger"
)

// Trace returns the spans of trace id among spans, converted and ordered as Jaeger returns
// them (by start time, then span ID); a trace without spans when none belongs to it.
func Trace(spans []sdktrace.ReadOnlySpan, id trace.TraceID) jaeger.Trace {
	t := jaeger.Trace{TraceID: id.String()}
	for _, s := range spans {
		if s.SpanContext().TraceID() == id {
			t.Spans = append(t.Spans, Span(s))
		}
	}
	slices.SortStableFunc(t.Spans, func(a, b jaeger.Span) int {
		if c := a.StartTime.Compare(b.StartTime); c != 0 {
			return c
		}
		return strings.Compare(a.SpanID, b.SpanID)
	})
	return t
}

// Span converts one span as Jaeger's OTLP receiver does: attributes become tags, beside
// span.kind, otel.scope.name, otel.status_code, otel.status_description and error;
// events become logs named by their "event" field; the parent comes first among the
// references, links follow; the start and the duration are cut to the microsecond.
func Span(s sdktrace.ReadOnlySpan) jaeger.Span {
	sc := s.SpanContext()
	start := s.StartTime().Truncate(time.Microsecond).UTC()
	out := jaeger.Span{
		TraceID:       sc.TraceID().String(),
		SpanID:        sc.SpanID().String(),
		OperationName: s.Name(),
		StartTime:     start,
		Duration:      s.EndTime().Sub(s.StartTime()).Truncate(time.Microsecond),
		Tags:          tags(s.Attributes()),
		ProcessTags:   map[string]any{},
	}
	if p := s.Parent(); p.IsValid() {
		out.ParentSpanID = p.SpanID().String()
		out.References = append(out.References, jaeger.Reference{Type: "CHILD_OF", TraceID: p.TraceID().String(), SpanID: out.ParentSpanID})
	}
	for _, l := range s.Links() {
		out.References = append(out.References, jaeger.Reference{Type: "FOLLOWS_FROM",
			TraceID: l.SpanContext.TraceID().String(), SpanID: l.SpanContext.SpanID().String()})
	}
	if kind := s.SpanKind(); kind != trace.SpanKindUnspecified {
		out.Tags["span.kind"] = kind.String()
	}
	if scope := s.InstrumentationScope(); scope.Name != "" {
		out.Tags["otel.scope.name"] = scope.Name
		if scope.Version != "" {
			out.Tags["otel.scope.version"] = scope.Version
		}
	}
	switch st := s.Status(); st.Code {
	case codes.Error:
		out.Tags["otel.status_code"] = "ERROR"
		out.Tags["error"] = true
		if st.Description != "" {
			out.Tags["otel.status_description"] = st.Description
		}
	case codes.Ok:
		out.Tags["otel.status_code"] = "OK"
	}
	for _, e := range s.Events() {
		fields := tags(e.Attributes)
		fields["event"] = e.Name
		out.Logs = append(out.Logs, jaeger.Log{Timestamp: e.Time.Truncate(time.Microsecond).UTC(), Fields: fields})
	}
	if res := s.Resource(); res != nil {
		for _, kv := range res.Attributes() {
			if kv.Key == semconv.ServiceNameKey {
				out.Service = kv.Value.AsString()
				continue
			}
			out.ProcessTags[string(kv.Key)] = value(kv.Value)
		}
	}
	return out
}

// tags converts attributes to Jaeger's tag values: string, bool, int64, float64, and a
// slice as its text (JSON for a list of strings).
func tags(attrs []attribute.KeyValue) map[string]any {
	out := make(map[string]any, len(attrs)+4)
	for _, kv := range attrs {
		out[string(kv.Key)] = value(kv.Value)
	}
	return out
}

func value(v attribute.Value) any {
	switch v.Type() {
	case attribute.BOOL:
		return v.AsBool()
	case attribute.INT64:
		return v.AsInt64()
	case attribute.FLOAT64:
		return v.AsFloat64()
	case attribute.STRING:
		return v.AsString()
	default:
		return v.String()
	}
}
