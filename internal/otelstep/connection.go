package otelstep

import (
	"context"
	"fmt"

	"github.com/sluice-go/sluice/internal/otelnames"
	"go.opentelemetry.io/otel/metric"
)

// ConnectionState is what the connection metrics read at each collection.
type ConnectionState interface {
	// Connected reports whether the broker connection is up now.
	Connected() bool
	// Reconnects is how many times the connection was re-established after a loss.
	Reconnects() int64
}

// RegisterConnection makes sluice.connection.up and sluice.connection.reconnects report
// state at every collection. Unregister the returned registration when state is closed.
func (in *Instrumentation) RegisterConnection(state ConnectionState) (metric.Registration, error) {
	if state == nil {
		return nil, fmt.Errorf("register %s: connection state is nil", otelnames.MetricConnectionUp)
	}
	return in.register(func(m *instruments) (metric.Registration, error) {
		up, err := m.meter.Int64ObservableGauge(otelnames.MetricConnectionUp,
			metric.WithDescription("1 while the broker connection is up, else 0."))
		if err != nil {
			return nil, fmt.Errorf("create gauge %s: %w", otelnames.MetricConnectionUp, err)
		}
		reconnects, err := m.meter.Int64ObservableCounter(otelnames.MetricReconnects,
			metric.WithDescription("Broker connections re-established after a loss."), metric.WithUnit("{reconnect}"))
		if err != nil {
			return nil, fmt.Errorf("create counter %s: %w", otelnames.MetricReconnects, err)
		}
		attrs := metric.WithAttributes(in.system)
		reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			v := int64(0)
			if state.Connected() {
				v = 1
			}
			o.ObserveInt64(up, v, attrs)
			o.ObserveInt64(reconnects, state.Reconnects(), attrs)
			return nil
		}, up, reconnects)
		if err != nil {
			return nil, fmt.Errorf("register connection metrics callback: %w", err)
		}
		return reg, nil
	})
}
