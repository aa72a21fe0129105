package router_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/idempotency"
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

// Issue 53: Middlewares builds its steps from the Config alone, no Stack around them. The
// guard it builds from Config.Idempotency (here with a snapshot goroutine) is closed by
// closeSteps, which writes its snapshot, and nothing it started keeps running.
func TestMiddlewares_BuildsAndClosesItsOwnSteps(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	b := memory.New(memory.Config{Logger: logger})
	defer b.Close()
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	snapshot := filepath.Join(t.TempDir(), "keys")
	mws, closeSteps, err := router.Middlewares(b, router.Config{
		Logger:      logger,
		Idempotency: &idempotency.Config{SnapshotPath: snapshot, SnapshotInterval: time.Hour},
		Breaker:     &breaker.Config{Logger: logger},
	})
	require.NoError(t, err)
	h := message.HandlerFunc(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	msg := message.NewMessage("pay-1", nil)
	msg.SetContext(context.Background())
	_, err = h(msg)
	require.NoError(t, err)
	require.NoFileExists(t, snapshot, "the snapshot is written when the guard closes")
	require.NoError(t, closeSteps())
	require.FileExists(t, snapshot, "closeSteps closed the guard Middlewares built")
}

// Config.Idempotency and Config.Guard (Config.Breaker and Config.Breakers) are one setting
// given two ways: both at once is an error, not a silent choice.
func TestNew_RefusesBothWaysOfOneSetting(t *testing.T) {
	b := memory.New(memory.Config{Logger: silentLogger})
	defer b.Close()
	guard, err := idempotency.New(idempotency.Config{})
	require.NoError(t, err)
	defer guard.Close()
	reg, err := breaker.New(breaker.Config{})
	require.NoError(t, err)
	_, err = router.New(b, router.Config{Idempotency: &idempotency.Config{}, Guard: guard})
	assert.ErrorContains(t, err, "Config.Idempotency and Config.Guard are both set")
	_, _, err = router.Middlewares(b, router.Config{Breaker: &breaker.Config{}, Breakers: reg})
	assert.ErrorContains(t, err, "Config.Breaker and Config.Breakers are both set")
}

// The guard a stack builds from Config.Idempotency is the stack's: Close closes it,
// writing its snapshot.
func TestNew_ClosesTheGuardItBuilds(t *testing.T) {
	b := memory.New(memory.Config{Logger: silentLogger})
	defer b.Close()
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	snapshot := filepath.Join(t.TempDir(), "keys")
	s, err := router.New(b, router.Config{Logger: silentLogger,
		Idempotency: &idempotency.Config{SnapshotPath: snapshot, SnapshotInterval: time.Hour}})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.FileExists(t, snapshot)
	require.NoError(t, s.Close(), "a second Close closes nothing again")
}
