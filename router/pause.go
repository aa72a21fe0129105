package router

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/telemetry"
)

// WithDeferWhileOpen makes the handler defer the messages its open breaker rejects (each
// goes through the delay cascade and comes back after the open timeout, and again while
// the breaker stays open) instead of pausing. Without it a handler stops taking
// deliveries while its breaker is open, and its messages wait in their queue, in order.
// Deferral is the better choice when the queue also carries messages that do not need the
// broken dependency: pausing would hold those up too.
func WithDeferWhileOpen() HandlerOption { return func(c *handlerConfig) { c.deferWhileOpen = true } }

// overloadState is the stack's part of the overload protection: the pause controllers
// and the metrics.
type overloadState struct {
	mu      sync.Mutex
	pauses  []*pauseController
	metrics *telemetry.OverloadMetrics
	// stopRefused ends the Overload's NotifyRefused listener; nil without one.
	stopRefused func()
}

// initOverload wires the retry step's overload protection to the broker and telemetry.
func (s *Stack) initOverload() error {
	if o := s.cfg.Retry.Overload; o != nil {
		d := s.broker // a passive declare on RabbitMQ
		o.UseBacklog(func(ctx context.Context, queue string) (int, error) {
			depth, err := d.QueueDepth(ctx, queue)
			return int(depth.Ready), err
		})
	}
	if s.cfg.Telemetry == nil || (s.cfg.Breakers == nil && s.cfg.Retry.Overload == nil) {
		return nil
	}
	var budget func() map[string]float64
	if o := s.cfg.Retry.Overload; o != nil {
		budget = o.BudgetLeft
	}
	m, err := s.cfg.Telemetry.NewOverloadMetrics(s.pausedHandlers, budget)
	if err != nil {
		return err
	}
	s.overload.metrics = m
	if o := s.cfg.Retry.Overload; o != nil {
		s.overload.stopRefused = o.NotifyRefused(func(ev retry.RefusedEvent) {
			m.RetryRefused(context.Background(), ev.Dependency, ev.Queue, ev.Reason)
		})
	}
	return nil
}

// closeOverload stops every pause controller (and its timer) and the metrics.
func (s *Stack) closeOverload() {
	s.overload.mu.Lock()
	pauses := s.overload.pauses
	m := s.overload.metrics
	stopRefused := s.overload.stopRefused
	s.overload.stopRefused = nil
	s.overload.mu.Unlock()
	if stopRefused != nil {
		stopRefused()
	}
	for _, p := range pauses {
		p.close()
	}
	if m != nil {
		_ = m.Close()
	}
}

func (s *Stack) pausedHandlers() map[string]bool {
	s.overload.mu.Lock()
	defer s.overload.mu.Unlock()
	out := make(map[string]bool, len(s.overload.pauses))
	for _, p := range s.overload.pauses {
		out[p.handler] = p.isPaused()
	}
	return out
}

// pauseFor returns the pause controller of a handler consuming with sub, or nil when the
// handler defers instead (no breaker, or WithDeferWhileOpen).
func (s *Stack) pauseFor(handler string, hc handlerConfig, sub broker.Subscriber) *pauseController {
	if s.cfg.Breakers == nil || hc.deferWhileOpen {
		return nil
	}
	c := &pauseController{handler: handler, b: s.cfg.Breakers.Breaker(hc.breaker), sub: sub, logger: s.logger, health: s.cfg.Health}
	c.stopWatch = c.b.Watch(c.onState)
	s.overload.mu.Lock()
	s.overload.pauses = append(s.overload.pauses, c)
	s.overload.mu.Unlock()
	return c
}

// breakerStep is the breaker step of a handler: pausing unless it defers.
func (s *Stack) breakerStep(hc handlerConfig) message.HandlerMiddleware {
	if hc.pause != nil {
		return hc.pause.b.ReturningMiddleware(hc.pause.onReturn)
	}
	return s.cfg.Breakers.NewMiddleware(hc.breaker)
}

// pauseController pauses a handler's subscriber while its breaker is open and resumes it
// with the breaker's probes at half-open and fully once closed. An open breaker turns
// half-open only when someone looks at it, and a paused handler sends nobody: a timer
// looks at it when its open timeout ends. close stops the timer; none outlives it.
type pauseController struct {
	handler   string
	b         *breaker.Breaker
	sub       broker.Subscriber
	logger    *slog.Logger
	health    *telemetry.Health // Config.Health: a paused handler is not ready
	stopWatch func()

	mu      sync.Mutex
	paused  bool
	probing bool
	timer   *time.Timer
	closed  bool
	ticks   sync.WaitGroup // the timer's function, while it runs
}

// onState follows the breaker's announced state changes.
func (c *pauseController) onState(from, to breaker.State) {
	c.apply(to, from.String())
}

// onReturn is called when the breaker rejected a message of this handler, which goes back
// to its queue: no more should follow until the breaker changes state. A rejection at
// half-open means the probes are out; the timer looks again after an open timeout in case
// they end without changing the state.
func (c *pauseController) onReturn(state breaker.State) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.pauseLocked(state)
}

func (c *pauseController) apply(state breaker.State, from string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	switch state {
	case breaker.StateOpen:
		c.pauseLocked(state)
	case breaker.StateHalfOpen:
		c.stopTimerLocked()
		c.sub.Resume(c.b.Probes())
		if !c.probing {
			c.probing = true
			c.logger.Info("handler probing its dependency", "handler", c.handler, "breaker", c.b.Name(), "probes", c.b.Probes(), "from", from)
		}
	case breaker.StateClosed:
		c.stopTimerLocked()
		c.probing = false
		c.sub.Resume(0)
		if c.paused {
			c.paused = false
			if c.health != nil {
				c.health.Resume("handler " + c.handler)
			}
			c.logger.Info("handler resumed: circuit breaker closed", "handler", c.handler, "breaker", c.b.Name())
		}
	}
}

func (c *pauseController) pauseLocked(state breaker.State) {
	c.sub.Pause()
	c.probing = false
	wait := c.b.OpenRemaining()
	if state != breaker.StateOpen || wait <= 0 {
		wait = c.b.OpenTimeout()
	}
	if !c.paused {
		c.paused = true
		if c.health != nil {
			c.health.Pause("handler "+c.handler, "paused: circuit breaker "+c.b.Name()+" open")
		}
		c.logger.Warn("handler paused: its messages wait in their queue until the circuit breaker lets probes through",
			"handler", c.handler, "breaker", c.b.Name(), "state", state.String(), "resume_in", wait)
	}
	c.armLocked(wait)
}

// armLocked (re)starts the timer that looks at the breaker after wait.
func (c *pauseController) armLocked(wait time.Duration) {
	c.stopTimerLocked()
	c.ticks.Add(1)
	// A millisecond late, so that the breaker's open timeout has surely passed.
	c.timer = time.AfterFunc(wait+time.Millisecond, c.tick)
}

func (c *pauseController) stopTimerLocked() {
	if c.timer != nil && c.timer.Stop() {
		c.ticks.Done()
	}
	c.timer = nil
}

// tick looks at the breaker: reading its state turns it half-open when its open timeout
// has passed, which announces the change (and onState resumes the handler). A state that
// did not change is applied here.
func (c *pauseController) tick() {
	defer c.ticks.Done()
	c.apply(c.b.State(), "timer")
}

func (c *pauseController) isPaused() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.paused
}

// close stops following the breaker and waits for a running timer function.
func (c *pauseController) close() {
	c.stopWatch()
	c.mu.Lock()
	c.closed = true
	c.stopTimerLocked()
	c.mu.Unlock()
	c.ticks.Wait()
}
