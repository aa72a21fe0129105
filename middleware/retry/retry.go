// Package retry is sluice's retry step. A handler error with attempts left does not sleep in
// the handler goroutine and does not hold the message unacked, as Watermill's Retry
// middleware does: the step hands a copy of the message to the broker's delay (RabbitMQ's
// delay cascade, or the embedded broker's scheduler) and lets the original be acked only
// once the broker confirmed the copy. The copy carries the failure headers of docs/DESIGN.md, so
// the next attempt knows its number and history.
//
// What the step does with each error class of package sluice:
//
//   - retryable (any plain error): attempts left → delayed copy after the backoff;
//     exhausted → returned, wrapped with ErrRetriesExhausted, for the poison step;
//   - RetryAfter(d, err): as retryable, but the next attempt waits exactly d;
//   - Permanent: returned at once for the poison step;
//   - Discard: logged at warn level and acked;
//   - Defer(d, reason): delayed copy after d without using an attempt, until the message is
//     older than MaxTotalAge, then returned (as Permanent ErrDeferralExpired) for the poison
//     step.
//
// A failed hand-off returns a hand-off error: the original is nacked and redelivered,
// never lost, never dead-lettered.
package retry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v4"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/lifecycle"
	"github.com/sluice-go/sluice/internal/report"
)

// Errors the step returns for the poison step.
var (
	// ErrRetriesExhausted wraps the last error of a message that used all its retries or
	// grew older than MaxTotalAge.
	ErrRetriesExhausted = errors.New("retries exhausted")
	// ErrDeferralExpired is the error of a message deferred for longer than MaxTotalAge.
	ErrDeferralExpired = errors.New("deferred past the maximum total age")
	// ErrNoDelayer is returned by New without a Delayer.
	ErrNoDelayer = errors.New("retry: Config.Delayer is required")
)

// Delayer hands a message to the broker so it is delivered to queue after d. It returns
// only once the broker confirmed the copy.
type Delayer interface {
	Delay(ctx context.Context, queue string, d time.Duration, msg *message.Message) error
}

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
	// Delayer is the broker's delay. Required.
	Delayer Delayer
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
	// OnRetry is called after each confirmed hand-off, for logs and telemetry.
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
		return ErrNoDelayer
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
	return nil
}

// Retry is the retry step.
type Retry struct{ cfg Config }

// New returns the retry step, or an error naming the invalid setting.
func New(cfg Config) (*Retry, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Retry{cfg: cfg}, nil
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

// Middleware returns h wrapped by the retry step.
func (r *Retry) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		// A step inside (Watermill's Timeout) may replace the message's context and cancel
		// it on return: decide and hand off with the one this attempt arrived with.
		ctx := msg.Context()
		out, err := r.call(h, msg) // overload.go: budget, concurrency limit, load
		msg.SetContext(ctx)
		if err == nil || failure.IsHandoff(err) {
			return out, err
		}
		queue := message.SubscribeTopicFromCtx(ctx)
		if lifecycle.ShuttingDown(ctx) {
			// Cancelled, not past a deadline: the consumer is stopping and the failure is
			// an artifact of it, so the message goes back unacked without using an attempt.
			// A deadline (a timeout middleware outside this step) is the handler failing.
			herr := fmt.Errorf("consumer shutting down while message %s was handled: %w", msg.UUID, err)
			report.ReportOutcome(ctx, report.Report{Outcome: report.OutcomeNack, Attempt: sluice.RetryCount(msg.Metadata) + 1, Err: herr})
			return nil, failure.Handoff(herr)
		}
		hctx, cancel := lifecycle.HandoffContext(ctx)
		defer cancel()
		now := r.cfg.Now()
		count := sluice.RetryCount(msg.Metadata)
		attempt := count + 1
		if count == sluice.MaxRetryCountHeader {
			attempt = count
		}

		switch sluice.ClassOf(err) {
		case sluice.ClassPermanent:
			return nil, err
		case sluice.ClassDiscard:
			r.cfg.Logger.Warn("message discarded", "queue", queue, "message_id", msg.UUID, "attempt", attempt, "error", sluice.ErrorMessage(err))
			report.ReportOutcome(ctx, report.Report{Outcome: report.OutcomeDiscard, Attempt: attempt, Err: err})
			return nil, nil
		case sluice.ClassDefer:
			return nil, r.deferMessage(hctx, msg, queue, now, attempt, err)
		}

		// Only sluice's own failure and replay times: a producer's cannot age a message.
		first, ok := headers.AgeStart(msg.Metadata, now)
		if !ok {
			first = now
		}
		plan := r.plan(ctx, queue)
		if count >= plan.MaxRetries {
			return nil, exhausted(msg, count, 0, err)
		}
		if age := now.Sub(first); age > r.cfg.MaxTotalAge {
			return nil, exhausted(msg, count, age, err)
		}

		var delay time.Duration
		// AsType, not As: As's target escapes, an allocation per failed attempt.
		if ra, ok := errors.AsType[*sluice.RetryAfterError](err); ok && ra.After > 0 {
			delay = min(ra.After, r.cfg.MaxRetryAfter)
		} else {
			delay = stretch(r.Backoff(count+1), plan)
		}
		delay, berr := r.admit(ctx, msg, delay, plan, err)
		if berr != nil {
			return nil, berr
		}
		// The failure record, and the trace context the telemetry step injects.
		retryCopy := headers.CopyWithRoom(msg, len(headers.RetryState)+2)
		headers.StampFailure(retryCopy.Metadata, msg.Metadata, headers.Failure{
			Queue: queue, RetryCount: count + 1, Attempt: attempt, First: first, Now: now, Err: err,
		})
		if herr := r.cfg.Delayer.Delay(hctx, queue, delay, retryCopy); herr != nil {
			herr = fmt.Errorf("retry hand-off of message %s to queue %q (delay %s): %w", msg.UUID, queue, delay, herr)
			report.ReportOutcome(ctx, report.Report{Outcome: report.OutcomeNack, Attempt: attempt, Err: herr})
			return nil, failure.Handoff(herr)
		}
		report.ReportOutcome(ctx, report.Report{Outcome: report.OutcomeRetry, Delay: delay, Attempt: attempt, Err: err})
		// Checked first, as Debug checks (with a background context): the arguments are
		// boxed, and the message built, even for a record it drops.
		if r.cfg.Logger.Enabled(context.Background(), slog.LevelDebug) {
			r.cfg.Logger.Debug("message handed to broker for retry", "queue", queue, "message_id", msg.UUID, "attempt", attempt, "delay", delay, "error", sluice.ErrorMessage(err))
		}
		if r.cfg.OnRetry != nil {
			r.cfg.OnRetry(Event{Queue: queue, MessageID: msg.UUID, Attempt: attempt, Delay: delay, Err: err})
		}
		return nil, nil
	}
}

func (r *Retry) deferMessage(ctx context.Context, msg *message.Message, queue string, now time.Time, attempt int, err error) error {
	var de *sluice.DeferError
	errors.As(err, &de)
	since, ok := failure.Time(msg.Metadata, headers.FirstDeferTime, now)
	if !ok {
		since = now
	}
	if first, ok := failure.Time(msg.Metadata, headers.FirstFailureTime, now); ok && first.Before(since) {
		since = first
	}
	if age := now.Sub(since); age > r.cfg.MaxTotalAge {
		return sluice.Permanent(fmt.Errorf("%w (%s > %s): %w", ErrDeferralExpired, age.Round(time.Millisecond), r.cfg.MaxTotalAge, err))
	}
	// Capped like a RetryAfter: the broker cannot hold a message forever either.
	delay := min(max(de.After, 0), r.cfg.MaxRetryAfter)
	// The defer count, first defer time and original queue, and the trace context.
	deferred := headers.CopyWithRoom(msg, 3+2)
	md := deferred.Metadata
	defers, _ := strconv.Atoi(msg.Metadata.Get(headers.DeferCount))
	// The header is untrusted: a huge value must not wrap around to a negative count.
	md.Set(headers.DeferCount, strconv.Itoa(min(max(defers, 0), sluice.MaxRetryCountHeader)+1))
	if _, ok := failure.Time(msg.Metadata, headers.FirstDeferTime, now); !ok {
		md.Set(headers.FirstDeferTime, failure.FormatTime(now))
	}
	headers.StampOrigin(md, msg.Metadata, queue, headers.ReadTrip(msg.Metadata).Carried)
	if herr := r.cfg.Delayer.Delay(ctx, queue, delay, deferred); herr != nil {
		herr = fmt.Errorf("deferral hand-off of message %s to queue %q (delay %s): %w", msg.UUID, queue, delay, herr)
		report.ReportOutcome(ctx, report.Report{Outcome: report.OutcomeNack, Attempt: attempt, Err: herr})
		return failure.Handoff(herr)
	}
	report.ReportOutcome(ctx, report.Report{Outcome: report.OutcomeDeferred, Delay: delay, Attempt: attempt, Err: err})
	if r.cfg.OnRetry != nil {
		r.cfg.OnRetry(Event{Queue: queue, MessageID: msg.UUID, Attempt: attempt, Delay: delay, Deferred: true, Err: err})
	}
	return nil
}

// ExhaustedError is the error of a message that used all its retries or outlived
// MaxTotalAge. It matches ErrRetriesExhausted with errors.Is and unwraps to the last error.
type ExhaustedError struct {
	Retries int
	// Arrived is the part of Retries the message arrived with from outside sluice (a
	// producer's x-retry-count), Made the attempts made here, this one included.
	Arrived, Made int
	// Age is set when MaxTotalAge ended the retries.
	Age time.Duration
	Err error
}

func exhausted(msg *message.Message, count int, age time.Duration, err error) *ExhaustedError {
	trip := headers.ReadTrip(msg.Metadata)
	return &ExhaustedError{Retries: count, Arrived: trip.Arrived, Made: trip.Made + 1, Age: age, Err: err}
}

// Error names the limit reached and the last error; a retry count the message arrived
// with is named as such, beside the attempts made here.
func (e *ExhaustedError) Error() string {
	if e.Arrived > 0 {
		made := "1 attempt"
		if e.Made != 1 {
			made = strconv.Itoa(e.Made) + " attempts"
		}
		if e.Age > 0 {
			return fmt.Sprintf("retries exhausted: message %s old; arrived with x-retry-count %d; %s made here: %v", e.Age.Round(time.Millisecond), e.Arrived, made, e.Err)
		}
		return fmt.Sprintf("retries exhausted: arrived with x-retry-count %d; %s made here: %v", e.Arrived, made, e.Err)
	}
	if e.Age > 0 {
		return fmt.Sprintf("retries exhausted: message %s old after %d retries: %v", e.Age.Round(time.Millisecond), e.Retries, e.Err)
	}
	return fmt.Sprintf("retries exhausted after %d retries: %v", e.Retries, e.Err)
}

// Unwrap returns the last handler error.
func (e *ExhaustedError) Unwrap() error { return e.Err }

// Is matches ErrRetriesExhausted.
func (e *ExhaustedError) Is(target error) bool { return target == ErrRetriesExhausted }
