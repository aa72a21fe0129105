package router_test

import (
	"io"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry"
)

// countingMeters counts the meter callbacks registered and not yet unregistered.
type countingMeters struct {
	metric.MeterProvider
	live atomic.Int64
}

func (p *countingMeters) Meter(name string, opts ...metric.MeterOption) metric.Meter {
	return countingMeter{Meter: p.MeterProvider.Meter(name, opts...), live: &p.live}
}

type countingMeter struct {
	metric.Meter
	live *atomic.Int64
}

func (m countingMeter) RegisterCallback(f metric.Callback, insts ...metric.Observable) (metric.Registration, error) {
	reg, err := m.Meter.RegisterCallback(f, insts...)
	if err != nil {
		return nil, err
	}
	m.live.Add(1)
	return &countedRegistration{Registration: reg, live: m.live}, nil
}

type countedRegistration struct {
	metric.Registration
	live *atomic.Int64
	done atomic.Bool
}

func (r *countedRegistration) Unregister() error {
	if r.done.CompareAndSwap(false, true) {
		r.live.Add(-1)
	}
	return r.Registration.Unregister()
}

// Issue 35: router.Middlewares built a whole Stack to return its steps and never closed
// it, so every call left its breaker-state and overload gauges registered and a refusal
// listener on the Overload. 1,000 calls, each closed, leave the meter's registrations and
// the goroutines where they were.
func TestMiddlewares_RegistersNothingItDoesNotClose(t *testing.T) {
	meters := &countingMeters{MeterProvider: noop.NewMeterProvider()}
	in := &telemetry.Config{MeterProvider: meters}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	breakers, err := breaker.New(breaker.Config{Logger: logger})
	require.NoError(t, err)
	overload, err := retry.NewOverload(retry.OverloadConfig{Logger: logger})
	require.NoError(t, err)
	broker := memory.New(memory.Config{Logger: logger})
	t.Cleanup(func() { _ = broker.Close() })
	cfg := router.Config{
		Logger: logger, Telemetry: in, Breakers: breakers,
		Retry: retry.Config{Overload: overload},
	}

	// One call first: what it registers is the steps' (not instruments made once per
	// Instrumentation), and it is released by closeSteps.
	baseMeters := meters.live.Load()
	mws, closeSteps, err := router.Middlewares(broker, cfg)
	require.NoError(t, err)
	require.NotEmpty(t, mws)
	require.Greater(t, meters.live.Load(), baseMeters, "the steps register gauges: the count sees them")
	require.NoError(t, closeSteps())
	require.Equal(t, baseMeters, meters.live.Load())

	runtime.GC()
	baseGoroutines := runtime.NumGoroutine()
	for range 1000 {
		_, closeSteps, err := router.Middlewares(broker, cfg)
		require.NoError(t, err)
		require.NoError(t, closeSteps())
	}
	assert.Equal(t, baseMeters, meters.live.Load(), "meter registrations after 1,000 calls")
	assert.Eventually(t, func() bool { return runtime.NumGoroutine() <= baseGoroutines+2 },
		5*time.Second, 10*time.Millisecond, "goroutines after 1,000 calls: %d, before %d", runtime.NumGoroutine(), baseGoroutines)
}
