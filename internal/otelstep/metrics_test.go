package otelstep_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/otelnames"
)

func TestMetrics_KnownSequence(t *testing.T) {
	e := newEnv(t)
	queue := uniqueQueue("metrics")
	reports := map[string]*testReport{
		"retry":     {Outcome: disposition.Retry, Delay: time.Second, Err: errors.New("timeout")},
		"dead":      {Outcome: disposition.DeadLetter, Err: sluice.Permanent(errors.New("invalid"))},
		"duplicate": {Outcome: disposition.Duplicate},
		"deferred":  {Outcome: disposition.Defer, Delay: time.Second},
	}
	ps, results := e.runRouter(t, queue, func(msg *message.Message) ([]*message.Message, error) {
		kind := string(msg.Payload)
		if rep, ok := reports[kind]; ok {
			reportTo(e.in, msg.Context(), *rep)
		}
		if kind == "error" {
			return nil, errors.New("handler failed")
		}
		return nil, nil
	}, routerOpts{})

	sequence := []string{"ack", "retry", "dead", "duplicate", "deferred", "error", "ack"}
	for _, kind := range sequence {
		require.NoError(t, ps.Publish(queue, message.NewMessage(kind, []byte(kind))))
	}
	for range sequence {
		next(t, results)
	}

	m := e.collect(t)
	labels := []attribute.KeyValue{otelnames.MetricAttrQueue.String(queue), otelnames.MetricAttrHandler.String("test-handler")}
	outcome := func(o string) []attribute.KeyValue { return append(labels, otelnames.MetricAttrOutcome.String(o)) }
	wantByOutcome := map[string]int64{"ack": 2, "retry": 1, "dead_letter": 1, "duplicate": 1, "deferred": 1, "nack": 1}
	for o, want := range wantByOutcome {
		assert.Equal(t, want, sumPoint(t, m[otelnames.MetricMessages], outcome(o)...), "messages with outcome %s", o)
	}
	assert.Equal(t, int64(len(sequence)), sumPoint(t, m[otelnames.MetricMessages], labels...))
	assert.Equal(t, int64(1), sumPoint(t, m[otelnames.MetricRetries], labels...))
	assert.Equal(t, int64(1), sumPoint(t, m[otelnames.MetricDeadLetters], labels...))
	assert.Equal(t, int64(1), sumPoint(t, m[otelnames.MetricIdempotencyHits], labels...))
	assert.Equal(t, int64(0), sumPoint(t, m[otelnames.MetricInFlight], labels...))

	hist, ok := m[otelnames.MetricHandlerDuration].(metricdata.Histogram[float64])
	require.True(t, ok, "duration is a float64 histogram, got %T", m[otelnames.MetricHandlerDuration])
	var count uint64
	for _, dp := range hist.DataPoints {
		count += dp.Count
		assert.Equal(t, []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}, dp.Bounds,
			"bucket boundaries are in seconds")
	}
	assert.Equal(t, uint64(len(sequence)), count)
}

func TestMetrics_InFlight(t *testing.T) {
	e := newEnv(t)
	queue := uniqueQueue("inflight")
	entered := make(chan struct{})
	release := make(chan struct{})
	ps, results := e.runRouter(t, queue, func(*message.Message) ([]*message.Message, error) {
		close(entered)
		<-release
		return nil, nil
	}, routerOpts{})
	labels := []attribute.KeyValue{otelnames.MetricAttrQueue.String(queue)}

	require.NoError(t, ps.Publish(queue, message.NewMessage("id", nil)))
	<-entered
	assert.Equal(t, int64(1), sumPoint(t, e.collect(t)[otelnames.MetricInFlight], labels...), "while the handler runs")
	close(release)
	next(t, results)
	assert.Equal(t, int64(0), sumPoint(t, e.collect(t)[otelnames.MetricInFlight], labels...), "after it returned")
}

func TestRegisterBreakerState(t *testing.T) {
	e := newEnv(t)
	states := map[string]int{"gateway": 2, "ledger": 0}
	reg, err := e.in.RegisterBreakerState(func() map[string]int { return states })
	require.NoError(t, err)

	gauge := func() map[string]int64 {
		data, ok := e.collect(t)[otelnames.MetricBreakerState]
		if !ok {
			return nil
		}
		g, ok := data.(metricdata.Gauge[int64])
		require.True(t, ok, "breaker state is an int64 gauge, got %T", data)
		out := make(map[string]int64)
		for _, dp := range g.DataPoints {
			name, _ := dp.Attributes.Value(otelnames.MetricAttrBreaker)
			out[name.AsString()] = dp.Value
		}
		return out
	}

	assert.Equal(t, map[string]int64{"gateway": 2, "ledger": 0}, gauge())
	states = map[string]int{"gateway": 1, "ledger": 0}
	assert.Equal(t, map[string]int64{"gateway": 1, "ledger": 0}, gauge(), "read at every collection")

	require.NoError(t, reg.Unregister())
	assert.Empty(t, gauge(), "nothing reported once unregistered")
}

func TestRegisterBreakerState_Nil(t *testing.T) {
	e := newEnv(t)
	_, err := e.in.RegisterBreakerState(nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), otelnames.MetricBreakerState)
}
