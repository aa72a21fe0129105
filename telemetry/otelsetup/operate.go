package otelsetup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/internal/otelstep"
	"github.com/sluice-go/sluice/internal/stackview"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry"
)

// Readiness reasons of Operate's checks.
var (
	errNotConsuming = errors.New("not consuming")
	errNotConnected = errors.New("not connected to the broker")
)

// Operate gives a service, in one call, what the shipped Grafana dashboard and Prometheus
// alert rules (deploy/) read beside the metrics the stack reports itself, and a readiness
// that follows the stack's state:
//
//   - the stack's telemetry (router.Config.Telemetry without providers of its own) reports
//     to these providers, even when the stack was built before Setup;
//   - sluice_connection_up and sluice_connection_reconnects_total from the stack's broker
//     (RabbitMQ's reports its connection), and, for a stack whose idempotency step keeps
//     a journal, the sluice_idempotency_journal_* metrics (the dashboard's journal row);
//   - readiness (/readyz, sluice_ready) fails while the stack does not consume, while
//     something paused it (a breaker open, an idempotency journal restoring, a handler
//     stuck with abandoned attempts: "paused by handler payments: ..."), and while the
//     broker's connection is down (RabbitMQ's reports it);
//   - sluice_queue_depth and sluice_queue_consumers of every consumed queue, its
//     dead-letter queue and archive, and sluice.unrouted (the dashboard's DLQ panels),
//     read from the stack's broker or from Config.ManagementURL every
//     Config.DepthInterval, from the moment the stack consumes;
//   - the stack's retry statistics and retry decision matrix on /debug/sluice/retries
//     and /debug/sluice/policy (DebugHandler, and the metrics server).
//
// Call it after the stack's handlers are registered (their queues are read once) and
// before Stack.Run; from then on the service is not ready until Run consumes. Between
// Setup and Operate the Health has only the checks Config.Health brought: a service whose
// probe must not read ready in that window passes a Health whose check already fails, as
// Config.Health says; Run leaves no such window. Shutdown stops what Operate started; the
// readiness checks stay, and fail once the stack stops.
func (p *Providers) Operate(stack *router.Stack) error {
	v, ok := stackview.Of(stack)
	if !ok {
		return errors.New("otelsetup: Operate needs the stack it operates, got nil")
	}
	source, _ := v.Broker.(telemetry.DepthSource)
	if p.managementURL != "" {
		ms, err := telemetry.NewManagementSource(p.managementURL, "")
		if err != nil {
			return err
		}
		source = ms
	}
	inst := v.Telemetry
	if inst != nil {
		if err := inst.Rebind(); err != nil {
			return fmt.Errorf("otelsetup: move the stack's telemetry to these providers: %w", err)
		}
	} else {
		// A stack without telemetry still gets the operations metrics, on these providers.
		var err error
		if inst, err = otelstep.New(otelstep.Config{TracerProvider: p.TracerProvider, MeterProvider: p.MeterProvider}); err != nil {
			return err
		}
	}
	if err := p.registerOperations(inst, v); err != nil {
		return err
	}
	h := p.healthOf()
	h.AddPauses(v.Pauses)
	h.AddReadyCheck("consumer", func() error {
		if !stack.Consuming() {
			return errNotConsuming
		}
		return nil
	})
	if state, ok := v.Broker.(otelstep.ConnectionState); ok {
		h.AddReadyCheck("broker", func() error {
			if !state.Connected() {
				return errNotConnected
			}
			return nil
		})
	}
	p.debug.set(retriesPath, v.Retries)
	p.debug.set(policyPath, v.Policy)

	consumed, deadLettered := v.Queues()
	if source == nil || len(consumed) == 0 {
		return nil
	}
	cfg := telemetry.DepthConfig{Source: source, Queues: depthQueues(consumed, deadLettered),
		Interval: p.depthInterval, Logger: p.logger, MeterProvider: p.MeterProvider}
	p.watchOnceConsuming(stack, cfg)
	return nil
}

// registerOperations reports the broker's connection, when it reports one, and the
// idempotency journal, when the stack keeps one; Shutdown unregisters them.
func (p *Providers) registerOperations(inst *otelstep.Instrumentation, v stackview.View) error {
	if state, ok := v.Broker.(otelstep.ConnectionState); ok {
		reg, err := inst.RegisterConnection(state)
		if err != nil {
			return err
		}
		p.addStop(func(context.Context) error { return reg.Unregister() })
	}
	if _, keeps := v.Journal(); keeps {
		reg, err := inst.RegisterJournal(func() otelstep.JournalState {
			st, _ := v.Journal()
			return st
		})
		if err != nil {
			return err
		}
		p.addStop(func(context.Context) error { return reg.Unregister() })
	}
	return nil
}

// depthQueues are the queues an operator watches: each consumed queue, the dead-letter
// queue and archive of each dead-lettered one, and sluice.unrouted.
func depthQueues(consumed, deadLettered []string) []telemetry.DepthQueue {
	all := telemetry.DepthQueuesFor(deadLettered...)
	out := make([]telemetry.DepthQueue, 0, len(consumed)+len(all))
	for _, q := range consumed {
		out = append(out, telemetry.DepthQueue{Name: q, Kind: "consumed"})
	}
	for _, q := range all {
		if q.Kind != "consumed" { // the consumed ones are above, partitions included
			out = append(out, q)
		}
	}
	return out
}

// consumingPoll is how often Operate looks whether the stack consumes yet.
const consumingPoll = 50 * time.Millisecond

// watchOnceConsuming starts the depth watcher once the stack consumes: Run declares the
// queues, and a first read before would find none of them and wait a whole interval to
// read again. Shutdown stops it.
func (p *Providers) watchOnceConsuming(stack *router.Stack, cfg telemetry.DepthConfig) {
	stop, done := make(chan struct{}), make(chan struct{})
	var stopWatch func() error
	go func() {
		defer close(done)
		t := time.NewTicker(consumingPoll)
		defer t.Stop()
		for !stack.Consuming() {
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
		s, err := telemetry.WatchDepth(cfg)
		if err != nil {
			p.logger.Error("queue depths not reported", "error", err)
			return
		}
		stopWatch = s
	}()
	p.addStop(func(context.Context) error {
		close(stop)
		<-done
		if stopWatch == nil {
			return nil
		}
		return stopWatch()
	})
}
