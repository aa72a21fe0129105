package otelstep

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/embedded"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/otelnames"
)

// ScopeName is the instrumentation scope of sluice's tracer and meter (telemetry.ScopeName).
const ScopeName = "github.com/sluice-go/sluice/telemetry"

// durationBuckets are the semantic conventions' recommended boundaries for durations in
// seconds; the SDK's defaults are meant for milliseconds and would put every attempt
// below 5 s in the first bucket.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// Config configures an Instrumentation: package telemetry's Config, field for field (it
// converts to this one), documented there.
type Config struct {
	TracerProvider   trace.TracerProvider
	MeterProvider    metric.MeterProvider
	Propagator       propagation.TextMapPropagator
	MessagingSystem  string
	RoutingKey       func(destination string, msg *message.Message) string
	ErrorTypeLimit   int
	EventLog         *slog.Logger
	EventLogLines    int
	EventLogInterval time.Duration
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
//   - sluice.compensations (counter; queue, handler, outcome): the final dead letters of a
//     handler with a compensation, by what became of its event: sent (confirmed with the
//     dead letter), build_failed (its builder failed: the dead letter went alone),
//     withheld (the last attempt was abandoned and may still run);
//   - sluice.connection.up, sluice.connection.reconnects, see RegisterConnection;
//   - sluice.idempotency.journal.*, see RegisterJournal;
//   - sluice.handler.paused, sluice.retry.budget.remaining, sluice.retry.refused, see
//     NewOverloadMetrics;
//   - sluice.log.dropped (counter; event), see Config.EventLogLines.
//
// sluice.messages, sluice.messages.in_flight and messaging.client.consumed.messages are
// observable instruments, counted per attempt in atomic integers and read when a reader
// collects (flow.go); their points are those a synchronous counter would have.
//
// error.type is capped (Config.ErrorTypeLimit): the cardinality of every metric is bounded
// by the stack's queues and handlers.
//
// The instruments live in an instruments value that Rebind replaces (with every
// registration made on it) when the providers come from the globals: the counts, caches
// and flows below are the Instrumentation's own and carry over.
type Instrumentation struct {
	cfg        Config
	prop       propagation.TextMapPropagator
	system     attribute.KeyValue
	routingKey func(string, *message.Message) string

	inst atomic.Pointer[instruments] // the current instruments; see cur

	mu     sync.Mutex                 // Rebind, Close, and changes to regs
	regs   map[*registration]struct{} // the live registrations, replayed by Rebind
	closed bool                       // Close was called: nothing is registered again

	// The counters of every attempt, observed from the flows (flow.go).
	flows           sync.Map // flowKey -> *flow
	consumedByQueue sync.Map // queue -> *queueCount

	mmOpts   sync.Map      // messagingKey -> messagingOpts (messaging.go)
	roAttrs  sync.Map      // retryKey -> metric.MeasurementOption (retryoutcome.go)
	errTypes *errorTypes   // errortype.go
	events   *eventLog     // eventlog.go
	held     heldBackSpans // heldback.go

	// attrSets holds the measurement options of each (queue, handler, outcome): building
	// an attribute.Set hashes every attribute, which was the largest cost of an attempt's
	// metrics, and passing one option to Add or Record builds a variadic slice that
	// escapes (an allocation per call). The keys are the stack's queues, handlers and
	// outcomes, a small fixed set.
	attrSets sync.Map // metricKey -> messagingOpts
}

// instruments are the tracer and the instruments of one pair of providers.
type instruments struct {
	tracer trace.Tracer
	meter  metric.Meter

	retries     metric.Int64Counter
	deadLetters metric.Int64Counter
	idemHits    metric.Int64Counter
	duration    metric.Float64Histogram
	breaker     metric.Int64ObservableGauge
	abandoned   metric.Int64Counter
	running     metric.Int64ObservableGauge // abandoned attempts still running
	compensated metric.Int64Counter         // final dead letters of compensated handlers
	refused     metric.Int64Counter         // retries refused by the overload guard
	logDropped  metric.Int64Counter

	consumedObs metric.Int64ObservableCounter
	messagesObs metric.Int64ObservableCounter
	inFlightObs metric.Int64ObservableUpDownCounter
	flowsReg    metric.Registration

	mm messagingMetrics // messaging.go
	ro retryOutcomes    // retryoutcome.go
}

// cur returns the instruments in use now.
func (in *Instrumentation) cur() *instruments { return in.inst.Load() }

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

// New returns an Instrumentation over cfg's providers, the global ones where cfg names
// none. It fails only if the meter provider rejects an instrument.
func New(cfg Config) (*Instrumentation, error) {
	system := cfg.MessagingSystem
	if system == "" {
		system = "rabbitmq"
	}
	in := &Instrumentation{
		cfg:        cfg,
		prop:       cfg.Propagator,
		system:     semconv.MessagingSystemKey.String(system),
		routingKey: cfg.RoutingKey,
		errTypes:   newErrorTypes(cfg.ErrorTypeLimit),
		events:     newEventLog(cfg.EventLog, LogLimit{Lines: cfg.EventLogLines, Interval: cfg.EventLogInterval}),
		regs:       map[*registration]struct{}{},
	}
	m, err := in.build()
	if err != nil {
		return nil, err
	}
	in.inst.Store(m)
	return in, nil
}

// build creates the tracer and the instruments on the providers of cfg, or the global
// ones now installed.
func (in *Instrumentation) build() (*instruments, error) {
	tp, mp := in.cfg.TracerProvider, in.cfg.MeterProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := &instruments{
		tracer: tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		meter:  mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL)),
	}
	if err := m.createInstruments(); err != nil {
		return nil, err
	}
	if err := m.createMessagingInstruments(); err != nil {
		return nil, err
	}
	if err := m.createRetryOutcomeInstruments(); err != nil {
		return nil, err
	}
	if err := in.events.createInstruments(m); err != nil {
		return nil, err
	}
	if err := in.createFlowInstruments(m); err != nil {
		return nil, err
	}
	return m, nil
}

// Rebind moves the tracer and every instrument and registration to the global providers
// installed now, when Config names none: OpenTelemetry's global providers delegate to the
// first ones installed, and an Instrumentation built before a later install (a second
// otelsetup.Setup in one process) would keep reporting to the first. Counts carry over.
// otelsetup.Operate calls it for the stack it operates. With both providers in Config it
// does nothing.
func (in *Instrumentation) Rebind() error {
	if in.cfg.TracerProvider != nil && in.cfg.MeterProvider != nil {
		return nil
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return nil
	}
	next, err := in.build()
	if err != nil {
		return err
	}
	made := make(map[*registration]metric.Registration, len(in.regs))
	for r := range in.regs {
		reg, err := r.mk(next)
		if err != nil {
			for _, m := range made {
				_ = m.Unregister()
			}
			_ = next.flowsReg.Unregister()
			return err
		}
		made[r] = reg
	}
	old := in.inst.Swap(next)
	var errs []error
	for r, reg := range made {
		errs = append(errs, r.cur.Unregister())
		r.cur = reg
	}
	errs = append(errs, old.flowsReg.Unregister())
	return errors.Join(errs...)
}

// Close unregisters every callback the Instrumentation registered: its own (the counters
// of every attempt) and those of the Register methods. A router.Stack, which builds its
// Instrumentation, closes it with itself: the counts of a closed stack are no longer
// reported. Spans and synchronous measurements made after Close still go to the
// providers. A second call does nothing.
func (in *Instrumentation) Close() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return nil
	}
	in.closed = true
	var errs []error
	for r := range in.regs {
		errs = append(errs, r.cur.Unregister())
		delete(in.regs, r)
	}
	errs = append(errs, in.cur().flowsReg.Unregister())
	return errors.Join(errs...)
}

// register runs mk on the current instruments, and again on the next ones at every
// Rebind; the registration it returns unregisters whichever is current.
func (in *Instrumentation) register(mk func(*instruments) (metric.Registration, error)) (metric.Registration, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	reg, err := mk(in.cur())
	if err != nil {
		return nil, err
	}
	r := &registration{in: in, mk: mk, cur: reg}
	in.regs[r] = struct{}{}
	return r, nil
}

// registration is a callback registration that follows Rebind.
type registration struct {
	embedded.Registration
	in  *Instrumentation
	mk  func(*instruments) (metric.Registration, error)
	cur metric.Registration // under in.mu
}

// Unregister removes the callback; a second call does nothing.
func (r *registration) Unregister() error {
	r.in.mu.Lock()
	defer r.in.mu.Unlock()
	if _, ok := r.in.regs[r]; !ok {
		return nil
	}
	delete(r.in.regs, r)
	return r.cur.Unregister()
}

func (m *instruments) createInstruments() error {
	var err error
	counter := func(name, desc, unit string) metric.Int64Counter {
		if err != nil {
			return nil
		}
		var c metric.Int64Counter
		c, err = m.meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		if err != nil {
			err = fmt.Errorf("create counter %s: %w", name, err)
		}
		return c
	}
	m.retries = counter(otelnames.MetricRetries, "Attempts handed off to the broker for a delayed retry.", "{message}")
	m.deadLetters = counter(otelnames.MetricDeadLetters, "Messages sent to a dead-letter queue.", "{message}")
	m.idemHits = counter(otelnames.MetricIdempotencyHits, "Duplicates acknowledged without calling the handler.", "{message}")
	m.abandoned = counter(otelnames.MetricAbandoned, "Attempts abandoned at their handler timeout (plus its grace) or at close, returned or not.", "{message}")
	m.refused = counter(otelnames.MetricRetriesRefused, "Retries refused by the retry budget or the concurrent-retry limit.", "{retry}")
	m.compensated = counter(otelnames.MetricCompensations, "Final dead letters of handlers with a compensation, by what became of its event: sent, build_failed, withheld.", "{message}")
	if err != nil {
		return err
	}
	m.duration, err = m.meter.Float64Histogram(otelnames.MetricHandlerDuration,
		metric.WithDescription("Time an attempt spent in the stack below telemetry, handler included."),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(durationBuckets...))
	if err != nil {
		return fmt.Errorf("create histogram %s: %w", otelnames.MetricHandlerDuration, err)
	}
	m.breaker, err = m.meter.Int64ObservableGauge(otelnames.MetricBreakerState,
		metric.WithDescription("Circuit breaker state: 0 closed, 1 half-open, 2 open."))
	if err != nil {
		return fmt.Errorf("create gauge %s: %w", otelnames.MetricBreakerState, err)
	}
	m.running, err = m.meter.Int64ObservableGauge(otelnames.MetricAbandonedRunning,
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
