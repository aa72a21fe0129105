package telemetry

import (
	"fmt"

	"go.opentelemetry.io/otel/attribute"

	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice"
)

// recordError adds the exception event span.RecordError would, with the failure record's
// message: a recovered panic reads "panic: <value>" and its stack goes to
// exception.stacktrace, instead of the whole stack in exception.message.
func recordError(span trace.Span, err error) {
	attrs := []attribute.KeyValue{
		semconv.ExceptionType(fmt.Sprintf("%T", err)),
		semconv.ExceptionMessage(sluice.ErrorMessage(err)),
	}
	if stack, ok := sluice.PanicStack(err); ok {
		attrs = append(attrs, semconv.ExceptionStacktrace(stack))
	}
	span.AddEvent(semconv.ExceptionEventName, trace.WithAttributes(attrs...))
}
