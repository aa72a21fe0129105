package otelstep

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// WrapPublisher returns a publisher that starts a producer span "send <topic>" for every
// message, injects the span's context into the message's traceparent and tracestate
// headers, and ends the span with an error status if pub fails.
//
// A message's span is a child of the span in msg.Context(); if there is none, of the trace
// context already in its headers; else it starts a new trace.
func (in *Instrumentation) WrapPublisher(pub message.Publisher) message.Publisher {
	return &publisher{in: in, pub: pub}
}

type publisher struct {
	in  *Instrumentation
	pub message.Publisher
}

// Publish publishes all messages in one call to the wrapped publisher, so that a
// publisher that pipelines confirms keeps doing so; each message still has its own span.
func (p *publisher) Publish(topic string, msgs ...*message.Message) error {
	m := p.in.cur()
	spans := make([]trace.Span, len(msgs))
	for i, msg := range msgs {
		ctx, span := m.tracer.Start(p.in.parent(msg, msg.Context()), spanName("send", topic),
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(p.in.messageAttrs(semconv.MessagingOperationTypeSend, "send", topic, msg)...))
		p.in.inject(ctx, msg)
		spans[i] = span
	}
	start := time.Now()
	err := p.pub.Publish(topic, msgs...)
	p.in.recordSent(context.Background(), m, topic, len(msgs), time.Since(start), err)
	for _, span := range spans {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
	return err
}

// Close closes the wrapped publisher.
func (p *publisher) Close() error { return p.pub.Close() }
