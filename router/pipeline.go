package router

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/attempt"
	"github.com/sluice-go/sluice/internal/lifecycle"
	"github.com/sluice-go/sluice/internal/otelstep"
	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router/internal/idle"
	"github.com/sluice-go/sluice/router/internal/output"
	"github.com/sluice-go/sluice/router/internal/parts"
	"github.com/sluice-go/sluice/router/internal/steps"
)

// ErrOutputWithoutTopic is the (permanent) failure of a handler that returned output
// messages where nothing says where they go: a Handle handler, or a handler added to a
// plain router without a publish topic. Acking would drop them; nacking would loop.
var ErrOutputWithoutTopic = output.ErrNoTopic

// Middlewares returns sluice's steps for a Watermill message.Router of the user's own, in
// the stack's order (see the package documentation), outermost first, as
// r.AddMiddleware(mws...) expects them; cfg is read as by New. The steps hand retries,
// dead letters and outputs to broker, and take their per-handler settings from the
// message's context: the breaker is named after the handler (Config.Breaker), the
// idempotency key comes from the guard's own key function (idempotency.Config.KeyFunc).
// No Stack is built: no Watermill router, and nothing runs until the steps do.
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
// What the steps hold (the guard built from Config.Idempotency; with Config.Telemetry: the
// breaker state and overload gauges; with Config.Retry.Overload: its refusal listener)
// lasts until closeSteps is called: call it once the router using the steps is closed.
func Middlewares(broker Broker, cfg Config) (mws []message.HandlerMiddleware, closeSteps func() error, err error) {
	c, err := build(broker, cfg)
	if err != nil {
		return nil, nil, err
	}
	return c.chain.For(steps.Handler{}), c.close, nil
}

// core is what the steps of a Stack, or Middlewares', are built from, and what they hold
// until Close.
type core struct {
	cfg      Config // with its defaults
	broker   Broker
	logger   *slog.Logger
	retry    *retry.Retry
	attempts *attempt.Step
	// cut is closed once CloseTimeout has run out after Close or the end of Run's context:
	// every attempt still running is abandoned then (abandon.go).
	cut      chan struct{}
	tel      *otelstep.Instrumentation // from Config.Telemetry, nil without (operate.go)
	guard    *idempotency.Guard        // Config.Guard, or built from Config.Idempotency
	breakers *breaker.Registry         // Config.Breakers, or built from Config.Breaker
	chain    steps.Chain
	parts    parts.List // what the options and the configuration hold until Close
	// closeGuard closes the guard built from Config.Idempotency, once; nil error otherwise.
	closeGuard func() error
}

// build checks cfg, fills in its defaults and builds the steps on b.
func build(b Broker, cfg Config) (_ *core, err error) {
	if b == nil {
		return nil, ErrNoBroker
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.HandlerTimeout <= 0 {
		cfg.HandlerTimeout = 30 * time.Second
	}
	if cfg.CloseTimeout <= 0 {
		cfg.CloseTimeout = 30 * time.Second
	}
	if cfg.AbandonGrace <= 0 {
		cfg.AbandonGrace = attempt.DefaultGrace
	}
	if cfg.MaxAbandoned <= 0 {
		cfg.MaxAbandoned = attempt.DefaultMaxAbandoned
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	if err := idle.Check(cfg.StopWhenIdle); err != nil {
		return nil, err
	}
	for i, m := range cfg.Middleware {
		if m == nil {
			return nil, fmt.Errorf("router: Config.Middleware[%d] is nil", i)
		}
	}
	switch {
	case cfg.Idempotency != nil && cfg.Guard != nil:
		return nil, errors.New("router: Config.Idempotency and Config.Guard are both set: give one")
	case cfg.Breaker != nil && cfg.Breakers != nil:
		return nil, errors.New("router: Config.Breaker and Config.Breakers are both set: give one")
	}
	c := &core{cfg: cfg, broker: b, logger: cfg.Logger, cut: make(chan struct{}), guard: cfg.Guard, breakers: cfg.Breakers,
		closeGuard: func() error { return nil }}
	defer func() {
		if err != nil {
			_ = c.close() // every registration made below goes with it
		}
	}()
	// The broker does the hand-offs unless the caller gave the retry step its own. The
	// steps get copies: the caller's Config is never changed.
	rcfg := cfg.Retry
	if rcfg.Delayer == nil {
		rcfg.Delayer = b
	}
	if rcfg.DeadLetterer == nil {
		rcfg.DeadLetterer = b
	}
	var queues, exchanges message.Publisher = broker.QueuePublisher(b), output.Exchange{B: b}
	if c.tel, err = newTelemetry(cfg.Telemetry); err != nil { // operate.go
		return nil, err
	}
	if tel := c.tel; tel != nil {
		// The first part, so closed last: the stack's instrumentation and what remains on it.
		c.parts.Add(parts.Part{Close: func() { _ = tel.Close() }})
		rcfg.Delayer = tel.WrapDelayer(rcfg.Delayer)
		rcfg.DeadLetterer = tel.WrapDeadLetterer(rcfg.DeadLetterer)
		queues, exchanges = tel.WrapPublisher(queues), tel.WrapPublisher(exchanges)
		// Telemetry observes every attempt's outcome beside the caller's observer.
		obs := disposition.Observers{tel}
		if rcfg.Observer != nil {
			obs = disposition.Observers{rcfg.Observer, tel}
		}
		rcfg.Observer = obs
	}
	if rcfg.Logger == nil {
		rcfg.Logger = cfg.Logger
	}
	if c.retry, err = retry.New(rcfg); err != nil {
		return nil, err
	}
	if cfg.Breaker != nil {
		if c.breakers, err = breaker.New(*cfg.Breaker); err != nil {
			return nil, fmt.Errorf("router: Config.Breaker: %w", err)
		}
	}
	if cfg.Idempotency != nil {
		if c.guard, err = idempotency.New(*cfg.Idempotency); err != nil {
			return nil, fmt.Errorf("router: Config.Idempotency: %w", err)
		}
		c.closeGuard = sync.OnceValue(c.guard.Close)
	}
	// The log of abandoned attempts and late returns keeps to 10 lines a second: a stuck
	// dependency abandons many at once.
	c.attempts = attempt.New(attempt.Config{Timeout: cfg.HandlerTimeout, Grace: cfg.AbandonGrace, HandoffTimeout: lifecycle.HandoffTimeout,
		Cut: c.cut, Observer: attempt.NewLog(c.logger)}, cfg.MaxAbandoned)
	c.parts.Add(parts.Part{Close: c.attempts.Close})
	if err := c.initMetrics(); err != nil { // pause.go
		return nil, err
	}
	c.chain = steps.Chain{Tel: c.tel, Retry: c.retry, Attempts: c.attempts, Guard: c.guard, Queues: queues, Exchanges: exchanges,
		Middleware: cfg.Middleware, Breakers: c.breakers, Timeout: cfg.HandlerTimeout}
	return c, nil
}

// close releases what the steps hold, the guard built from Config.Idempotency last.
func (c *core) close() error {
	c.parts.Close()
	return c.closeGuard()
}

// compose wraps h in the stack's steps.
func (s *Stack) compose(h message.HandlerFunc, outputTopic string, hc handlerConfig) message.HandlerFunc {
	sh := steps.Handler{Dependency: hc.breaker, Native: hc.native, Journal: s.journalSlot(hc), Key: hc.keyFunc, OutputTopic: outputTopic}
	if out := hc.sub.output; out != nil {
		sh.OutputExchange, sh.RoutingKey = out.Exchange, out.RoutingKey
	}
	if hc.pause != nil {
		sh.Pause = hc.pause.Middleware()
	}
	mws := s.chain.For(sh)
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	if s.cfg.StopWhenIdle > 0 {
		h = s.idle.Track(h) // attempts in flight, for Config.StopWhenIdle
	}
	return h
}

// checkOptions refuses options that cannot take effect.
func (s *Stack) checkOptions(name string, hc handlerConfig) error {
	switch {
	case hc.keyFunc != nil && s.guard == nil:
		return fmt.Errorf("%w: handler %q sets WithIdempotencyKey but Config.Idempotency is nil (set it to an idempotency.Config, or Config.Guard)", ErrInvalidOption, name)
	case hc.breakerSet && s.breakers == nil && s.cfg.Retry.Overload == nil:
		// WithBreaker names the dependency: its breaker's, and its retry budget's.
		return fmt.Errorf("%w: handler %q sets WithBreaker(%q) but Config.Breaker, Config.Breakers and Config.Retry.Overload are nil (set Breaker to a breaker.Config)", ErrInvalidOption, name, hc.breaker)
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
