// Package steps orders sluice's steps around a handler, once, for the stack
// (router.Stack) and for a Watermill router of the user's own (router.Middlewares): the
// order and why are in package router's documentation.
package steps

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/attempt"
	"github.com/sluice-go/sluice/internal/otelstep"
	"github.com/sluice-go/sluice/internal/panics"
	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router/internal/journal"
	"github.com/sluice-go/sluice/router/internal/output"
)

// Chain is what a stack's steps are built from; a nil step is absent.
type Chain struct {
	Tel      *otelstep.Instrumentation
	Retry    *retry.Retry
	Attempts *attempt.Step
	Guard    *idempotency.Guard
	// Queues publishes outputs to queues, Exchanges to exchanges (both confirmed and,
	// with telemetry, traced).
	Queues, Exchanges message.Publisher
	// Middleware is the user's own steps (router.Config.Middleware).
	Middleware []message.HandlerMiddleware
	Breakers   *breaker.Registry
	// Timeout is the handler's deadline.
	Timeout time.Duration
}

// Handler is what one handler's options add to its steps; the zero value is a handler of
// a router of the user's own.
type Handler struct {
	// Dependency names the handler's breaker and retry budget; empty means the handler's name.
	Dependency string
	// Native is WithNativeRetry's schedule; nil means the delay cascade.
	Native *broker.NativeRetry
	// Journal holds the journaled idempotency step until its journal is restored; nil
	// means the guard's plain step, with Key (nil: the guard's own key function).
	Journal *journal.Slot
	Key     func(*message.Message) (string, error)
	// OutputTopic is the queue the outputs go to; empty means OutputExchange, or, without
	// one, the handler's publish topic from the message's context.
	OutputTopic    string
	OutputExchange string
	// RoutingKey is the routing key of an output published to OutputExchange.
	RoutingKey string
	// Pause is the breaker step of a handler that pauses while its breaker is open; nil
	// means deferring.
	Pause message.HandlerMiddleware
}

// For lists h's steps, outermost first, as Router.AddMiddleware expects them.
func (c *Chain) For(h Handler) []message.HandlerMiddleware {
	mws := make([]message.HandlerMiddleware, 0, 10+len(c.Middleware))
	if c.Tel != nil {
		mws = append(mws, c.Tel.Middleware)
	}
	// The retry step decides every failed attempt's disposition and carries it out (its
	// dead letters through the poison step): see package disposition.
	step := c.Retry.ForDependency(h.Dependency)
	if h.Native != nil {
		step = c.Retry.NativeFor(h.Dependency, *h.Native)
	}
	mws = append(mws, panics.Recoverer, step)
	// The attempt step runs everything inside it on a goroutine of its own and stops
	// waiting at the handler timeout plus its grace (package internal/attempt): idempotency
	// and output confirmation stay inside, so a late return still goes through them.
	switch {
	case h.Journal != nil:
		mws = append(mws, h.Journal.Gate, c.Attempts.Middleware, h.Journal.Middleware)
	case c.Guard != nil:
		mws = append(mws, c.Attempts.Middleware, c.Guard.NewMiddleware(h.Key, c.Observers()...))
	default:
		mws = append(mws, c.Attempts.Middleware)
	}
	if h.OutputTopic == "" && h.OutputExchange != "" {
		mws = append(mws, output.Step(c.Exchanges, h.OutputExchange, output.DefaultKey(h.RoutingKey)))
	} else {
		mws = append(mws, output.Step(c.Queues, h.OutputTopic, nil))
	}
	mws = append(mws, c.Middleware...)
	switch {
	case h.Pause != nil:
		mws = append(mws, h.Pause)
	case c.Breakers != nil:
		mws = append(mws, c.Breakers.NewMiddleware(h.Dependency))
	}
	return append(mws, timeout(c.Timeout), panics.Recoverer)
}

// Observers are told about the duplicates the idempotency step acks: the stack's
// instrumentation, when it has one.
func (c *Chain) Observers() []disposition.Observer {
	if c.Tel == nil {
		return nil
	}
	return []disposition.Observer{c.Tel}
}

// timeout gives the handler's context a deadline and restores the message's own context
// after it returns: outer steps publish hand-offs with it, which must not be cancelled. It
// tells the attempt step when the handler returned: what runs after is sluice's own work.
// The innermost panics.Recoverer, after it, turns the handler's own panic into an error
// carrying its stack, so it is retried and dead-lettered like any failure.
func timeout(d time.Duration) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			parent := msg.Context()
			ctx, cancel := context.WithTimeout(parent, d)
			defer cancel()
			msg.SetContext(ctx)
			defer msg.SetContext(parent)
			if st := attempt.From(parent); st != nil {
				defer st.HandlerReturned()
			}
			return h(msg)
		}
	}
}
