package telemetry

import (
	"context"
	"fmt"

	"github.com/sluice-go/sluice/internal/otelnames"
	"go.opentelemetry.io/otel/metric"
)

// OverloadMetrics records the overload protection's metrics (see the Metric* names above;
// Prometheus writes them sluice_handler_paused, sluice_retry_budget_remaining and
// sluice_retry_refused_total).
type OverloadMetrics struct {
	paused  metric.Int64ObservableGauge
	budget  metric.Float64ObservableGauge
	refused metric.Int64Counter
	reg     metric.Registration
}

// NewOverloadMetrics creates the overload instruments on in's meter. paused returns each
// handler's pause state and budget each dependency's retries left; either may be nil.
// Call Close when the handlers are gone.
func (in *Instrumentation) NewOverloadMetrics(paused func() map[string]bool, budget func() map[string]float64) (*OverloadMetrics, error) {
	m := &OverloadMetrics{}
	var err error
	if m.paused, err = in.meter.Int64ObservableGauge(otelnames.MetricHandlerPaused,
		metric.WithDescription("1 while the handler takes no deliveries because its circuit breaker is open.")); err != nil {
		return nil, fmt.Errorf("create gauge %s: %w", otelnames.MetricHandlerPaused, err)
	}
	if m.budget, err = in.meter.Float64ObservableGauge(otelnames.MetricRetryBudgetRemaining,
		metric.WithDescription("Retries the dependency's retry budget still allows in its window."), metric.WithUnit("{retry}")); err != nil {
		return nil, fmt.Errorf("create gauge %s: %w", otelnames.MetricRetryBudgetRemaining, err)
	}
	if m.refused, err = in.meter.Int64Counter(otelnames.MetricRetriesRefused,
		metric.WithDescription("Retries refused by the retry budget or the concurrent-retry limit."), metric.WithUnit("{retry}")); err != nil {
		return nil, fmt.Errorf("create counter %s: %w", otelnames.MetricRetriesRefused, err)
	}
	m.reg, err = in.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if paused != nil {
			for handler, p := range paused() {
				v := int64(0)
				if p {
					v = 1
				}
				o.ObserveInt64(m.paused, v, metric.WithAttributes(otelnames.MetricAttrHandler.String(handler)))
			}
		}
		if budget != nil {
			for dep, left := range budget() {
				o.ObserveFloat64(m.budget, left, metric.WithAttributes(otelnames.MetricAttrDependency.String(dep)))
			}
		}
		return nil
	}, m.paused, m.budget)
	if err != nil {
		return nil, fmt.Errorf("register overload metrics callback: %w", err)
	}
	return m, nil
}

// RetryRefused counts one refused retry.
func (m *OverloadMetrics) RetryRefused(ctx context.Context, dependency, queue, reason string) {
	m.refused.Add(ctx, 1, metric.WithAttributes(
		otelnames.MetricAttrDependency.String(dependency), otelnames.MetricAttrQueue.String(queue), otelnames.MetricAttrReason.String(reason)))
}

// Close unregisters the gauges' callback.
func (m *OverloadMetrics) Close() error { return m.reg.Unregister() }
