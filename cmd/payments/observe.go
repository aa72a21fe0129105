package main

import (
	"errors"
	"log/slog"

	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry"
	"github.com/sluice-go/sluice/telemetry/otelsetup"
)

// errNotConsuming is the readiness reason before the stack consumes and after it stopped.
var errNotConsuming = errors.New("not consuming")

// observe adds what an operator watches beside the per-message metrics: the broker
// connection (a metric and a readiness check) and the depths of the queue, its DLQ and
// archive and sluice.unrouted. The returned closers stop it.
func observe(cfg config, logger *slog.Logger, b router.Broker, providers *otelsetup.Providers,
	inst *telemetry.Instrumentation) ([]func() error, error) {
	var closers []func() error
	health := providers.Health()
	if state, ok := b.(telemetry.ConnectionState); ok {
		reg, err := inst.RegisterConnection(state)
		if err != nil {
			return closers, err
		}
		closers = append(closers, reg.Unregister)
		health.AddReadyCheck("broker", func() error {
			if !state.Connected() {
				return errors.New("not connected to RabbitMQ")
			}
			return nil
		})
	}

	source, _ := b.(telemetry.DepthSource)
	if cfg.managementURL != "" {
		ms, err := telemetry.NewManagementSource(cfg.managementURL, "")
		if err != nil {
			return closers, err
		}
		source = ms
	}
	if source == nil {
		return closers, nil
	}
	watch := telemetry.DepthQueuesFor(cfg.queue)
	// Partitions share the base queue's DLQ and archive; the consumed queues are theirs.
	for k := 0; k < cfg.partitions; k++ {
		watch = append(watch, telemetry.DepthQueue{Name: topology.Partition(cfg.queue, k), Kind: telemetry.QueueKindConsumed})
	}
	w, err := inst.WatchDepth(telemetry.DepthConfig{Source: source, Queues: watch, Interval: cfg.depthInterval, Logger: logger})
	if err != nil {
		return closers, err
	}
	return append(closers, w.Close), nil
}
