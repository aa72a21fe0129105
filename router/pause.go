package router

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"

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

// initOverload wires the retry step's overload protection to the broker and telemetry;
// what it registers is released by Close.
func (s *Stack) initOverload() error {
	if o := s.cfg.Retry.Overload; o != nil {
		d := s.broker // a passive declare on RabbitMQ
		o.UseBacklog(func(ctx context.Context, queue string) (int, error) {
			depth, err := d.QueueDepth(ctx, queue)
			return int(depth.Ready), err
		})
	}
	if s.tel == nil || (s.cfg.Breakers == nil && s.cfg.Retry.Overload == nil) {
		return nil
	}
	var budget func() map[string]float64
	if o := s.cfg.Retry.Overload; o != nil {
		budget = o.BudgetLeft
	}
	m, err := s.tel.NewOverloadMetrics(s.parts.Paused, budget)
	if err != nil {
		return err
	}
	s.parts.Add(parts.Part{Close: func() { _ = m.Close() }})
	if o := s.cfg.Retry.Overload; o != nil {
		s.parts.Add(parts.Part{Close: o.NotifyRefused(func(ev retry.RefusedEvent) {
			m.RetryRefused(context.Background(), ev.Dependency, ev.Queue, ev.Reason)
		})})
	}
	return nil
}

// pauseFor returns the pause controller of a handler consuming with sub, or nil when the
// handler defers instead (no breaker, or WithDeferWhileOpen). s.mu is held.
func (s *Stack) pauseFor(handler string, hc handlerConfig, sub broker.Subscriber) *pause.Controller {
	if s.cfg.Breakers == nil || hc.deferWhileOpen {
		return nil
	}
	c := pause.New(handler, s.cfg.Breakers.Breaker(hc.breaker), sub, &s.pauses, s.logger)
	s.parts.Add(parts.Part{Handler: handler, Close: c.Close, Paused: c.Paused})
	return c
}

// breakerStep is the breaker step of a handler: pausing unless it defers.
func (s *Stack) breakerStep(hc handlerConfig) message.HandlerMiddleware {
	if hc.pause != nil {
		return hc.pause.Middleware()
	}
	return s.cfg.Breakers.NewMiddleware(hc.breaker)
}
