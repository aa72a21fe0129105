package otelstep

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/otelnames"
)

// errPanicked is recorded on the span of an attempt whose handler panicked past every
// recoverer; the panic itself keeps unwinding.
var errPanicked = errors.New("handler panicked")

// noExemplar is the context of the measurements that carry no exemplar: the SDK's default
// exemplar filter (trace_based) offers every measurement made in a sampled span's context
// to a reservoir, a clock read and a lock each. Only the two duration histograms
// (sluice.handler.duration and messaging.process.duration) get the span's context, so a
// slow attempt still links to its trace; a count needs no example. (The counters of every
// attempt are observed, flow.go, and carry none anyway.)
var noExemplar = context.Background()

// consumerKind and producerKind are built once: an option boxed per call is an
// allocation per span.
var (
	consumerKind = trace.WithSpanKind(trace.SpanKindConsumer)
	producerKind = trace.WithSpanKind(trace.SpanKindProducer)
)

// Middleware is a watermill message.HandlerMiddleware that must be the outermost step of
// the stack. For every delivery attempt it:
//
//   - extracts the trace context from the message's traceparent and tracestate headers
//     (and only from them: a span in the subscriber's context is not a parent). An absent
//     or invalid traceparent starts a new trace; it is not an error. A redelivery that
//     this instance rejected into its queue's native delayed retry continues from the
//     rejection's span instead (heldback.go);
//   - starts a consumer span "process <queue>", the queue being
//     message.SubscribeTopicFromCtx, with the attributes a sampler may decide on
//     (messaging.system, messaging.operation.type and .name, messaging.destination.name),
//     and puts the attempt's private state into the context, where Observe (the
//     disposition.Observer the stack gives the retry and idempotency steps) finds it; both
//     are set on the message with msg.SetContext before h runs;
//   - after h returns, if the span is sampled, sets the message's attributes (body size,
//     message id, routing key, attempt, handler) and those of the observed outcome
//     (disposition.Outcome): the attempt number (x-retry-count + 1 when none was
//     observed), the outcome (when none was observed, "ack" for a nil error, "nack" otherwise) and
//     the retry delay, and marks the span as failed (error status and the error recorded)
//     for the outcomes retry, dead_letter and nack or a non-nil error;
//   - records the sluice.* and messaging metrics, sampled or not.
//
// Output messages that h returns without a span in their context get the consumer span as
// parent, so that the publisher decorator continues the trace.
func (in *Instrumentation) Middleware(h message.HandlerFunc) message.HandlerFunc {
	// last is the flow of the previous attempt: a stack's handler has one queue and one
	// name, so only its first attempt looks its flow up.
	var last atomic.Pointer[flow]
	return func(msg *message.Message) ([]*message.Message, error) {
		start := time.Now()
		base := msg.Context()
		queue := message.SubscribeTopicFromCtx(base)
		handler := message.HandlerNameFromCtx(base)
		f := last.Load()
		if f == nil || f.queue != queue || f.handler != handler {
			f = in.flowFor(queue, handler)
			last.Store(f)
		}
		attempt := sluice.RetryCount(msg.Metadata) + 1

		// A span in base is the subscriber's (from whatever context ran the router), not
		// this message's: drop it, or every message would join one trace.
		// Most subscribers run without one; clearing it costs two allocations.
		parent := base
		if trace.SpanContextFromContext(base).IsValid() {
			parent = trace.ContextWithSpanContext(base, trace.SpanContext{})
		}
		parent = in.propagator().Extract(parent, metadataCarrier(msg.Metadata))
		// A native retry comes back with the headers it first had: its hand-off is known
		// only to the instance that rejected it (heldback.go).
		parent = in.heldBackParent(parent, queue, msg)
		// The span starts with the attributes a sampler may decide on (the conventions'
		// "at creation" ones, the same for every attempt of the flow); the message's own
		// go on in finish, and only if the span records: an unsampled attempt builds none.
		m := in.cur() // one set of instruments for the whole attempt, whatever Rebind does
		ctx, span := m.tracer.Start(parent, f.spanName, f.startOpts...)

		ctx, observed := newAttemptContext(ctx, msg)
		msg.SetContext(ctx)

		f.consumed.n.Add(1)
		f.inFlight.Add(1)
		finished := false
		defer func() {
			f.inFlight.Add(-1)
			if !finished {
				// The panic keeps unwinding; the span and metrics must not be lost with it.
				in.finish(ctx, m, span, f, start, msg, attemptReport{Outcome: outcomeNack, Attempt: attempt, Err: errPanicked}, errPanicked)
			}
		}()

		outs, err := h(msg)
		finished = true

		rep, _ := observed.get()
		if rep.Attempt == 0 {
			rep.Attempt = attempt
		}
		if rep.Outcome == "" {
			rep.Outcome = outcomeAck
			if err != nil {
				rep.Outcome = outcomeNack
			}
		}
		in.finish(ctx, m, span, f, start, msg, rep, err)

		for _, out := range outs {
			if out != nil && !trace.SpanContextFromContext(out.Context()).IsValid() {
				out.SetContext(trace.ContextWithSpan(out.Context(), span))
			}
		}
		return outs, err
	}
}

// finish sets the message's and the outcome's attributes and the status on span, ends it,
// records metrics and logs a retry hand-off or dead letter of msg.
func (in *Instrumentation) finish(ctx context.Context, m *instruments, span trace.Span, f *flow, start time.Time,
	msg *message.Message, rep attemptReport, err error) {
	recording := span.IsRecording()
	var attrs []attribute.KeyValue
	var buf *[]attribute.KeyValue
	if recording {
		// One SetAttributes call: each one copies the span's attributes to make room.
		buf = attrPool.Get().(*[]attribute.KeyValue)
		// The observed attempt number: a native retry's counts the queue's redeliveries,
		// which x-retry-count alone does not.
		attrs = in.appendProcessAttrs((*buf)[:0], f, msg, rep.Attempt)
		attrs = append(attrs, otelnames.AttrOutcome.String(rep.Outcome))
		if rep.Delay > 0 {
			attrs = append(attrs, otelnames.AttrRetryDelayMS.Int64(rep.Delay.Milliseconds()))
		}
	}

	cause := rep.Err
	if cause == nil {
		cause = err
	}
	failedType := "" // error.type of a failed attempt, for the metrics
	switch {
	case rep.Outcome == outcomeRetry || rep.Outcome == outcomeDeadLetter ||
		rep.Outcome == outcomeNack || err != nil:
		if cause == nil {
			// A step reported a failure without saying why; the span must still say failed.
			cause = errors.New(rep.Outcome)
		}
		failedType = sluice.ErrorType(cause)
		if recording {
			recordError(span, cause)
			attrs = append(attrs, semconv.ErrorTypeKey.String(failedType))
			span.SetStatus(codes.Error, sluice.ErrorMessage(cause))
		}
	case rep.Outcome == outcomeDeferred:
		// A deferral is not a failure: say why, without an error status.
		if recording && cause != nil {
			attrs = append(attrs, otelnames.AttrDeferReason.String(failure.Truncate(cause.Error(), failure.MaxErrorMessageBytes)))
		}
	case rep.Outcome == outcomeDiscard && cause != nil:
		// Discarded on purpose: keep the error on the span, but the attempt did what it should.
		if recording {
			recordError(span, cause)
			attrs = append(attrs, semconv.ErrorTypeKey.String(sluice.ErrorType(cause)))
		}
	}
	if recording {
		span.SetAttributes(attrs...) // the span copies them
		putAttrs(buf, attrs)
	}
	span.End()

	elapsed := time.Since(start).Seconds()
	f.count(rep.Outcome)
	m.duration.Record(ctx, elapsed, in.durationOpts(f, rep.Outcome)...)
	in.recordProcessed(ctx, m, f, elapsed, failedType)
	queue, handler, id := f.queue, f.handler, msg.UUID
	plain := metricKey{queue: queue, handler: handler}
	switch rep.Outcome {
	case outcomeRetry:
		m.retries.Add(noExemplar, 1, in.metricAttrs(metricKey{queue: queue, handler: handler, errType: in.errTypes.label(failedType)}).add...)
		m.mm.retryDelay.Record(noExemplar, rep.Delay.Seconds(), in.metricAttrs(plain).rec...)
		in.events.record(ctx, m.logDropped, queue, handler, id, rep, failedType)
	case outcomeDeadLetter:
		m.deadLetters.Add(noExemplar, 1, in.metricAttrs(metricKey{queue: queue, handler: handler, errType: in.errTypes.label(failedType)}).add...)
		in.events.record(ctx, m.logDropped, queue, handler, id, rep, failedType)
	case outcomeDuplicate:
		m.idemHits.Add(noExemplar, 1, in.metricAttrs(plain).add...)
	}
}

// appendProcessAttrs appends the attributes of a consumer span that are the message's own,
// those not in f.startOpts.
func (in *Instrumentation) appendProcessAttrs(attrs []attribute.KeyValue, f *flow, msg *message.Message, attempt int) []attribute.KeyValue {
	attrs = append(in.appendOwnAttrs(attrs, f.queue, msg), otelnames.AttrAttempt.Int(attempt))
	if f.handler != "" {
		attrs = append(attrs, otelnames.AttrHandler.String(f.handler))
	}
	return attrs
}
