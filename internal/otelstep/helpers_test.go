package otelstep_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/otelstep"
)

// env is an Instrumentation over providers the test can read back.
type env struct {
	in     *otelstep.Instrumentation
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	prop   propagation.TextMapPropagator
}

// newEnv builds the Instrumentation of cfg, with the env's providers and propagator where
// cfg names none.
func newEnv(t *testing.T, cfg ...otelstep.Config) *env {
	t.Helper()
	e := &env{
		spans:  tracetest.NewSpanRecorder(),
		reader: sdkmetric.NewManualReader(),
		prop:   propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(e.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	t.Cleanup(func() {
		require.NoError(t, e.tp.Shutdown(context.Background()))
		require.NoError(t, mp.Shutdown(context.Background()))
	})
	var c otelstep.Config
	if len(cfg) > 0 {
		c = cfg[0]
	}
	if c.TracerProvider == nil {
		c.TracerProvider = e.tp
	}
	if c.MeterProvider == nil {
		c.MeterProvider = mp
	}
	if c.Propagator == nil {
		c.Propagator = e.prop
	}
	in, err := otelstep.New(c)
	require.NoError(t, err)
	e.in = in
	return e
}

// rootSpan starts a span that stands for the code that publishes a message.
func (e *env) rootSpan(name string) (context.Context, trace.Span) {
	return e.tp.Tracer("test").Start(context.Background(), name)
}

// ended returns the ended span called name, failing unless there is exactly one.
func (e *env) ended(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	require.Len(t, found, 1, "spans named %q among %v", name, spanNames(e.spans.Ended()))
	return found[0]
}

// endedAll returns the ended spans called name in the order they ended.
func (e *env) endedAll(name string) []sdktrace.ReadOnlySpan {
	var found []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	return found
}

func spanNames(spans []sdktrace.ReadOnlySpan) []string {
	names := make([]string, len(spans))
	for i, s := range spans {
		names[i] = s.Name()
	}
	return names
}

// attrs returns a span's attributes by key.
func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value)
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// collect reads all metrics and returns them by instrument name.
func (e *env) collect(t *testing.T) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, e.reader.Collect(context.Background(), &rm))
	out := make(map[string]metricdata.Aggregation)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// sumPoint returns the value of an int64 sum's point whose attributes include want.
func sumPoint(t *testing.T, data metricdata.Aggregation, want ...attribute.KeyValue) int64 {
	t.Helper()
	sum, ok := data.(metricdata.Sum[int64])
	require.True(t, ok, "want an int64 sum, got %T", data)
	var total int64
	matched := false
	for _, dp := range sum.DataPoints {
		if hasAll(dp.Attributes, want) {
			total += dp.Value
			matched = true
		}
	}
	require.True(t, matched, "no point with %v among %+v", want, sum.DataPoints)
	return total
}

func hasAll(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		v, ok := set.Value(kv.Key)
		if !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// uniqueQueue returns a queue name no other test uses.
func uniqueQueue(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// result is one attempt as seen from outside the telemetry middleware.
type result struct {
	msg *message.Message
	err error
}

// routerOpts configure runRouter.
type routerOpts struct {
	// preserveContext makes the in-memory pub/sub hand the publisher's context to the
	// subscriber, as no network broker can.
	preserveContext bool
}

// runRouter runs a watermill router that consumes queue with the env's middleware around
// h. An observer outside the middleware reports every attempt on the returned channel,
// after the middleware has ended its span, and acknowledges it whatever the error, so a
// failing attempt is not redelivered. The returned pub/sub publishes into queue.
func (e *env) runRouter(t *testing.T, queue string, h message.HandlerFunc, o routerOpts) (*gochannel.GoChannel, <-chan result) {
	t.Helper()
	logger := watermill.NopLogger{}
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true, PreserveContext: o.preserveContext}, logger)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, logger)
	require.NoError(t, err)

	results := make(chan result, 64)
	router.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			_, err := next(msg)
			results <- result{msg: msg, err: err}
			return nil, nil
		}
	}, e.in.Middleware)
	router.AddHandler("test-handler", queue, ps, "", disabledPublisher{}, h)

	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case err := <-done:
		t.Fatalf("router stopped before running: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("router did not start within 10s")
	}
	t.Cleanup(func() {
		require.NoError(t, router.Close())
		require.NoError(t, <-done)
		require.NoError(t, ps.Close())
	})
	return ps, results
}

// disabledPublisher fails the test's router if a handler returns output messages it did
// not expect to be published.
type disabledPublisher struct{}

func (disabledPublisher) Publish(string, ...*message.Message) error {
	panic("test handler returned output messages")
}
func (disabledPublisher) Close() error { return nil }

// next waits for the next attempt.
func next(t *testing.T, results <-chan result) result {
	t.Helper()
	select {
	case r := <-results:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no attempt within 10s")
		return result{}
	}
}

// fakePublisher records what it is asked to publish and fails with err.
type fakePublisher struct {
	calls [][]*message.Message
	err   error
}

func (p *fakePublisher) Publish(_ string, msgs ...*message.Message) error {
	p.calls = append(p.calls, msgs)
	return p.err
}

func (p *fakePublisher) Close() error { return nil }

// traceparent formats sc the way the W3C propagator writes it.
func traceparent(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// testReport is an attempt's outcome as the tests observe it.
type testReport struct {
	Outcome disposition.Kind
	Delay   time.Duration
	Attempt int
	Err     error
}

// reportTo tells in the outcome r of the attempt whose context is ctx, as the retry step
// does through its Observer.
func reportTo(in *otelstep.Instrumentation, ctx context.Context, r testReport) {
	in.Observe(ctx, disposition.Outcome{Disposition: disposition.Disposition{Kind: r.Outcome, Delay: r.Delay, Reason: r.Err}, Attempt: r.Attempt})
}
