package router

import (
	"context"
	"fmt"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router/internal/parts"
	"github.com/sluice-go/sluice/router/internal/pause"
)

// WithDeferWhileOpen makes the handler defer the messages its open breaker rejects (each
// goes through the delay cascade and comes back after the open timeout, and again while
// the breaker stays open) instead of pausing. Without it a handler stops taking
// deliveries while its breaker is open, and its messages wait in their queue, in order.
// Deferral is the better choice when the queue also carries messages that do not need the
// broken dependency: pausing would hold those up too.
func WithDeferWhileOpen() HandlerOption { return func(c *handlerConfig) { c.deferWhileOpen = true } }

// initMetrics registers, with telemetry, the breaker state, abandoned attempts and
// overload metrics, and wires the retry step's overload protection to the broker; what
// it registers is released by Close.
func (c *core) initMetrics() error {
	o := c.cfg.Retry.Overload
	if o != nil {
		d := c.broker // a passive declare on RabbitMQ
		o.UseBacklog(func(ctx context.Context, queue string) (int, error) {
			depth, err := d.QueueDepth(ctx, queue)
			return int(depth.Ready), err
		})
	}
	if c.tel == nil {
		return nil
	}
	if reg := c.breakers; reg != nil {
		gauge, err := c.tel.RegisterBreakerState(func() map[string]int {
			out := map[string]int{}
			for name, st := range reg.States() {
				out[name] = int(st)
			}
			return out
		})
		if err != nil {
			return fmt.Errorf("router: breaker state metric: %w", err)
		}
		c.parts.Add(parts.Part{Close: func() { _ = gauge.Unregister() }})
	}
	running, err := c.tel.RegisterAbandoned(func() map[string]int {
		out := map[string]int{}
		for _, t := range c.attempts.Trackers() {
			b := t.Snapshot()
			out[b.Handler] = b.Running
		}
		return out
	})
	if err != nil {
		return fmt.Errorf("router: abandoned attempts metric: %w", err)
	}
	c.parts.Add(parts.Part{Close: func() { _ = running.Unregister() }})
	if c.breakers == nil && o == nil {
		return nil
	}
	var budget func() map[string]float64
	if o != nil {
		budget = o.BudgetLeft
	}
	m, err := c.tel.NewOverloadMetrics(c.parts.Paused, budget)
	if err != nil {
		return fmt.Errorf("router: overload metrics: %w", err)
	}
	c.parts.Add(parts.Part{Close: func() { _ = m.Close() }})
	if o != nil {
		c.parts.Add(parts.Part{Close: o.NotifyRefused(func(ev retry.RefusedEvent) {
			m.RetryRefused(context.Background(), ev.Dependency, ev.Queue, ev.Reason)
		})})
	}
	return nil
}

// pauseFor returns the pause controller of a handler consuming with sub, or nil when the
// handler defers instead (no breaker, or WithDeferWhileOpen). s.mu is held.
func (s *Stack) pauseFor(handler string, hc handlerConfig, sub broker.Subscriber) *pause.Controller {
	if s.breakers == nil || hc.deferWhileOpen {
		return nil
	}
	c := pause.New(handler, s.breakers.Breaker(hc.breaker), sub, &s.pauses, s.logger)
	s.parts.Add(parts.Part{Handler: handler, Close: c.Close, Paused: c.Paused})
	return c
}
