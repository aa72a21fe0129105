package otelstep

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-go/sluice/internal/otelnames"
)

// OverloadMetrics records the overload protection's metrics (Prometheus writes them
// sluice_handler_paused, sluice_retry_budget_remaining and sluice_retry_refused_total).
type OverloadMetrics struct {
	in  *Instrumentation
	reg metric.Registration
}

// NewOverloadMetrics creates the overload instruments on in's meter. paused returns each
// handler's pause state and budget each dependency's retries left; either may be nil.
// Call Close when the handlers are gone.
func (in *Instrumentation) NewOverloadMetrics(paused func() map[string]bool, budget func() map[string]float64) (*OverloadMetrics, error) {
	reg, err := in.register(func(m *instruments) (metric.Registration, error) {
		pausedGauge, err := m.meter.Int64ObservableGauge(otelnames.MetricHandlerPaused,
			metric.WithDescription("1 while the handler takes no deliveries because its circuit breaker is open."))
		if err != nil {
			return nil, fmt.Errorf("create gauge %s: %w", otelnames.MetricHandlerPaused, err)
		}
		budgetGauge, err := m.meter.Float64ObservableGauge(otelnames.MetricRetryBudgetRemaining,
			metric.WithDescription("Retries the dependency's retry budget still allows in its window."), metric.WithUnit("{retry}"))
		if err != nil {
			return nil, fmt.Errorf("create gauge %s: %w", otelnames.MetricRetryBudgetRemaining, err)
		}
		reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			if paused != nil {
				for handler, p := range paused() {
					v := int64(0)
					if p {
						v = 1
					}
					o.ObserveInt64(pausedGauge, v, metric.WithAttributes(otelnames.MetricAttrHandler.String(handler)))
				}
			}
			if budget != nil {
				for dep, left := range budget() {
					o.ObserveFloat64(budgetGauge, left, metric.WithAttributes(otelnames.MetricAttrDependency.String(dep)))
				}
			}
			return nil
		}, pausedGauge, budgetGauge)
		if err != nil {
			return nil, fmt.Errorf("register overload metrics callback: %w", err)
		}
		return reg, nil
	})
	if err != nil {
		return nil, err
	}
	return &OverloadMetrics{in: in, reg: reg}, nil
}

// RetryRefused counts one refused retry.
func (m *OverloadMetrics) RetryRefused(ctx context.Context, dependency, queue, reason string) {
	m.in.cur().refused.Add(ctx, 1, metric.WithAttributes(
		otelnames.MetricAttrDependency.String(dependency), otelnames.MetricAttrQueue.String(queue), otelnames.MetricAttrReason.String(reason)))
}

// Close unregisters the gauges' callback.
func (m *OverloadMetrics) Close() error { return m.reg.Unregister() }
