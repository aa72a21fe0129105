package telemetry

import (
	"reflect"

	"go.opentelemetry.io/otel/attribute"

	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/failure"
)

// recordError adds the exception event span.RecordError would, with the failure record's
// message: a recovered panic reads "panic: <value>" and its stack goes to
// exception.stacktrace, instead of the whole stack in exception.message.
//
// The type is %T's text, read from reflect as fmt does but without formatting a new string,
// and the slice is attrPool's: the SDK's event copies its attributes.
func recordError(span trace.Span, err error) {
	buf := attrPool.Get().(*[]attribute.KeyValue)
	attrs := append((*buf)[:0],
		semconv.ExceptionType(typeName(err)),
		semconv.ExceptionMessage(sluice.ErrorMessage(err)),
	)
	if stack, ok := failure.Stack(err); ok {
		attrs = append(attrs, semconv.ExceptionStacktrace(stack))
	}
	span.AddEvent(semconv.ExceptionEventName, trace.WithAttributes(attrs...))
	putAttrs(buf, attrs)
}

// typeName is fmt's %T of v.
func typeName(v any) string {
	if v == nil {
		return "<nil>"
	}
	return reflect.TypeOf(v).String()
}
