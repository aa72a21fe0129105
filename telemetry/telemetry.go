package telemetry

import (
	"context"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/otelstep"
)

// ScopeName is the instrumentation scope of sluice's tracer and meter.
const ScopeName = otelstep.ScopeName

// Config configures the telemetry of a stack (router.Config.Telemetry) or of New. The zero
// value is the documented default of every field: the OpenTelemetry global providers and
// propagator, which otelsetup.Setup installs.
type Config struct {
	// TracerProvider makes the spans. Nil means the global one (otel.GetTracerProvider):
	// OpenTelemetry's global delegates to the first provider installed, even later, so
	// telemetry built before otelsetup.Setup still exports; otelsetup.Operate moves a
	// stack's telemetry to the providers of its Setup.
	TracerProvider trace.TracerProvider
	// MeterProvider makes the instruments. Nil means the global one, as for TracerProvider.
	MeterProvider metric.MeterProvider
	// Propagator reads and writes the trace context in message headers. Nil means the
	// global one, read at every use (W3C TraceContext and Baggage after otelsetup.Setup;
	// a no-op until something installs one).
	Propagator propagation.TextMapPropagator
	// MessagingSystem is messaging.system on every span and metric. Empty means
	// "rabbitmq".
	MessagingSystem string
	// RoutingKey returns a message's RabbitMQ routing key for the
	// messaging.rabbitmq.destination.routing_key attribute; destination is the topic or
	// queue of the span. An empty result omits the attribute. Nil omits it, because only
	// the broker knows how it maps topics to routing keys.
	RoutingKey func(destination string, msg *message.Message) string
	// ErrorTypeLimit caps how many distinct error.type values the metrics carry; later
	// types are recorded as "_OTHER". Spans and logs always carry the real type. Zero
	// means 32.
	ErrorTypeLimit int
	// EventLog receives an info line for each retry hand-off and dead letter. Nil means
	// slog.Default().
	EventLog *slog.Logger
	// EventLogLines is how many of those lines EventLog gets in each EventLogInterval
	// (a fixed window); the lines dropped are counted in sluice.log.dropped and summed up
	// in one warning when the next window opens. Zero means 10; negative writes none.
	EventLogLines int
	// EventLogInterval is the window of EventLogLines. Zero means one second.
	EventLogInterval time.Duration
}

// Instrumentation traces and measures the attempts of a Watermill router of the user's
// own, and the messages a producer publishes: what a router.Stack does itself from
// router.Config.Telemetry. It is safe for concurrent use.
type Instrumentation struct {
	in *otelstep.Instrumentation
}

// New returns an Instrumentation over cfg's providers. It fails only if the meter
// provider rejects an instrument.
//
// Metrics (names as in OpenTelemetry; docs/operations.md (Metrics) lists the names the
// Prometheus exporter writes, such as sluice_retries_total): the messaging conventions'
// messaging.process.duration, messaging.client.consumed.messages,
// messaging.client.sent.messages and messaging.client.operation.duration; sluice.messages
// (attempts by outcome), sluice.retries, sluice.dead_letters, sluice.idempotency.hits,
// sluice.retry.delay, sluice.retry.outcomes, sluice.retry.recovery.attempt,
// sluice.handler.duration, sluice.messages.in_flight, sluice.handler.abandoned and
// sluice.log.dropped. A router.Stack also reports its breakers, overload guard, abandoned
// attempts still running, broker connection and idempotency journal. error.type is capped
// (Config.ErrorTypeLimit): the cardinality of every metric is bounded by the queues and
// handlers.
func New(cfg Config) (*Instrumentation, error) {
	in, err := otelstep.New(otelstep.Config(cfg))
	if err != nil {
		return nil, err
	}
	return &Instrumentation{in: in}, nil
}

// Middleware is a Watermill message.HandlerMiddleware that must be the outermost step, for
// it puts into the message's context what the inner steps report outcomes to (Observe).
// For every delivery attempt it:
//
//   - extracts the trace context from the message's traceparent and tracestate headers
//     (and only from them: a span in the subscriber's context is not a parent). An absent
//     or invalid traceparent starts a new trace; it is not an error. A redelivery that
//     this instance rejected into its queue's native delayed retry continues from the
//     rejection's span instead;
//   - starts a consumer span "process <queue>", the queue being
//     message.SubscribeTopicFromCtx, and sets it on the message with msg.SetContext
//     before h runs;
//   - after h returns, sets the message's attributes and those of the observed outcome
//     (the attempt number, the outcome, the retry delay), and marks the span as failed
//     for the outcomes retry, dead_letter and nack or a non-nil error;
//   - records the metrics, sampled or not.
//
// Output messages that h returns without a span in their context get the consumer span
// as parent, so that a publisher wrapped by WrapPublisher continues the trace.
func (i *Instrumentation) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return i.in.Middleware(h)
}

// Observe is the Instrumentation as a disposition.Observer: give it to the retry step
// (retry.Config.Observer), which tells it every attempt's outcome, and to the
// idempotency step, which tells it the duplicates. The outcome is recorded with the
// attempt's span and metrics when Middleware, outside, finishes the attempt.
func (i *Instrumentation) Observe(ctx context.Context, o disposition.Outcome) {
	i.in.Observe(ctx, o)
}

// WrapPublisher returns a publisher that starts a producer span "send <topic>" for every
// message, injects the span's context into the message's traceparent and tracestate
// headers, and ends the span with an error status if pub fails: a producer's trace then
// starts at the publish, and every attempt of the message continues it.
//
// A message's span is a child of the span in msg.Context(); if there is none, of the trace
// context already in its headers; else it starts a new trace.
func (i *Instrumentation) WrapPublisher(pub message.Publisher) message.Publisher {
	return i.in.WrapPublisher(pub)
}
