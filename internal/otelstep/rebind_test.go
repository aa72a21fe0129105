package otelstep_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-go/sluice/internal/otelnames"
	"github.com/sluice-go/sluice/internal/otelstep"
)

// globalProviders installs a recording tracer provider and a manually read meter provider
// globally, as otelsetup.Setup installs its own; the previous globals come back after t.
type globalProviders struct {
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
}

func installGlobals(t *testing.T) *globalProviders {
	t.Helper()
	tp0, mp0 := otel.GetTracerProvider(), otel.GetMeterProvider()
	g := &globalProviders{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(g.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(g.reader))
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	t.Cleanup(func() {
		otel.SetTracerProvider(tp0)
		otel.SetMeterProvider(mp0)
		require.NoError(t, tp.Shutdown(context.Background()))
		require.NoError(t, mp.Shutdown(context.Background()))
	})
	return g
}

func (g *globalProviders) collect(t *testing.T) map[string][]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, g.reader.Collect(context.Background(), &rm))
	out := map[string][]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = append(out[m.Name], m)
		}
	}
	return out
}

// An Instrumentation over the global providers, built before a second set of providers is
// installed (a second otelsetup.Setup in one process, where OpenTelemetry's delegation no
// longer helps), reports to the new ones once rebound: spans, counts carried over, and
// every registration, each once; the old providers hear no more of it.
func TestRebind_MovesToTheGlobalProvidersInstalledNow(t *testing.T) {
	first := installGlobals(t)
	in, err := otelstep.New(otelstep.Config{})
	require.NoError(t, err)
	reg, err := in.RegisterBreakerState(func() map[string]int { return map[string]int{"gateway": 2} })
	require.NoError(t, err)
	run := func() {
		h := in.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
		msg := message.NewMessage("m", nil)
		msg.SetContext(context.Background())
		_, err := h(msg)
		require.NoError(t, err)
	}
	run()
	assert.Len(t, first.spans.Ended(), 1, "the first providers record before the rebind")

	second := installGlobals(t)
	run()
	assert.Len(t, second.spans.Ended(), 0, "without a rebind the instrumentation keeps the first providers")
	require.NoError(t, in.Rebind())
	run()
	assert.Len(t, second.spans.Ended(), 1, "spans go to the providers installed now")
	assert.Len(t, first.spans.Ended(), 2)

	m := second.collect(t)
	require.Len(t, m[otelnames.MetricMessages], 1, "one stream of sluice.messages")
	sum := m[otelnames.MetricMessages][0].Data.(metricdata.Sum[int64])
	require.Len(t, sum.DataPoints, 1)
	assert.Equal(t, int64(3), sum.DataPoints[0].Value, "the attempts counted before the rebind carry over")
	require.Len(t, m[otelnames.MetricBreakerState], 1)
	gauge := m[otelnames.MetricBreakerState][0].Data.(metricdata.Gauge[int64])
	require.Len(t, gauge.DataPoints, 1, "the breaker callback runs once, on the new providers")
	name, _ := gauge.DataPoints[0].Attributes.Value(attribute.Key(otelnames.MetricAttrBreaker))
	assert.Equal(t, "gateway", name.AsString())

	old := first.collect(t)
	assert.Empty(t, old[otelnames.MetricBreakerState], "the old providers no longer call the breaker callback")
	assert.Empty(t, old[otelnames.MetricMessages], "nor the attempts' one")

	require.NoError(t, reg.Unregister())
	require.NoError(t, reg.Unregister(), "a second Unregister does nothing")
	assert.Empty(t, second.collect(t)[otelnames.MetricBreakerState])
	require.NoError(t, in.Rebind(), "a rebind after the registration is gone does not bring it back")
	assert.Empty(t, second.collect(t)[otelnames.MetricBreakerState])
}

// With both providers in its Config, an Instrumentation stays on them.
func TestRebind_ExplicitProvidersStay(t *testing.T) {
	e := newEnv(t)
	installGlobals(t)
	require.NoError(t, e.in.Rebind())
	h := e.in.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	msg := message.NewMessage("m", nil)
	msg.SetContext(context.Background())
	_, err := h(msg)
	require.NoError(t, err)
	assert.Len(t, e.spans.Ended(), 1)
}

// Close releases every callback: the attempts' counters and the registrations; a Rebind
// after it registers nothing again.
func TestClose_ReleasesEveryCallback(t *testing.T) {
	g := installGlobals(t)
	in, err := otelstep.New(otelstep.Config{})
	require.NoError(t, err)
	reg, err := in.RegisterBreakerState(func() map[string]int { return map[string]int{"gateway": 0} })
	require.NoError(t, err)
	h := in.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	msg := message.NewMessage("m", nil)
	msg.SetContext(context.Background())
	_, err = h(msg)
	require.NoError(t, err)
	before := g.collect(t)
	require.NotEmpty(t, before[otelnames.MetricMessages])
	require.NotEmpty(t, before[otelnames.MetricBreakerState])

	require.NoError(t, in.Close())
	require.NoError(t, in.Close(), "a second Close does nothing")
	require.NoError(t, reg.Unregister(), "a registration Close released unregisters quietly")
	require.NoError(t, in.Rebind())
	after := g.collect(t)
	assert.Empty(t, after[otelnames.MetricMessages])
	assert.Empty(t, after[otelnames.MetricBreakerState])
}
