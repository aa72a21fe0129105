// Package router is the sluice stack: it wires a broker to the failure-handling steps in a
// fixed order and runs the user's handlers inside them. The same steps, in the same order,
// are offered to a Watermill message.Router of the user's own by Middlewares.
//
// The order, outermost first, and why:
//
//  1. tracing — one consumer span per delivery attempt, continued from the message's trace;
//     it observes each attempt's outcome (disposition.Observer)
//  2. recoverer — a panic in a step becomes an error (the message is nacked, not lost)
//  3. retry — decides each failed attempt's disposition (disposition.Decide) and carries it
//     out in one place: a retryable error with attempts left goes back to the broker
//     delayed (through the delay cascade, or, with WithNativeRetry on RabbitMQ 4.3,
//     rejected for the queue to hold back), a permanent one or one out of retries goes to
//     the DLQ (Config.Retry.DeadLetterer, else the broker's), each confirmed before the ack; then
//     the observers are told once
//  4. attempt — runs everything below on a goroutine of its own and stops waiting for it
//     at HandlerTimeout plus AbandonGrace, returned or not: the attempt is a retryable
//     failure (sluice.ErrHandlerTimeout), handed off by retry, and its late result still
//     goes through the steps below (package internal/attempt)
//  5. idempotency — a key already done is acked without calling the handler; a key held
//     by an abandoned attempt still running is a failed attempt
//  6. output — the handler's output messages are published, confirmed (so idempotency marks
//     a key done only once its outputs are safe, and a failed output publish is retried)
//  7. Config.Middleware — the user's own steps, in the order given: inside retry,
//     idempotency and output, so their failures are retried and dead-lettered like the
//     handler's, duplicates never reach them and the messages they return are published;
//     outside the breaker, so a validation or auth failure does not count against the
//     dependency
//  8. breaker — while open, the call is not made; the handler pauses (router/internal/pause) or, with
//     WithDeferWhileOpen, the message is deferred
//  9. timeout — the handler's context carries a deadline
//  10. the handler, whose own panic becomes an error carrying its stack, so retry treats it
//     like any failure
//
// Steps that are not configured are absent, not stubs. A handler deadline, sluice's or
// Watermill's middleware.Timeout wherever it is added, is a retryable failure; only the
// router's or subscriber's shutdown (the message's context cancelled) gives a message back
// to the broker without using an attempt.
//
// The stack orders the steps and runs the handlers. What a handler's options add lives in
// packages of their own under router/internal, each composed through a small interface:
// batch (HandleBatch's batches), partition (WithPartitions' handlers, through claim's
// start-up claiming or, with WithRebalancing, rebalance and handover's hand-over of done
// idempotency keys), pause (a breaker's pause), idle (Config.StopWhenIdle's watch),
// journal (restoring idempotency journals), declare (what Run declares) and parts (what
// the stack holds until Close). The broker is reached through package broker's contract
// alone.
//
// Options that cannot take effect are errors at registration: WithIdempotencyKey without
// Config.Idempotency, WithBreaker without Config.Breaker and WithNativeRetry on a broker
// without native delayed retry make Handle fail.
package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/health"
	"github.com/sluice-go/sluice/internal/lifecycle"
	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router/internal/declare"
	"github.com/sluice-go/sluice/router/internal/idle"
	"github.com/sluice-go/sluice/router/internal/journal"
	"github.com/sluice-go/sluice/router/internal/pause"
	"github.com/sluice-go/sluice/router/internal/wmlog"
	"github.com/sluice-go/sluice/telemetry"
)

// Errors of the stack.
var (
	// ErrNoBroker is returned by New without a broker.
	ErrNoBroker = errors.New("router: a broker is required")
	// ErrDuplicateHandler is returned when two handlers share a name.
	ErrDuplicateHandler = errors.New("router: handler name already registered")
	// ErrRunning is returned when handlers are added after Run.
	ErrRunning = errors.New("router: stack already running")
	// ErrInvalidOption is returned by Handle and HandleWithOutput for an option value out
	// of range (a negative partition count), options that contradict each other (an
	// output queue and an output exchange, partitions with a subscription), or an option
	// whose step the Config does not have (WithIdempotencyKey without Config.Idempotency,
	// WithBreaker without Config.Breaker: it would silently do nothing). The error names
	// the handler and the option.
	ErrInvalidOption = errors.New("router: invalid handler option")
)

// Config configures the stack. The zero value (with a broker) gives the defaults named on
// each field and each step's own defaults.
type Config struct {
	// Logger is used by the stack, its steps and Watermill (through its slog adapter).
	// Nil means slog.Default().
	Logger *slog.Logger
	// Retry configures the failure path: the retry step, which decides every failed
	// attempt's fate and carries it out. A nil Delayer means the broker's delay, a nil
	// DeadLetterer the broker's dead-letter queue. With Telemetry, the step's observers are
	// Retry.Observer and the stack's instrumentation.
	Retry retry.Config
	// HandlerTimeout is the deadline of the handler's context. An attempt still running
	// AbandonGrace past it is abandoned, whether or not the handler looks at its context:
	// the stack stops waiting, the attempt is a retryable failure (error type
	// sluice.handler_timeout, its record holding the goroutine's stack) handed off like any
	// other, and the handler's slot takes the next message. Zero means 30s.
	HandlerTimeout time.Duration
	// AbandonGrace is how long past HandlerTimeout an attempt may still return before it is
	// abandoned. Zero means 1s.
	AbandonGrace time.Duration
	// MaxAbandoned bounds, per handler, the abandoned attempts still running (Go cannot
	// stop their goroutines): at the bound the handler pauses consuming, and readiness
	// (otelsetup.Operate) reports it stuck, until some return. Zero means 16.
	MaxAbandoned int
	// CloseTimeout is how long Close, and Run once its context ends, wait for in-flight
	// attempts; attempts still running then are abandoned and their messages returned to
	// the broker unacked. Zero means 30s.
	CloseTimeout time.Duration
	// Concurrency is the default number of messages a handler works on at once. Zero
	// means 1.
	Concurrency int
	// Prefetch is the default prefetch count. Zero means Concurrency.
	Prefetch int
	// Telemetry, when set, traces and measures the stack: the stack builds its
	// instrumentation from it (&telemetry.Config{}: the OpenTelemetry global providers,
	// which otelsetup.Setup installs), adds the tracing step, decorates every publish it
	// makes (output, retry hand-off, dead letter) and reports its breakers, overload guard
	// and abandoned attempts as metrics (otelsetup.Operate adds the broker connection, the
	// idempotency journal and the queue depths). Nil means no telemetry: the per-message
	// work it costs is left out.
	Telemetry *telemetry.Config
	// Breaker, when set, gives each handler a circuit breaker (see WithBreaker), from a
	// registry the stack builds with it (breaker.New). Nil means no breakers.
	Breaker *breaker.Config
	// Breakers is a registry shared with other stacks, used instead of Breaker (giving
	// both is an error): one stack per cluster whose handlers share their dependencies'
	// breakers. Nil means the stack's own, from Breaker.
	Breakers *breaker.Registry
	// Idempotency, when set, adds the idempotency step to every handler, with a guard the
	// stack builds with it (idempotency.New) and closes last on Close, so that its
	// snapshot holds every completion. Nil means no idempotency step.
	//
	// When the guard journals (idempotency.Config.DisableJournal false) and the broker
	// keeps journals (broker.Journaler: RabbitMQ), Run gives every handler's step the
	// journal sluice.idempotency.<queue> of the queue it consumes (one per partition).
	// Consuming starts at once (a partitioned handler claims its partitions as early as
	// its peers), but no message is handled until every journal has restored the keys done
	// within their TTL: a message that arrives meanwhile waits, unacknowledged, and is
	// returned unprocessed (ErrRestoring) when the stack closes first. /readyz
	// (otelsetup.Operate) says "restoring" meanwhile. Middlewares does not journal.
	Idempotency *idempotency.Config
	// Guard is a guard shared with other stacks, used instead of Idempotency (giving both
	// is an error), and closed by its owner after them: one stack per cluster, so that a
	// message on both is handled once. Nil means the stack's own, from Idempotency.
	Guard *idempotency.Guard
	// Middleware is the user's own steps (logging, auth, validation, Watermill's
	// CorrelationID or Throttle), first outermost, placed inside retry,
	// idempotency and output confirmation and outside the breaker and the handler
	// deadline (see the package documentation). Nil means none.
	Middleware []message.HandlerMiddleware
	// Plugins are Watermill router plugins (e.g. plugin.SignalsHandler), added to the
	// stack's router. Nil means none.
	Plugins []message.RouterPlugin
	// StopWhenIdle, zero, means Run consumes until its context ends or Close is called.
	// Positive: Run also returns once every consumed queue (each partition included) has
	// had no ready and no unacknowledged message and no attempt has been in flight for this
	// long, counted from the moment every handler consumes and every idempotency journal
	// is restored; it then closes the stack as Close does (hand-offs, outputs and journal
	// records confirmed, consumers cancelled) and returns nil, or Close's error naming
	// handlers whose abandoned attempts still run (those are not waited for: their
	// messages were handed off already). Messages waiting in the delay cascade or held back
	// by a queue's native delayed retry are not work in flight: the broker puts them back
	// into the queue on time, and they wake the next run (a job, or a pod KEDA starts on
	// the queue's length). The queues' depth is read every StopWhenIdle/5 (at least 100ms,
	// at most 1s) with the broker's QueueDepth. On the embedded broker (broker/memory) a
	// retry's delay is a timer in this process: Run returns while retries wait there, and
	// they are lost with the process, as everything the embedded broker holds. Negative
	// is an error from New.
	StopWhenIdle time.Duration
}

// HandlerOption tunes one handler.
type HandlerOption func(*handlerConfig)

type handlerConfig struct {
	journal     string // the consumed queue, naming its idempotency journal (journal.go)
	concurrency int
	prefetch    int
	keyFunc     func(*message.Message) (string, error)
	breaker     string
	breakerSet  bool // WithBreaker was given
	partitions  int  // WithPartitions (partition.go)

	sub subscription // WithSubscription, WithAdopt, WithOutputExchange (subscription.go)

	deferWhileOpen bool              // WithDeferWhileOpen (pause.go)
	pause          *pause.Controller // set by add (pause.go)
	batch          batchConfig       // WithBatch (batch.go)
	batched        bool              // registered by HandleBatch (batch.go)

	rebalance bool          // WithRebalancing (partition.go)
	heartbeat time.Duration // WithRebalancing (partition.go)

	native *broker.NativeRetry // WithNativeRetry (nativeretry.go)

	compensation *Compensation // WithCompensation (compensation.go)
}

// WithConcurrency sets how many messages the handler works on at once.
func WithConcurrency(n int) HandlerOption { return func(c *handlerConfig) { c.concurrency = n } }

// WithPrefetch sets the handler's prefetch count (at least its concurrency).
func WithPrefetch(n int) HandlerOption { return func(c *handlerConfig) { c.prefetch = n } }

// WithIdempotencyKey sets the function that extracts the handler's idempotency key, used
// when a message has no idempotency-key header. It needs Config.Idempotency: without it,
// Handle returns ErrInvalidOption.
func WithIdempotencyKey(f func(*message.Message) (string, error)) HandlerOption {
	return func(c *handlerConfig) { c.keyFunc = f }
}

// WithBreaker names the dependency whose breaker guards the handler; handlers naming the
// same dependency share one breaker. Without it the handler's name is used. It needs
// Config.Breaker (or Config.Retry.Overload, whose retry budget it names): without either,
// Handle returns ErrInvalidOption.
func WithBreaker(dependency string) HandlerOption {
	return func(c *handlerConfig) { c.breaker, c.breakerSet = dependency, true }
}

// Stack is a running set of handlers behind sluice's steps. It orders the steps and runs
// the handlers; what a handler's options add (pausing, partitions, batching, exchanges)
// comes from packages of their own (router/internal/...), composed through the broker
// contract, the declaration plan and the stack's parts.
type Stack struct {
	*core  // the steps and what they hold (pipeline.go)
	router *message.Router
	// cutTimer closes cut once CloseTimeout has run out after Close or the end of Run's
	// context: every attempt still running is abandoned then.
	cutOnce  sync.Once
	cutTimer *time.Timer
	// pauses are what paused consuming, for readiness (otelsetup.Operate reads them).
	pauses health.Pauses

	mu      sync.Mutex
	names   map[string]bool
	started bool
	plan    declare.Plan                  // what Run declares
	slots   []*journal.Slot               // idempotency steps Run restores before handling (journal.go)
	topics  map[string]string             // the queue each Watermill handler consumes, for Describe
	native  map[string]broker.NativeRetry // WithNativeRetry's schedule per handler, for Describe
	settle  map[string]time.Duration      // each handler's settle bound (broker.go), for Describe
	// compensations names where each compensated handler's event goes, for Describe.
	compensations map[string]string
	// closing is closed by Close; restoring is Run's restore of the journals.
	closing   chan struct{}
	closeOnce sync.Once
	// routerRun is set, under mu, once Run hands over to Watermill's router: before that,
	// Close has nothing to wait for (Watermill's Close would wait CloseTimeout for handlers
	// that never started, e.g. after a declaration failed).
	routerRun bool
	restoring *journal.Restoring
	idle      idle.Counter // attempts in flight, for Config.StopWhenIdle
}

// New builds a stack on b.
func New(b Broker, cfg Config) (*Stack, error) {
	c, err := build(b, cfg) // pipeline.go
	if err != nil {
		return nil, err
	}
	// Watermill waits for its handlers past CloseTimeout only as long as a hand-off of the
	// attempts abandoned at it may take: the attempt step returns them at CloseTimeout.
	wr, err := message.NewRouter(message.RouterConfig{CloseTimeout: c.cfg.CloseTimeout + lifecycle.HandoffTimeout}, wmlog.New(c.logger))
	if err != nil {
		_ = c.close()
		return nil, fmt.Errorf("router: %w", err)
	}
	wr.AddPlugin(c.cfg.Plugins...)
	s := &Stack{core: c, router: wr, names: map[string]bool{}, closing: make(chan struct{})}
	s.plan.Delays(c.retry.Config().MaxDelay)
	return s, nil
}

// Retry returns the retry step in force (for its policy, e.g. Backoff).
func (s *Stack) Retry() *retry.Retry { return s.retry }

// Handle registers h to consume queue. It produces no output messages.
func (s *Stack) Handle(name, queue string, h message.NoPublishHandlerFunc, opts ...HandlerOption) error {
	return s.add(name, queue, "", func(m *message.Message) ([]*message.Message, error) { return nil, h(m) }, opts)
}

// HandleWithOutput registers h to consume queue; the messages it returns are published to
// the queue outputTopic, confirmed, before the consumed message is acked.
func (s *Stack) HandleWithOutput(name, queue, outputTopic string, h message.HandlerFunc, opts ...HandlerOption) error {
	return s.add(name, queue, outputTopic, h, opts)
}

func (s *Stack) add(name, queue, outputTopic string, h message.HandlerFunc, opts []HandlerOption) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return ErrRunning
	}
	if s.names[name] {
		return fmt.Errorf("%w: %q", ErrDuplicateHandler, name)
	}
	hc := handlerConfig{concurrency: s.cfg.Concurrency, prefetch: s.cfg.Prefetch, breaker: name}
	for _, o := range opts {
		o(&hc)
	}
	if err := s.checkOptions(name, hc); err != nil {
		return err
	}
	if err := s.checkNativeRetry(name, &hc); err != nil {
		return err
	}
	plain, err := s.registerExchanges(name, queue, outputTopic, hc)
	if err != nil {
		return err
	}
	comp, err := s.compensation(name, hc)
	if err != nil {
		return err
	}
	if hc.partitions != 0 {
		return s.addPartitioned(name, queue, outputTopic, h, hc, comp)
	}
	s.names[name] = true
	switch {
	case hc.native != nil:
		s.plan.NativeRetryQueue(queue, *hc.native)
		if s.native == nil {
			s.native = map[string]broker.NativeRetry{}
		}
		s.native[name] = *hc.native
	case plain:
		s.plan.Queue(queue)
	}
	if outputTopic != "" {
		s.plan.Output(outputTopic)
	}
	mux := pause.NewMux(s.subscriber(name, hc))
	sub := mux.Subscriber()
	hc.pause = s.pauseFor(name, hc, mux.View("breaker"))
	s.trackAbandoned(name, mux.View("abandoned"))
	hc.journal = queue
	stack := withCompensation(s.compose(h, outputTopic, hc), comp)
	s.consumes(name, queue)
	s.router.AddConsumerHandler(name, queue, sub, func(m *message.Message) error {
		_, err := stack(m)
		if err != nil {
			switch broker.DeliveryFrom(m.Context()).Settlement() {
			case broker.SettleReturn, broker.SettleHoldBack:
				// Returned unprocessed, or a retry the queue holds back (WithNativeRetry): a
				// nack by decision, observed and logged by the step that made it, not a
				// handler error for Watermill to log.
				m.Nack()
				return nil
			}
		}
		return err
	})
	return nil
}

// Run declares every queue the handlers use (Declare) and consumes until ctx is done or
// Close is called, or, with Config.StopWhenIdle, until the stack has been idle that long.
func (s *Stack) Run(ctx context.Context) (err error) {
	ctx, watch := s.watchIdle().Start(ctx) // Config.StopWhenIdle (package internal/idle)
	defer func() { err = watch.End(s.Close, err) }()
	s.mu.Lock()
	s.started = true
	s.mu.Unlock()
	// Once ctx ends, attempts still running after CloseTimeout are abandoned, as on Close.
	stopCut := context.AfterFunc(ctx, s.armCut)
	defer stopCut()
	defer s.stopCut()
	if err := s.Declare(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	journals := len(s.slots)
	select {
	case <-s.closing:
		s.mu.Unlock()
		return nil // Close came first: nothing to consume
	default:
	}
	s.routerRun = true
	s.mu.Unlock()
	if journals == 0 {
		return s.router.Run(ctx)
	}
	// Consume and restore at once (see Config.Idempotency); the restore ends with Run.
	return journal.Run(ctx, s.router.Run, s.restoreJournals, s.router.Close, s.closing, func(r *journal.Restoring) {
		s.mu.Lock()
		s.restoring = r
		s.mu.Unlock()
	})
}

// Declare declares the queues of the handlers registered so far — consumed queues with
// their dead-letter queues and delay routes, output queues, partitions — as Run does. Call
// it to publish to them before Run: on RabbitMQ a publish to a queue not yet declared is
// refused as unroutable.
func (s *Stack) Declare(ctx context.Context) error {
	s.mu.Lock()
	plan := s.plan.Copy()
	s.mu.Unlock()
	return plan.Declare(ctx, s.broker)
}

// watchIdle is Config.StopWhenIdle's watch of the stack.
func (s *Stack) watchIdle() idle.Watch {
	return idle.Watch{After: s.cfg.StopWhenIdle, Counter: &s.idle, Queues: s.ConsumedQueues, Depth: s.broker.QueueDepth, Logger: s.logger,
		Consuming: func(ctx context.Context) bool {
			select {
			case <-s.router.Running():
			case <-ctx.Done():
				return false
			}
			// Run sets restoring before it starts the router: it is set by now, or never.
			s.mu.Lock()
			restoring := s.restoring
			s.mu.Unlock()
			if restoring == nil {
				return true
			}
			select {
			case <-restoring.Done():
				return true
			case <-ctx.Done():
				return false
			}
		}}
}

// Running is closed once every handler consumes.
func (s *Stack) Running() chan struct{} { return s.router.Running() }

// Close stops consuming, waits up to CloseTimeout for in-flight attempts and closes the
// subscribers. Attempts still running then are abandoned (see Config.HandlerTimeout) and
// their messages returned to the broker and redelivered later, never acked unfinished:
// Close returns within CloseTimeout, plus the time a hand-off of an attempt abandoned just
// before takes, whatever the handlers do, with an error wrapping sluice.ErrHandlerTimeout
// that names the handlers whose abandoned attempts still run. The broker itself stays
// open: its owner closes it.
func (s *Stack) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	s.armCut()
	defer s.stopCut()
	s.mu.Lock()
	restoring, ran := s.restoring, s.routerRun
	s.mu.Unlock()
	if restoring != nil {
		restoring.Stop()
	}
	s.parts.Close()
	var err error
	if ran {
		err = errors.Join(s.router.Close(), s.stillRunning())
	}
	// The guard the stack built goes last, so its snapshot holds every completion.
	return errors.Join(err, s.closeGuard())
}
