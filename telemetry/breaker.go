package telemetry

import (
	"context"
	"fmt"

	"github.com/sluice-go/sluice/internal/otelnames"
	"go.opentelemetry.io/otel/metric"
)

// RegisterBreakerState makes the sluice.breaker.state gauge report, at every collection,
// the states that state returns: breaker name to 0 (closed), 1 (half-open) or 2 (open),
// the values of gobreaker's State. The router registers one function for all its
// breakers; Unregister the returned registration when they are gone.
func (in *Instrumentation) RegisterBreakerState(state func() map[string]int) (metric.Registration, error) {
	if state == nil {
		return nil, fmt.Errorf("register %s: state function is nil", otelnames.MetricBreakerState)
	}
	reg, err := in.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for name, s := range state() {
			o.ObserveInt64(in.breaker, int64(s), metric.WithAttributes(otelnames.MetricAttrBreaker.String(name)))
		}
		return nil
	}, in.breaker)
	if err != nil {
		return nil, fmt.Errorf("register %s callback: %w", otelnames.MetricBreakerState, err)
	}
	return reg, nil
}

// RegisterAbandoned makes the sluice.handler.abandoned.running gauge report, at every
// collection, the abandoned attempts still running that running returns per handler. The
// router registers one function for all its handlers; Unregister the returned registration
// when they are gone.
func (in *Instrumentation) RegisterAbandoned(running func() map[string]int) (metric.Registration, error) {
	if running == nil {
		return nil, fmt.Errorf("register %s: function is nil", otelnames.MetricAbandonedRunning)
	}
	reg, err := in.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for name, n := range running() {
			o.ObserveInt64(in.running, int64(n), metric.WithAttributes(otelnames.MetricAttrHandler.String(name)))
		}
		return nil
	}, in.running)
	if err != nil {
		return nil, fmt.Errorf("register %s callback: %w", otelnames.MetricAbandonedRunning, err)
	}
	return reg, nil
}
