package otelstep

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/otelnames"
	"github.com/sluice-go/sluice/internal/topology"
)

// Delayer hands a message to the broker to be delivered to queue after d: package
// broker's capability, as the retry step takes it.
type Delayer = broker.Delayer

// DeadLetterer publishes a message to queue's dead-letter queue: package broker's
// capability, as the poison step takes it.
type DeadLetterer = broker.DeadLetterer

// WrapDelayer returns a Delayer that starts a producer span "send sluice.delay" (a child
// of ctx's span, which is the consumer span of the attempt that failed) and injects the
// span's context into msg's headers before handing msg to d. The next attempt's consumer
// span is therefore a child of this hand-off, and all attempts of a message form one
// trace. The span is ended with an error status if d fails.
func (in *Instrumentation) WrapDelayer(d Delayer) Delayer {
	return &delayer{in: in, next: d}
}

// WrapDeadLetterer returns a DeadLetterer that starts a producer span "send <queue>.dlq"
// (a child of ctx's span) and injects its context into msg's headers, so that whatever
// later consumes or replays the dead-lettered message continues the message's trace. The
// span is ended with an error status if d fails.
func (in *Instrumentation) WrapDeadLetterer(d DeadLetterer) DeadLetterer {
	return &deadLetterer{in: in, next: d}
}

// delaySpanName is every retry hand-off's span name, built once.
var delaySpanName = spanName("send", topology.DelayDestination)

type delayer struct {
	in   *Instrumentation
	next Delayer
}

// Delay traces the hand-off of msg to the delay infrastructure.
func (d *delayer) Delay(ctx context.Context, queue string, delay time.Duration, msg *message.Message) error {
	buf := attrPool.Get().(*[]attribute.KeyValue)
	attrs := appendHandOffAttrs(d.in.appendMessageAttrs((*buf)[:0], semconv.MessagingOperationTypeSend, "send", topology.DelayDestination, msg),
		queue, delay, sluice.RetryCount(msg.Metadata)+1)
	defer putAttrs(buf, attrs)
	return d.in.handOff(ctx, delaySpanName, topology.DelayDestination, msg, attrs, func(ctx context.Context) error {
		return d.next.Delay(ctx, queue, delay, msg)
	})
}

// appendHandOffAttrs appends what a retry's hand-off says: the message's queue, the
// delay, and the attempt it hands the message to.
func appendHandOffAttrs(attrs []attribute.KeyValue, queue string, delay time.Duration, next int) []attribute.KeyValue {
	return append(attrs,
		otelnames.AttrQueue.String(queue),
		otelnames.AttrRetryDelayMS.Int64(delay.Milliseconds()),
		otelnames.AttrAttempt.Int(next),
	)
}

type deadLetterer struct {
	in   *Instrumentation
	next DeadLetterer
}

// DeadLetter traces the hand-off of msg to queue's dead-letter queue.
func (d *deadLetterer) DeadLetter(ctx context.Context, queue string, msg *message.Message) error {
	dlq := queue + topology.DeadLetterSuffix
	attrs := append(d.in.messageAttrs(semconv.MessagingOperationTypeSend, "send", dlq, msg),
		otelnames.AttrQueue.String(queue),
		otelnames.AttrAttempt.Int(sluice.RetryCount(msg.Metadata)+1),
	)
	if last := msg.Metadata.Get(sluice.HeaderLastError); last != "" {
		attrs = append(attrs, otelnames.AttrLastError.String(failure.Truncate(last, failure.MaxHistoryMessageBytes)))
	}
	return d.in.handOff(ctx, spanName("send", dlq), dlq, msg, attrs, func(ctx context.Context) error {
		return d.next.DeadLetter(ctx, queue, msg)
	})
}

// handOff runs send inside a producer span whose context is injected into msg first: the
// broker marshals the headers when it publishes, so they must be written before.
func (in *Instrumentation) handOff(ctx context.Context, name, destination string, msg *message.Message,
	attrs []attribute.KeyValue, send func(context.Context) error) error {
	m := in.cur()
	ctx, span := m.tracer.Start(in.parent(msg, ctx, msg.Context()), name,
		producerKind, trace.WithAttributes(attrs...))
	defer span.End()
	in.inject(ctx, msg)
	start := time.Now()
	err := send(ctx)
	in.recordSent(ctx, m, destination, 1, time.Since(start), err)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}
