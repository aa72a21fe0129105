package otelstep

import (
	"sync"

	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// defaultErrorTypeLimit is how many distinct error.type values the metrics of one
// Instrumentation carry before the rest are recorded as ErrorTypeOther.
const defaultErrorTypeLimit = 32

// ErrorTypeOther is the error.type of a metric point whose error type came after the
// limit: the semantic conventions' fallback value.
var ErrorTypeOther = semconv.ErrorTypeOther.Value.AsString()

// errorTypes caps the error.type label: every distinct value is a new time series in
// every metric that carries it, and error types come from handler code (a %T of an
// unwrapped error, a TypedError's name), which an operator does not control. The first
// limit values seen keep their name for the life of the process; later ones become
// ErrorTypeOther, so a bug that mints a type per message costs one series, not millions.
type errorTypes struct {
	limit int

	mu   sync.RWMutex
	seen map[string]struct{}
}

func newErrorTypes(limit int) *errorTypes {
	if limit <= 0 {
		limit = defaultErrorTypeLimit
	}
	return &errorTypes{limit: limit, seen: make(map[string]struct{}, limit)}
}

// label returns t itself while it is one of the first limit types seen, else
// ErrorTypeOther. An empty t stays empty (no error).
func (e *errorTypes) label(t string) string {
	if t == "" {
		return ""
	}
	e.mu.RLock()
	_, ok := e.seen[t]
	n := len(e.seen)
	e.mu.RUnlock()
	if ok {
		return t
	}
	if n >= e.limit {
		return ErrorTypeOther
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.seen[t]; ok {
		return t
	}
	if len(e.seen) >= e.limit {
		return ErrorTypeOther
	}
	e.seen[t] = struct{}{}
	return t
}
