package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/otelnames"
)

// ScopeName is the instrumentation scope of sluice's tracer and meter.
const ScopeName = "github.com/sluice-go/sluice/telemetry"

// durationBuckets are the semantic conventions' recommended boundaries for durations in
// seconds; the SDK's defaults are meant for milliseconds and would put every attempt
// below 5 s in the first bucket.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// Option configures an Instrumentation.
type Option func(*options)

type options struct {
	tp         trace.TracerProvider
	mp         metric.MeterProvider
	prop       propagation.TextMapPropagator
	system     string
	routingKey func(destination string, msg *message.Message) string
	errLimit   int
	logger     *slog.Logger
	logLimit   LogLimit
}

// WithTracerProvider sets the tracer provider. The default is the global one, which
// follows whatever otelsetup.Setup or otel.SetTracerProvider installs later.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tp = tp }
}

// WithMeterProvider sets the meter provider. The default is the global one.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(o *options) { o.mp = mp }
}

// WithPropagator sets the propagator that reads and writes trace context in message
// headers. The default is the global one (W3C TraceContext and Baggage after otelsetup.Setup).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(o *options) { o.prop = p }
}

// WithMessagingSystem sets messaging.system on every span. The default is "rabbitmq";
// the in-memory broker may set something else.
func WithMessagingSystem(system string) Option {
	return func(o *options) { o.system = system }
}

// WithRoutingKey sets a function that returns a message's RabbitMQ routing key for the
// messaging.rabbitmq.destination.routing_key attribute; destination is the topic or queue
// of the span. An empty result omits the attribute. By default it is omitted, because
// only the broker knows how it maps topics to routing keys.
func WithRoutingKey(fn func(destination string, msg *message.Message) string) Option {
	return func(o *options) { o.routingKey = fn }
}

// WithErrorTypeLimit caps how many distinct error.type values the metrics carry; later
// types are recorded as ErrorTypeOther ("_OTHER"). Zero means defaultErrorTypeLimit (32).
// Spans and logs always carry the real type.
func WithErrorTypeLimit(n int) Option {
	return func(o *options) { o.errLimit = n }
}

// WithEventLog sets where the info line of each retry hand-off and dead letter goes and
// how many lines it may write (see LogLimit). The default is slog.Default() and
// DefaultLogLimit.
func WithEventLog(logger *slog.Logger, limit LogLimit) Option {
	return func(o *options) { o.logger, o.logLimit = logger, limit }
}

// Instrumentation creates the spans and records the metrics of sluice's message flow. It
// is safe for concurrent use.
//
// Metrics (names as in OpenTelemetry; docs/operations.md (Metrics) lists the names the
// Prometheus exporter writes, such as sluice_retries_total):
//   - messaging.process.duration, messaging.client.consumed.messages,
//     messaging.client.sent.messages, messaging.client.operation.duration: the messaging
//     conventions (messaging.system, messaging.operation.name, messaging.destination.name,
//     error.type), see messaging.go;
//   - sluice.messages (counter; queue, handler, outcome): attempts by outcome;
//   - sluice.retries, sluice.dead_letters (counters; queue, handler, error.type);
//   - sluice.idempotency.hits (counter; queue, handler);
//   - sluice.retry.delay (histogram, seconds; queue, handler);
//   - sluice.retry.outcomes (counter; handler, error.type, outcome) and
//     sluice.retry.recovery.attempt (histogram; handler, error.type): per error type, the
//     messages that failed with it, the retries spent on it and how retried messages
//     ended (retryoutcome.go; package retrystats keeps the same counts over a window);
//   - sluice.handler.duration (histogram, seconds; queue, handler, outcome);
//   - sluice.messages.in_flight (up-down counter; queue, handler);
//   - sluice.breaker.state (gauge; breaker), see RegisterBreakerState;
//   - sluice.handler.abandoned (counter; queue, handler): attempts abandoned at their
//     handler timeout or at close; sluice.handler.abandoned.running (gauge; handler):
//     those still running, see RegisterAbandoned;
//   - sluice.connection.up, sluice.connection.reconnects, see RegisterConnection;
//   - sluice.queue.depth, sluice.queue.consumers, see WatchDepth;
//   - sluice.log.dropped (counter; event), see WithEventLog.
//
// sluice.messages, sluice.messages.in_flight and messaging.client.consumed.messages are
// observable instruments, counted per attempt in atomic integers and read when a reader
// collects (flow.go); their points are those a synchronous counter would have.
//
// error.type is capped (WithErrorTypeLimit): the cardinality of every metric is bounded
// by the stack's queues and handlers.
type Instrumentation struct {
	tracer     trace.Tracer
	meter      metric.Meter
	prop       propagation.TextMapPropagator
	system     attribute.KeyValue
	routingKey func(string, *message.Message) string

	retries     metric.Int64Counter
	deadLetters metric.Int64Counter
	idemHits    metric.Int64Counter
	duration    metric.Float64Histogram
	breaker     metric.Int64ObservableGauge
	abandoned   metric.Int64Counter
	running     metric.Int64ObservableGauge // abandoned attempts still running

	// The counters of every attempt, observed from the flows (flow.go).
	consumedObs     metric.Int64ObservableCounter
	messagesObs     metric.Int64ObservableCounter
	inFlightObs     metric.Int64ObservableUpDownCounter
	flows           sync.Map // flowKey -> *flow
	consumedByQueue sync.Map // queue -> *queueCount

	mm       messagingMetrics // messaging.go
	ro       retryOutcomes    // retryoutcome.go
	errTypes *errorTypes      // errortype.go
	events   *eventLog        // eventlog.go
	held     heldBackSpans    // heldback.go

	// attrSets holds the measurement options of each (queue, handler, outcome): building
	// an attribute.Set hashes every attribute, which was the largest cost of an attempt's
	// metrics, and passing one option to Add or Record builds a variadic slice that
	// escapes (an allocation per call). The keys are the stack's queues, handlers and
	// outcomes, a small fixed set.
	attrSets sync.Map // metricKey -> messagingOpts
}

// metricKey names one combination of metric attributes; outcome and errType "" mean none.
type metricKey struct{ queue, handler, outcome, errType string }

// metricAttrs returns k's attributes as counter and histogram options, built once per k.
func (in *Instrumentation) metricAttrs(k metricKey) messagingOpts {
	if opt, ok := in.attrSets.Load(k); ok {
		return opt.(messagingOpts)
	}
	kvs := []attribute.KeyValue{otelnames.MetricAttrQueue.String(k.queue), otelnames.MetricAttrHandler.String(k.handler)}
	if k.outcome != "" {
		kvs = append(kvs, otelnames.MetricAttrOutcome.String(k.outcome))
	}
	if k.errType != "" {
		kvs = append(kvs, otelnames.MetricAttrErrorType.String(k.errType))
	}
	opt := metric.WithAttributeSet(attribute.NewSet(kvs...))
	o, _ := in.attrSets.LoadOrStore(k, messagingOpts{set: opt, add: []metric.AddOption{opt}, rec: []metric.RecordOption{opt}})
	return o.(messagingOpts)
}

// New returns an Instrumentation over the given (or the global) providers. It fails only
// if the meter provider rejects an instrument.
func New(opts ...Option) (*Instrumentation, error) {
	o := options{system: "rabbitmq"}
	for _, opt := range opts {
		opt(&o)
	}
	if o.tp == nil {
		o.tp = otel.GetTracerProvider()
	}
	if o.mp == nil {
		o.mp = otel.GetMeterProvider()
	}
	in := &Instrumentation{
		tracer:     o.tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		meter:      o.mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL)),
		prop:       o.prop,
		system:     semconv.MessagingSystemKey.String(o.system),
		routingKey: o.routingKey,
		errTypes:   newErrorTypes(o.errLimit),
	}
	if err := in.createInstruments(); err != nil {
		return nil, err
	}
	if err := in.createMessagingInstruments(); err != nil {
		return nil, err
	}
	if err := in.createFlowInstruments(); err != nil {
		return nil, err
	}
	if err := in.createRetryOutcomeInstruments(); err != nil {
		return nil, err
	}
	if err := in.createEventLog(o.logger, o.logLimit); err != nil {
		return nil, fmt.Errorf("create counter %s: %w", otelnames.MetricLogDropped, err)
	}
	return in, nil
}

func (in *Instrumentation) createInstruments() error {
	var err error
	counter := func(name, desc string) metric.Int64Counter {
		if err != nil {
			return nil
		}
		var c metric.Int64Counter
		c, err = in.meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit("{message}"))
		if err != nil {
			err = fmt.Errorf("create counter %s: %w", name, err)
		}
		return c
	}
	in.retries = counter(otelnames.MetricRetries, "Attempts handed off to the broker for a delayed retry.")
	in.deadLetters = counter(otelnames.MetricDeadLetters, "Messages sent to a dead-letter queue.")
	in.idemHits = counter(otelnames.MetricIdempotencyHits, "Duplicates acknowledged without calling the handler.")
	in.abandoned = counter(otelnames.MetricAbandoned, "Attempts abandoned at their handler timeout (plus its grace) or at close, returned or not.")
	if err != nil {
		return err
	}
	in.duration, err = in.meter.Float64Histogram(otelnames.MetricHandlerDuration,
		metric.WithDescription("Time an attempt spent in the stack below telemetry, handler included."),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(durationBuckets...))
	if err != nil {
		return fmt.Errorf("create histogram %s: %w", otelnames.MetricHandlerDuration, err)
	}
	in.breaker, err = in.meter.Int64ObservableGauge(otelnames.MetricBreakerState,
		metric.WithDescription("Circuit breaker state: 0 closed, 1 half-open, 2 open."))
	if err != nil {
		return fmt.Errorf("create gauge %s: %w", otelnames.MetricBreakerState, err)
	}
	in.running, err = in.meter.Int64ObservableGauge(otelnames.MetricAbandonedRunning,
		metric.WithDescription("Abandoned attempts whose goroutine has not returned yet."), metric.WithUnit("{attempt}"))
	if err != nil {
		return fmt.Errorf("create gauge %s: %w", otelnames.MetricAbandonedRunning, err)
	}
	return nil
}

// propagator is resolved per use so that an Instrumentation created before Setup still
// uses the propagators otelsetup.Setup installs.
func (in *Instrumentation) propagator() propagation.TextMapPropagator {
	if in.prop != nil {
		return in.prop
	}
	return otel.GetTextMapPropagator()
}

// parent returns the context a producer span for msg starts from: the first of ctxs that
// carries a valid span, else the trace context in msg's headers (a message being
// re-published, such as a dead-letter replay, continues its trace), else a new root.
func (in *Instrumentation) parent(msg *message.Message, ctxs ...context.Context) context.Context {
	for _, ctx := range ctxs {
		if trace.SpanContextFromContext(ctx).IsValid() {
			return ctx
		}
	}
	return in.propagator().Extract(ctxs[0], metadataCarrier(msg.Metadata))
}

// inject writes ctx's trace context into msg's headers. The old traceparent and tracestate
// are removed first: the propagator writes no tracestate for an empty one, and a stale
// tracestate must not travel with a new traceparent.
func (in *Instrumentation) inject(ctx context.Context, msg *message.Message) {
	if msg.Metadata == nil {
		msg.Metadata = make(message.Metadata)
	}
	delete(msg.Metadata, headers.TraceParent)
	delete(msg.Metadata, headers.TraceState)
	in.propagator().Inject(ctx, metadataCarrier(msg.Metadata))
}

// messageAttrs are the messaging attributes every span about msg carries.
func (in *Instrumentation) messageAttrs(op attribute.KeyValue, opName, destination string, msg *message.Message) []attribute.KeyValue {
	// Room for every attribute here and the consumer span's two more, so that appending
	// them does not copy the slice.
	return in.appendMessageAttrs(make([]attribute.KeyValue, 0, 9), op, opName, destination, msg)
}

// attrPool holds attribute slices for starting spans: trace.WithAttributes is applied by
// trace.NewSpanStartConfig, which copies the attributes (its apply methods are the only way
// to read an option), so a slice is free again once Start returned. A consumer span's
// slice was one 576-byte allocation per attempt, a hand-off's another.
var attrPool = sync.Pool{New: func() any {
	s := make([]attribute.KeyValue, 0, 12)
	return &s
}}

// putAttrs gives attrs, the slice taken from the pool as buf (or what appends grew it
// into), back to attrPool, cleared: the pool must not keep a message's strings alive.
func putAttrs(buf *[]attribute.KeyValue, attrs []attribute.KeyValue) {
	clear(attrs)
	*buf = attrs[:0]
	attrPool.Put(buf)
}

// appendMessageAttrs appends messageAttrs to attrs: the operation's, then the message's.
func (in *Instrumentation) appendMessageAttrs(attrs []attribute.KeyValue, op attribute.KeyValue, opName, destination string, msg *message.Message) []attribute.KeyValue {
	return in.appendOwnAttrs(in.appendOperationAttrs(attrs, op, opName, destination), destination, msg)
}

// appendOperationAttrs appends the attributes of an operation on destination, the same for
// every message of it: those a sampler may decide on.
func (in *Instrumentation) appendOperationAttrs(attrs []attribute.KeyValue, op attribute.KeyValue, opName, destination string) []attribute.KeyValue {
	attrs = append(attrs, in.system, op, semconv.MessagingOperationName(opName))
	if destination != "" {
		attrs = append(attrs, semconv.MessagingDestinationName(destination))
	}
	return attrs
}

// appendOwnAttrs appends the attributes that are msg's own: body size, id and routing key.
func (in *Instrumentation) appendOwnAttrs(attrs []attribute.KeyValue, destination string, msg *message.Message) []attribute.KeyValue {
	attrs = append(attrs, semconv.MessagingMessageBodySize(len(msg.Payload)))
	if msg.UUID != "" {
		attrs = append(attrs, semconv.MessagingMessageID(msg.UUID))
	}
	if in.routingKey != nil {
		if rk := in.routingKey(destination, msg); rk != "" {
			attrs = append(attrs, semconv.MessagingRabbitMQDestinationRoutingKey(rk))
		}
	}
	return attrs
}

// spanName follows the messaging conventions: "{operation} {destination}", or the
// operation alone when the destination is unknown.
func spanName(op, destination string) string {
	if destination == "" {
		return op
	}
	return op + " " + destination
}
