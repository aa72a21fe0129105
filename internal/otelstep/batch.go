package otelstep

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/sluice-go/sluice/internal/otelnames"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// StartBatch starts the span of one call of a batch handler named handler on queue: a
// consumer span of its own trace, linked to the consumer span of every message in msgs
// (each message keeps its own trace across retries, so the batch cannot be the child of
// all of them). end finishes it, recording err, the batch call's own failure (a panic, a
// wrong number of results), if any.
func (in *Instrumentation) StartBatch(ctx context.Context, queue, handler string, msgs []*message.Message) (context.Context, func(err error)) {
	links := make([]trace.Link, 0, len(msgs))
	for _, m := range msgs {
		if sc := trace.SpanContextFromContext(m.Context()); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	ctx = trace.ContextWithSpanContext(ctx, trace.SpanContext{})
	ctx, span := in.cur().tracer.Start(ctx, spanName("process batch", queue),
		trace.WithNewRoot(),
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(links...),
		trace.WithAttributes(in.system,
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingDestinationName(queue),
			semconv.MessagingBatchMessageCount(len(msgs)),
			otelnames.AttrHandler.String(handler)))
	return ctx, func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
