// Package pause pauses a handler's subscriber while its circuit breaker is open and
// resumes it with the breaker's probes at half-open and fully once closed (the breaker
// step of router's handlers without WithDeferWhileOpen).
package pause

import (
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/breakerhook"
	"github.com/sluice-go/sluice/middleware/breaker"
)

// Health is told when a handler pauses and resumes (the stack's health.Pauses): a paused handler
// is not ready.
type Health interface {
	Pause(name, reason string)
	Resume(name string)
}

// Controller pauses a handler's subscriber while its breaker is open and resumes it
// with the breaker's probes at half-open and fully once closed. An open breaker turns
// half-open only when someone looks at it, and a paused handler sends nobody: a timer
// looks at it when its open timeout ends. close stops the timer; none outlives it.
type Controller struct {
	handler   string
	b         *breaker.Breaker
	hook      breakerhook.Breaker // b's pausing side
	sub       broker.Subscriber
	logger    *slog.Logger
	health    Health // nil: nobody is told
	stopWatch func()

	mu      sync.Mutex
	paused  bool
	probing bool
	timer   *time.Timer
	closed  bool
	ticks   sync.WaitGroup // the timer's function, while it runs
}

// New returns the controller of handler, pausing sub while b is open, telling health (nil:
// nobody) and logger; it follows b until Close.
func New(handler string, b *breaker.Breaker, sub broker.Subscriber, health Health, logger *slog.Logger) *Controller {
	c := &Controller{handler: handler, b: b, hook: breakerhook.Of(b), sub: sub, logger: logger, health: health}
	c.stopWatch = c.hook.Watch(c.onState)
	return c
}

// Handler is the name of the handler paused.
func (c *Controller) Handler() string { return c.handler }

// Middleware is the handler's breaker step: a message the open breaker rejects goes back
// to its queue and pauses the handler.
func (c *Controller) Middleware() message.HandlerMiddleware {
	return c.hook.ReturningMiddleware(c.onReturn)
}

// onState follows the breaker's announced state changes.
func (c *Controller) onState(from, to int) {
	c.apply(breaker.State(to), breaker.State(from).String())
}

// onReturn is called when the breaker rejected a message of this handler, which goes back
// to its queue: no more should follow until the breaker changes state. A rejection at
// half-open means the probes are out; the timer looks again after an open timeout in case
// they end without changing the state.
func (c *Controller) onReturn(state int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.pauseLocked(breaker.State(state))
}

func (c *Controller) apply(state breaker.State, from string) {
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
		c.sub.Resume(c.hook.Probes())
		if !c.probing {
			c.probing = true
			c.logger.Info("handler probing its dependency", "handler", c.handler, "breaker", c.b.Name(), "probes", c.hook.Probes(), "from", from)
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

func (c *Controller) pauseLocked(state breaker.State) {
	c.sub.Pause()
	c.probing = false
	wait := c.hook.OpenRemaining()
	if state != breaker.StateOpen || wait <= 0 {
		wait = c.hook.OpenTimeout()
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
func (c *Controller) armLocked(wait time.Duration) {
	c.stopTimerLocked()
	c.ticks.Add(1)
	// A millisecond late, so that the breaker's open timeout has surely passed.
	c.timer = time.AfterFunc(wait+time.Millisecond, c.tick)
}

func (c *Controller) stopTimerLocked() {
	if c.timer != nil && c.timer.Stop() {
		c.ticks.Done()
	}
	c.timer = nil
}

// tick looks at the breaker: reading its state turns it half-open when its open timeout
// has passed, which announces the change (and onState resumes the handler). A state that
// did not change is applied here.
func (c *Controller) tick() {
	defer c.ticks.Done()
	c.apply(c.b.State(), "timer")
}

// Paused reports whether the handler is paused now.
func (c *Controller) Paused() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.paused
}

// Close stops following the breaker and waits for a running timer function.
func (c *Controller) Close() {
	c.stopWatch()
	c.mu.Lock()
	c.closed = true
	c.stopTimerLocked()
	c.mu.Unlock()
	c.ticks.Wait()
}
