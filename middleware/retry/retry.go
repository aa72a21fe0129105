// Package retry is sluice's core step: it decides the fate of every failed attempt and
// carries it out. A handler error with attempts left does not sleep in the handler
// goroutine and does not hold the message unacked, as Watermill's Retry middleware does: the
// step hands a copy of the message to the broker's delay (RabbitMQ's delay cascade, or the
// embedded broker's scheduler) and lets the original be acked only once the broker
// confirmed the copy. The copy carries the failure headers of docs/DESIGN.md, so the next
// attempt knows its number and history.
//
// The fate comes from one decision (sluice's decision table, shown by router's Describe
// and `sluice policy`) over the attempt's error, its history and the policy (Config,
// adapted per attempt by Overload and Learned); by the error classes of package sluice:
//
//   - retryable (any plain error): attempts left → a retry after the backoff; exhausted (or
//     older than MaxTotalAge) → the dead-letter queue, errors.Is(reason,
//     disposition.ErrRetriesExhausted);
//   - RetryAfter(d, err): as retryable, but the next attempt waits exactly d;
//   - Permanent: the dead-letter queue at once;
//   - Discard: logged at warn level and acked;
//   - Defer(d, reason): tried again after d without using an attempt, until the message is
//     older than MaxTotalAge, then the dead-letter queue (disposition.ErrDeferralExpired);
//   - a message an inner step returns unprocessed (the breaker pausing its handler), or
//     one whose consumer is shutting down: back to its queue unacked, no attempt used.
//
// Every fate is carried out in one place: the failure record is built once, the one
// hand-off it needs is confirmed (the delayed copy, or the dead letter through
// Config.DeadLetterer), then the message is acked; a failed hand-off gives the message back
// unacked, never lost. Config.Observer is told each attempt's outcome once, after its
// hand-off.
package retry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v4"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/lifecycle"
	"github.com/sluice-go/sluice/internal/markers"
	"github.com/sluice-go/sluice/internal/retrystats"
)

// ErrScheduleShortened matches the reason of a message whose retries Learned.Shorten cut;
// it matches disposition.ErrRetryUnlikely too. The step's other reasons are disposition's
// (ErrRetriesExhausted, ErrDeferralExpired), which the poison step and observers share.
var ErrScheduleShortened = decide.ErrScheduleShortened

// New's refusals of a Config missing a required broker capability: a program fixes its
// code, it does not branch on them.
var (
	errNoDelayer    = errors.New("retry: Config.Delayer is required")
	errNoDeadLetter = errors.New("retry: Config.DeadLetterer is required: the step dead-letters the messages it gives up on")
)

// Event describes one retry or deferral, for OnRetry.
type Event struct {
	Queue     string
	MessageID string
	// Attempt is the attempt that failed, counting from 1.
	Attempt int
	// Delay is how long the broker holds the copy.
	Delay time.Duration
	// Deferred is true for a Defer (no attempt used).
	Deferred bool
	Err      error
}

// Config configures the step. Zero values mean the defaults named on each field.
type Config struct {
	// Delayer is the broker's delay (amqp.Broker and memory.Broker are ones). Required,
	// except in router's stack, where nil means the stack's broker.
	Delayer broker.Delayer
	// DeadLetterer publishes the messages the step gives up on to their queue's
	// dead-letter queue, with their failure record (the broker's DLQ). Required, except in
	// router's stack, where nil means the stack's broker.
	DeadLetterer broker.DeadLetterer
	// Host is recorded as a dead letter's x-failed-host. Empty means os.Hostname().
	Host string
	// MaxRetries is how many retries a message gets after its first attempt. Zero means
	// 5; negative means none (the first failure is final).
	MaxRetries int
	// InitialDelay is the backoff before the first retry. Zero means 1s.
	InitialDelay time.Duration
	// Multiplier grows the backoff from retry to retry. Zero means 2.
	Multiplier float64
	// MaxDelay caps the backoff. Zero means 1m.
	MaxDelay time.Duration
	// Jitter is the backoff's randomization factor: a delay d becomes a random value in
	// [d·(1-Jitter), d·(1+Jitter)]. Zero means 0.1; NoJitter (any negative) means none.
	Jitter float64
	// MaxTotalAge bounds a message's life from its first failure or deferral; past it,
	// retries and deferrals stop. Zero means 24h.
	MaxTotalAge time.Duration
	// MaxRetryAfter caps a RetryAfter wait and a single Defer. Zero means 24h.
	MaxRetryAfter time.Duration
	// Observer, if not nil, is told the outcome of every attempt (package disposition),
	// once, after its hand-off.
	Observer disposition.Observer
	// Stats, if not nil, counts the step's outcomes per handler and error type over a
	// sliding window (package retrystats): it is observed like Observer, and the learned
	// policy (Learned) reads it. Nil means none, unless Learned is set: then New makes one
	// with retrystats' defaults (Retry.Stats returns it).
	Stats *retrystats.Stats
	// Learned, if not nil, stops retrying error types whose retries have not been
	// recovering, with the evidence in the dead letter (see Learned). Nil means the
	// policy above applies to every error type.
	Learned *Learned
	// OnRetry is called after each confirmed retry or deferral hand-off, for logs.
	OnRetry func(Event)
	// Overload, when set, adds a retry budget, a limit on concurrent retries and an
	// adaptive policy, per dependency (see Overload). Nil means none.
	Overload *Overload
	// Logger receives discards and hand-offs. Nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock. Nil means time.Now.
	Now func() time.Time
}

func (c *Config) setDefaults() error {
	if c.Delayer == nil {
		return errNoDelayer
	}
	if c.DeadLetterer == nil {
		return errNoDeadLetter
	}
	if c.MaxRetries == 0 {
		c.MaxRetries = 5
	} else if c.MaxRetries < 0 {
		c.MaxRetries = 0
	}
	if c.InitialDelay <= 0 {
		c.InitialDelay = time.Second
	}
	if c.Multiplier == 0 {
		c.Multiplier = 2
	}
	if c.Multiplier < 1 {
		return fmt.Errorf("retry: Multiplier %v must be at least 1", c.Multiplier)
	}
	if c.MaxDelay <= 0 {
		c.MaxDelay = time.Minute
	}
	if c.MaxDelay < c.InitialDelay {
		return fmt.Errorf("retry: MaxDelay %s is shorter than InitialDelay %s", c.MaxDelay, c.InitialDelay)
	}
	if c.Jitter == 0 {
		c.Jitter = 0.1
	} else if c.Jitter < 0 {
		c.Jitter = 0
	}
	if c.Jitter >= 1 {
		return fmt.Errorf("retry: Jitter %v must be below 1", c.Jitter)
	}
	if c.MaxTotalAge <= 0 {
		c.MaxTotalAge = 24 * time.Hour
	}
	if c.MaxRetryAfter <= 0 {
		c.MaxRetryAfter = 24 * time.Hour
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Learned != nil {
		l := *c.Learned // the caller's value is left as it was
		if err := l.setDefaults(); err != nil {
			return err
		}
		c.Learned = &l
		if c.Stats == nil {
			s, err := retrystats.New(retrystats.Config{})
			if err != nil {
				return err
			}
			c.Stats = s
		}
	}
	return nil
}

// Retry is the retry step.
type Retry struct {
	cfg     Config
	carrier *carry.Carrier
	learner *learner // nil without Config.Learned
}

// New returns the retry step, or an error naming the invalid setting. cfg is a value: New
// fills its defaults in a copy.
func New(cfg Config) (*Retry, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	r := &Retry{cfg: cfg}
	var obs disposition.Observers
	if cfg.Learned != nil {
		// The learner observes the statistics for them, so its probes see their outcomes
		// at no cost to a message that never failed.
		r.learner = &learner{cfg: *cfg.Learned, stats: cfg.Stats, logger: cfg.Logger, now: cfg.Now, stopped: map[learnKey]*lease{}}
		obs = append(obs, r.learner)
	} else if cfg.Stats != nil {
		obs = append(obs, cfg.Stats)
	}
	if cfg.Overload != nil {
		obs = append(obs, cfg.Overload)
	}
	if cfg.Observer != nil {
		obs = append(obs, cfg.Observer)
	}
	if cfg.OnRetry != nil {
		obs = append(obs, disposition.ObserverFunc(func(_ context.Context, o disposition.Outcome) {
			if k := o.Disposition.Kind; k == disposition.Retry || k == disposition.Defer {
				cfg.OnRetry(Event{Queue: o.Queue, MessageID: o.MessageID, Attempt: o.Attempt, Delay: o.Disposition.Delay,
					Deferred: k == disposition.Defer, Err: o.Disposition.Reason})
			}
		}))
	}
	c := carry.Carrier{Delayer: cfg.Delayer, DeadLetterer: cfg.DeadLetterer, Logger: cfg.Logger, Host: cfg.Host, Now: cfg.Now}
	if len(obs) > 0 {
		c.Observer = obs
	}
	r.carrier = carry.New(c)
	return r, nil
}

// Config returns the settings in force, defaults filled in.
func (r *Retry) Config() Config { return r.cfg }

// Backoff returns the policy's delay before retry number n (counting from 1), drawn from
// cenkalti/backoff's exponential backoff with the configured jitter.
func (r *Retry) Backoff(n int) time.Duration {
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(r.cfg.InitialDelay),
		backoff.WithMultiplier(r.cfg.Multiplier),
		backoff.WithMaxInterval(r.cfg.MaxDelay),
		backoff.WithRandomizationFactor(r.cfg.Jitter),
		backoff.WithMaxElapsedTime(0),
	)
	// The backoff's state does not survive a broker round trip; replaying it n times
	// yields the n-th interval (n is small: bounded by MaxRetries).
	d := b.NextBackOff()
	for i := 1; i < n; i++ {
		d = b.NextBackOff()
	}
	return d
}

// Middleware returns h wrapped by the retry step, counting retries against the
// handler's name (else its queue) as dependency; see ForDependency.
func (r *Retry) Middleware(h message.HandlerFunc) message.HandlerFunc { return r.wrap(h, "", nil) }

// ForDependency returns the step for a handler that calls dependency: the overload
// protection (Config.Overload) counts its retries against that dependency's budget,
// concurrency limit and load, and observers see its name. An empty name is Middleware.
func (r *Retry) ForDependency(dependency string) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc { return r.wrap(h, dependency, nil) }
}

// NativeFor is ForDependency for a handler whose queue holds a failed delivery back itself
// with schedule n (broker.NativeRetrier, router.WithNativeRetry): a retry whose delay is
// the queue's (Min × the delivery's count, at most Max) gives the message back to its
// queue rejected, instead of handing a copy to the Delayer. Every other hand-off goes
// through the Delayer as before: a RetryAfter or Defer wait, a delay the overload
// protection stretched, a learned policy's probe (its copy must carry HeaderProbe), and
// a message whose earlier retries went through the Delayer (its own count is ahead of the
// queue's). The attempt number counts the queue's redeliveries (x-delivery-count, read only
// on a redelivery) on top of x-retry-count, so MaxRetries bounds both.
//
// A rejected message comes back unchanged: no failure headers are stamped between its
// native retries, so MaxTotalAge is not applied to them and its dead letter's history
// names only the last attempt's error (its x-retry-count is set to the retries made).
func (r *Retry) NativeFor(dependency string, n broker.NativeRetry) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc { return r.wrap(h, dependency, &n) }
}

func (r *Retry) wrap(h message.HandlerFunc, dependency string, native *broker.NativeRetry) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		// A step inside (Watermill's Timeout) may replace the message's context and cancel
		// it on return: decide and hand off with the one this attempt arrived with.
		ctx := msg.Context()
		// Named only when something reads it: the lookup walks the context.
		dep := dependency
		if dep == "" && r.cfg.Overload != nil {
			dep = dependencyOf(ctx, "")
		}
		out, err := r.call(h, msg, dep) // overload.go: the overload protection's admission
		msg.SetContext(ctx)
		if err == nil && r.carrier.Observer == nil {
			return out, nil
		}
		if dep == "" {
			dep = dependencyOf(ctx, "")
		}
		count, redeliveries := sluice.RetryCount(msg.Metadata), 0
		if native != nil {
			count, redeliveries = headers.NativeRetries(msg.Metadata)
		}
		a := carry.Attempt{Msg: msg, Queue: message.SubscribeTopicFromCtx(ctx), Retries: count, Number: count + 1, Dependency: dep,
			Compensation: carry.CompensationFrom(ctx)}
		if count == sluice.MaxRetryCountHeader {
			a.Number = count
		}
		if err == nil {
			_ = r.carrier.Carry(ctx, a, decide.Input{})
			return out, nil
		}
		a.Now = r.cfg.Now()
		if cerr := r.carrier.Carry(ctx, a, r.input(ctx, &a, err, native, redeliveries)); cerr != nil {
			return nil, cerr
		}
		return nil, nil
	}
}

// input gathers what the decision reads of a's failure err: its history, the policy in
// force (adapted by the overload protection and the learned policy), the retry budget's
// admission, the queue's native delayed retry, and whether the consumer is stopping.
func (r *Retry) input(ctx context.Context, a *carry.Attempt, err error, native *broker.NativeRetry, redeliveries int) decide.Input {
	md := a.Msg.Metadata
	// Cancelled, not past a deadline: the consumer is stopping and the failure is an
	// artifact of it. A deadline (a timeout inside this step) is the handler failing.
	in := decide.Input{Err: err, Stopping: lifecycle.ShuttingDown(ctx), Compensation: a.Compensation != nil}
	trip := headers.ReadTrip(md)
	in.History = decide.History{Retries: a.Retries, Arrived: trip.Arrived, Made: trip.Made, Now: a.Now}
	class := sluice.ClassOf(err)
	// Only sluice's own failure and replay times age a retried message: a producer's
	// cannot. A deferral can only end sooner by an earlier time, so it reads both as sent.
	in.History.FirstFailure, _ = headers.AgeStart(md, a.Now)
	a.First = in.History.FirstFailure
	if a.First.IsZero() {
		a.First = a.Now
	}
	if class == sluice.ClassDefer {
		in.History.FirstFailure, _ = failure.Time(md, headers.FirstFailureTime, a.Now)
		in.History.FirstDefer, _ = failure.Time(md, headers.FirstDeferTime, a.Now)
	}
	in.Policy = decide.Policy{MaxRetries: r.cfg.MaxRetries, MaxTotalAge: r.cfg.MaxTotalAge, MaxRetryAfter: r.cfg.MaxRetryAfter, Backoff: r.Backoff}
	if _, unprocessed := markers.UnprocessedOf(err); class != sluice.ClassRetryable || in.Stopping || unprocessed {
		// The table reads no adapted policy, budget or native hold for this error: the
		// overload protection and the learned policy are not asked (they log and count).
		return in
	}
	plan := r.plan(ctx, a.Queue, a.Dependency)
	in.Policy.MaxRetries = plan.MaxRetries
	backoff := r.Backoff
	if native != nil {
		backoff = native.Delay
	}
	in.Policy.Backoff = func(n int) time.Duration { return stretch(backoff(n), plan) }
	if r.learner != nil {
		// The learned view goes into the decision as data, like the rest of the policy.
		learned := r.learner.judge(ctx, message.HandlerNameFromCtx(ctx), sluice.ErrorType(err), a.Msg, a.Now)
		in.Policy.Unlikely = learned.unlikely
		if to := learned.view.ShortenTo; to > 0 && to-1 < in.Policy.MaxRetries {
			in.Policy.MaxRetries = to - 1
			in.Policy.Shortened = &decide.Shortening{To: to, Recoveries: learned.view.Recovered, Evidence: learned.view.Evidence()}
		}
	}
	if r.cfg.Overload != nil {
		in.Admit = func(delay time.Duration) (time.Duration, error) {
			return r.admit(ctx, a.Msg, delay, plan, err, a.Dependency)
		}
	}
	if native != nil {
		// Read after the learned policy, which may have marked the message as its probe.
		in.Native = &decide.Native{Delay: native.Delay(redeliveries + 1), Probe: md.Get(HeaderProbe) != ""}
	}
	return in
}
