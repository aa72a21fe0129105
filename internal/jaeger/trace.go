package jaeger

import (
	"fmt"
	"time"
)

// Trace is one trace with its spans ordered by start time.
type Trace struct {
	// TraceID is 32 lower-case hex digits, as trace.TraceID.String() writes it.
	TraceID string
	// Spans are ordered by start time, then span ID.
	Spans []Span
}

// Span is one span as Jaeger stores it. Jaeger turns OpenTelemetry attributes into tags
// and adds its own: span.kind, otel.scope.name, otel.status_code, otel.status_description
// and error.
type Span struct {
	// TraceID is 32 lower-case hex digits, as trace.TraceID.String() writes it.
	TraceID string
	// SpanID is 16 lower-case hex digits.
	SpanID string
	// ParentSpanID is the span ID of the first reference (Jaeger lists the parent first),
	// or "" for a root span.
	ParentSpanID string
	// References link the span to its parent (and, rarely, other spans).
	References []Reference
	// OperationName is the span name, such as "process orders".
	OperationName string
	// StartTime is when the span started, to the microsecond, in UTC.
	StartTime time.Time
	// Duration is the span's length, to the microsecond.
	Duration time.Duration
	// Tags hold string, bool, int64 or float64 values.
	Tags map[string]any
	// Logs are the span's events, such as "exception".
	Logs []Log
	// Service is the service.name of the process that recorded the span.
	Service string
	// ProcessTags are the other resource attributes of that process.
	ProcessTags map[string]any
	// Warnings are Jaeger's remarks about the span (clock skew, missing parent, ...).
	Warnings []string
}

// Reference links a span to another, usually its parent.
type Reference struct {
	// Type is CHILD_OF or FOLLOWS_FROM.
	Type string
	// TraceID is the referenced span's trace, 32 hex digits.
	TraceID string
	// SpanID is the referenced span, 16 hex digits.
	SpanID string
}

// Log is a span event.
type Log struct {
	// Timestamp is when the event happened, to the microsecond, in UTC.
	Timestamp time.Time
	// Fields hold the event's attributes; the event name is under "event".
	Fields map[string]any
}

// Tag returns the value of the tag key.
func (s Span) Tag(key string) (any, bool) {
	v, ok := s.Tags[key]
	return v, ok
}

// TagString returns the tag key formatted as text, or "" if the span has no such tag.
func (s Span) TagString(key string) string {
	v, ok := s.Tags[key]
	if !ok {
		return ""
	}
	if str, ok := v.(string); ok {
		return str
	}
	return fmt.Sprint(v)
}

// Kind returns the span kind Jaeger recorded: "producer", "consumer", "internal", ...
func (s Span) Kind() string { return s.TagString("span.kind") }

// Failed reports whether the span ended with an error status.
func (s Span) Failed() bool {
	return s.TagString("otel.status_code") == "ERROR" || s.TagString("error") == "true"
}

// Span returns the span with the given ID.
func (t Trace) Span(spanID string) (Span, bool) {
	for _, s := range t.Spans {
		if s.SpanID == spanID {
			return s, true
		}
	}
	return Span{}, false
}

// Roots returns the spans whose parent is not in the trace, in start order.
func (t Trace) Roots() []Span {
	var roots []Span
	for _, s := range t.Spans {
		if _, ok := t.Span(s.ParentSpanID); s.ParentSpanID == "" || !ok {
			roots = append(roots, s)
		}
	}
	return roots
}

// Children returns the spans whose parent is spanID, in start order.
func (t Trace) Children(spanID string) []Span {
	var children []Span
	for _, s := range t.Spans {
		if s.ParentSpanID == spanID {
			children = append(children, s)
		}
	}
	return children
}

// Named returns the spans called operationName, in start order.
func (t Trace) Named(operationName string) []Span {
	var spans []Span
	for _, s := range t.Spans {
		if s.OperationName == operationName {
			spans = append(spans, s)
		}
	}
	return spans
}
