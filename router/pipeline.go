package router

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/attempt"
	"github.com/sluice-go/sluice/internal/panics"
	"github.com/sluice-go/sluice/router/internal/output"
)

// ErrOutputWithoutTopic is the (permanent) failure of a handler that returned output
// messages where nothing says where they go: a Handle handler, or a handler added to a
// plain router without a publish topic. Acking would drop them; nacking would loop.
var ErrOutputWithoutTopic = output.ErrNoTopic

// Middlewares returns sluice's steps for a Watermill message.Router of the user's own, in
// the stack's order (see the package documentation), outermost first, as
// r.AddMiddleware(mws...) expects them; cfg is read as by New. The steps hand retries,
// dead letters and outputs to broker, and take their per-handler settings from the
// message's context: the breaker is named after the handler (Config.Breakers), the
// idempotency key comes from the Idempotency step's own key function.
//
// The output step publishes the handler's outputs itself, confirmed, to the handler's
// publish topic (message.PublishTopicFromCtx) with broker's publisher, and returns none to
// the router: so the idempotency key is marked done only once the outputs are safe, and a
// failed output publish (an unroutable output, a missing queue) is retried and
// dead-lettered like a handler failure. The topic is a queue name, as for HandleWithOutput;
// the publisher given to Router.AddHandler is not used.
//
// The consumed queues must be declared with sluice's topology (Broker.DeclareQueue), so
// that retries and dead letters have somewhere to go. A subscriber other than sluice's
// (watermill-amqp's) must decode messages with sluice's marshaler: see
// amqp.WatermillSubscriberConfig.
//
// What the steps register (with Config.Telemetry: the breaker state and overload
// gauges; with Config.Retry.Overload: its refusal listener) lasts until closeSteps is called:
// call it once the router using the steps is closed.
func Middlewares(broker Broker, cfg Config) (mws []message.HandlerMiddleware, closeSteps func() error, err error) {
	s, err := New(broker, cfg)
	if err != nil {
		return nil, nil, err
	}
	return s.steps("", handlerConfig{}), s.Close, nil
}

// compose wraps h in the stack's steps.
func (s *Stack) compose(h message.HandlerFunc, outputTopic string, hc handlerConfig) message.HandlerFunc {
	mws := s.steps(outputTopic, hc)
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	if s.cfg.StopWhenIdle > 0 {
		h = s.idle.Track(h) // attempts in flight, for Config.StopWhenIdle
	}
	return h
}

// steps lists the stack's steps, outermost first; see the package documentation for the
// order and why. An empty outputTopic means the handler's publish topic, from the context.
func (s *Stack) steps(outputTopic string, hc handlerConfig) []message.HandlerMiddleware {
	mws := make([]message.HandlerMiddleware, 0, 10+len(s.cfg.Middleware))
	if s.tel != nil {
		mws = append(mws, s.tel.Middleware)
	}
	// The retry step decides every failed attempt's disposition and carries it out (its
	// dead letters through the poison step): see package disposition.
	step := s.retry.ForDependency(hc.breaker)
	if hc.native != nil {
		step = s.retry.NativeFor(hc.breaker, *hc.native)
	}
	mws = append(mws, panics.Recoverer, step)
	// The attempt step runs everything inside it on a goroutine of its own and stops
	// waiting at the handler timeout plus its grace (package internal/attempt): idempotency
	// and output confirmation stay inside, so a late return still goes through them.
	if s.cfg.Idempotency != nil {
		var obs []disposition.Observer
		if s.tel != nil {
			obs = append(obs, s.tel)
		}
		if sl := s.journalSlot(hc, obs); sl != nil {
			mws = append(mws, sl.Gate, s.attempts.Middleware, sl.Middleware)
		} else {
			mws = append(mws, s.attempts.Middleware, s.cfg.Idempotency.NewMiddleware(hc.keyFunc, obs...))
		}
	} else {
		mws = append(mws, s.attempts.Middleware)
	}
	if out := hc.sub.output; outputTopic == "" && out != nil {
		var pub message.Publisher = output.Exchange{B: s.broker}
		if s.tel != nil {
			pub = s.tel.WrapPublisher(pub)
		}
		mws = append(mws, output.Step(pub, out.Exchange, output.DefaultKey(out.RoutingKey)))
	} else {
		mws = append(mws, output.Step(s.output, outputTopic, nil))
	}
	mws = append(mws, s.cfg.Middleware...)
	if s.cfg.Breakers != nil {
		mws = append(mws, s.breakerStep(hc)) // pause.go
	}
	return append(mws, timeout(s.cfg.HandlerTimeout), recoverHandlerPanic)
}

// checkOptions refuses options that cannot take effect.
func (s *Stack) checkOptions(name string, hc handlerConfig) error {
	switch {
	case hc.keyFunc != nil && s.cfg.Idempotency == nil:
		return fmt.Errorf("%w: handler %q sets WithIdempotencyKey but Config.Idempotency is nil (set it to an idempotency.Guard)", ErrInvalidOption, name)
	case hc.breakerSet && s.cfg.Breakers == nil && s.cfg.Retry.Overload == nil:
		// WithBreaker names the dependency: its breaker's, and its retry budget's.
		return fmt.Errorf("%w: handler %q sets WithBreaker(%q) but Config.Breakers and Config.Retry.Overload are nil (set Breakers to a breaker.Registry)", ErrInvalidOption, name, hc.breaker)
	case hc.concurrency < 1:
		return fmt.Errorf("%w: handler %q has WithConcurrency(%d), must be 1 or more", ErrInvalidOption, name, hc.concurrency)
	case hc.batch != (batchConfig{}) && !hc.batched:
		return fmt.Errorf("%w: handler %q sets WithBatch but is not registered with HandleBatch", ErrInvalidOption, name)
	case hc.rebalance && hc.partitions == 0:
		return fmt.Errorf("%w: handler %q sets WithRebalancing without WithPartitions", ErrInvalidOption, name)
	case hc.prefetch < 0:
		return fmt.Errorf("%w: handler %q has WithPrefetch(%d), must not be negative", ErrInvalidOption, name, hc.prefetch)
	}
	return nil
}

// timeout gives the handler's context a deadline and restores the message's own context
// after it returns: outer steps publish hand-offs with it, which must not be cancelled. It
// tells the attempt step when the handler returned: what runs after is sluice's own work.
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

// recoverHandlerPanic turns the handler's panic into an error carrying its stack (sluice's
// own recoverer, package internal/panics), so it is retried and dead-lettered like any failure.
func recoverHandlerPanic(h message.HandlerFunc) message.HandlerFunc {
	return panics.Recoverer(h)
}
