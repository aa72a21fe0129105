package breaker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/lifecycle"
	"github.com/sluice-go/sluice/internal/markers"
)

// ErrOpen is the reason of the deferral (and the error passed to Config.Fallback) when a
// breaker rejects a call: it is open, or half-open with all its probes in flight.
var ErrOpen = markers.ErrBreakerOpen

// State is the state of a breaker. Its values are gobreaker's (0 closed, 1 half-open,
// 2 open), the values the sluice.breaker.state gauge reports.
type State int

// The states of a breaker.
const (
	// StateClosed lets every call through and counts failures.
	StateClosed State = iota
	// StateHalfOpen lets Config.HalfOpenProbes calls through to test the dependency.
	StateHalfOpen
	// StateOpen lets no call through until Config.OpenTimeout has passed.
	StateOpen
)

// String returns the state's name as logged and recorded in spans.
func (s State) String() string {
	switch s {
	case StateClosed:
		return "closed"
	case StateHalfOpen:
		return "half-open"
	case StateOpen:
		return "open"
	default:
		return fmt.Sprintf("state(%d)", int(s))
	}
}

// eventName is the span event recorded when a breaker enters s.
func (s State) eventName() string {
	switch s {
	case StateOpen:
		return "breaker.open"
	case StateHalfOpen:
		return "breaker.half_open"
	default:
		return "breaker.closed"
	}
}

func fromGobreaker(s gobreaker.State) State {
	switch s {
	case gobreaker.StateOpen:
		return StateOpen
	case gobreaker.StateHalfOpen:
		return StateHalfOpen
	default:
		return StateClosed
	}
}

// Span attribute keys of the breaker's span events.
const (
	attrName    = attribute.Key("breaker.name")
	attrState   = attribute.Key("breaker.state")
	attrFrom    = attribute.Key("breaker.from")
	attrTo      = attribute.Key("breaker.to")
	attrDelayMS = attribute.Key("breaker.delay_ms")
)

// The verdicts the guarded call hands gobreaker in place of the handler's error, whose own
// result travels beside them: the handler may itself return gobreaker's errors (a handler
// that uses gobreaker), and those must not be mistaken for this breaker's rejections.
var (
	errFailure  = errors.New("breaker: failure")
	errExcluded = errors.New("breaker: excluded")
)

// result is what the guarded call returns through gobreaker.
type result struct {
	msgs []*message.Message
	err  error
}

// transition is a state change waiting to be announced.
type transition struct {
	from, to State
	at       time.Time
}

// Breaker is the circuit breaker of one dependency. Get one from Registry.Breaker; all
// handlers using the same name share it.
type Breaker struct {
	name   string
	cfg    *Config
	cb     *gobreaker.CircuitBreaker[result]
	failed *failedMessages

	// mu guards openUntil and pending. gobreaker calls onStateChange with its own lock
	// held, so mu is only ever taken last.
	mu sync.Mutex
	// openUntil is when the open state expires: gobreaker does not expose it.
	openUntil time.Time
	pending   []transition
	// deferring and pausing say how the handlers it guards take an open breaker
	// (Middleware, returningMiddleware), so the log line says what actually happens.
	deferring, pausing atomic.Bool

	// announcing is held by the one goroutine announcing pending transitions, so that
	// announcements run in order and outside gobreaker's lock.
	announcing sync.Mutex

	watchers watchers // watch (pause.go)
}

func newBreaker(name string, cfg *Config) *Breaker {
	b := &Breaker{name: name, cfg: cfg, failed: newFailedMessages(cfg.Interval)}
	b.cb = gobreaker.NewCircuitBreaker[result](gobreaker.Settings{
		Name:          name,
		MaxRequests:   uint32(cfg.HalfOpenProbes),
		Interval:      cfg.Interval,
		BucketPeriod:  cfg.Interval / windowBuckets,
		Timeout:       cfg.OpenTimeout,
		ReadyToTrip:   cfg.readyToTrip,
		IsSuccessful:  func(err error) bool { return err == nil },
		IsExcluded:    func(err error) bool { return err == errExcluded },
		OnStateChange: b.onStateChange,
	})
	return b
}

// readyToTrip decides in the closed state, after each failure, whether to open.
func (c *Config) readyToTrip(counts gobreaker.Counts) bool {
	if c.ConsecutiveFailures > 0 && int64(counts.ConsecutiveFailures) >= int64(c.ConsecutiveFailures) {
		return true
	}
	if c.FailureRatio > 0 {
		// Requests also counts calls in flight and excluded ones; the ratio is over
		// completed calls that said something about the dependency.
		done := uint64(counts.TotalSuccesses) + uint64(counts.TotalFailures)
		if done > 0 && done >= uint64(c.MinRequests) && float64(counts.TotalFailures)/float64(done) >= c.FailureRatio {
			return true
		}
	}
	return false
}

// Name returns the dependency name the breaker guards.
func (b *Breaker) Name() string { return b.name }

// State returns the breaker's current state. An open breaker whose OpenTimeout has passed
// reports StateHalfOpen.
func (b *Breaker) State() State {
	s := fromGobreaker(b.cb.State())
	// Reading the state may itself move open to half-open.
	b.announce(context.Background())
	return s
}

// Middleware guards h with the breaker: a call is made only when the breaker lets it
// through; otherwise the message is deferred (or handed to Config.Fallback).
func (b *Breaker) Middleware(h message.HandlerFunc) message.HandlerFunc {
	b.deferring.Store(true)
	return func(msg *message.Message) ([]*message.Message, error) {
		return b.handle(h, msg, nil)
	}
}

// handle makes the guarded call; a call the breaker rejects goes to onReject, or is
// deferred when onReject is nil.
func (b *Breaker) handle(h message.HandlerFunc, msg *message.Message, onReject rejecter) ([]*message.Message, error) {
	// Steps below (timeout) may replace the message's context; the verdict needs the one
	// the attempt started with.
	ctx := msg.Context()
	defer b.announce(ctx)
	res, verdict := b.cb.Execute(func() (result, error) {
		msgs, err := h(msg)
		return result{msgs: msgs, err: err}, b.verdict(ctx, msg.UUID, err)
	})
	switch verdict {
	case gobreaker.ErrOpenState, gobreaker.ErrTooManyRequests:
		if onReject != nil {
			return onReject(ctx, msg, verdict)
		}
		return b.reject(ctx, msg, verdict)
	}
	return res.msgs, res.err
}

// verdict classifies a handler's error for the counts: only retryable errors are failures,
// and only the first failure of a message within the window (see Config).
func (b *Breaker) verdict(ctx context.Context, id string, err error) error {
	switch sluice.ClassOf(err) {
	case sluice.ClassNone:
		return nil
	case sluice.ClassRetryable:
		if lifecycle.ShuttingDown(ctx) {
			// The attempt was cut short from above (shutdown), not by the dependency; a
			// deadline is the dependency being slow and counts.
			return errExcluded
		}
		if !b.failed.first(id, time.Now()) {
			// The same message failing again (a retry) says nothing new about the
			// dependency.
			return errExcluded
		}
		return errFailure
	default:
		return errExcluded
	}
}

// reject handles a call the breaker did not let through.
func (b *Breaker) reject(ctx context.Context, msg *message.Message, rejection error) ([]*message.Message, error) {
	var (
		state  State
		wait   time.Duration
		reason error
	)
	if rejection == gobreaker.ErrOpenState {
		state = StateOpen
		wait = b.openRemaining(time.Now())
		reason = fmt.Errorf("circuit breaker %q is open: %w", b.name, ErrOpen)
	} else {
		// The probes' outcome is unknown: if they fail the breaker re-opens for a whole
		// OpenTimeout, which is when a message waiting that long can next be let through;
		// if they succeed it has waited at most one OpenTimeout too long.
		state = StateHalfOpen
		wait = b.cfg.OpenTimeout
		reason = fmt.Errorf("circuit breaker %q is half-open with its %d probe(s) in flight: %w", b.name, b.cfg.HalfOpenProbes, ErrOpen)
	}
	span := trace.SpanFromContext(ctx)

	if b.cfg.Fallback != nil {
		span.AddEvent("breaker.fallback", trace.WithAttributes(attrName.String(b.name), attrState.String(state.String())))
		return b.cfg.Fallback(msg, reason)
	}

	d := wait + b.spread()
	span.AddEvent("breaker.deferred", trace.WithAttributes(
		attrName.String(b.name),
		attrState.String(state.String()),
		attrDelayMS.Int64(d.Milliseconds()),
	))
	b.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "circuit breaker rejected call; message deferred",
		slog.String("breaker", b.name),
		slog.String("state", state.String()),
		slog.String("message_uuid", msg.UUID),
		slog.Duration("delay", d),
	)
	return nil, sluice.Defer(d, reason)
}

// openRemaining is the time left until the open breaker lets its next probe through.
func (b *Breaker) openRemaining(now time.Time) time.Duration {
	b.mu.Lock()
	until := b.openUntil
	b.mu.Unlock()
	if until.IsZero() {
		return b.cfg.OpenTimeout
	}
	return max(until.Sub(now), 0)
}

func (b *Breaker) spread() time.Duration {
	if b.cfg.Spread <= 0 {
		return 0
	}
	return rand.N(b.cfg.Spread)
}

// onStateChange runs inside gobreaker with its lock held: it only records the change.
func (b *Breaker) onStateChange(_ string, from, to gobreaker.State) {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if to == gobreaker.StateOpen {
		// gobreaker took its expiry a moment earlier, so this is never before it: a
		// message deferred until openUntil finds the breaker ready to probe.
		b.openUntil = now.Add(b.cfg.OpenTimeout)
	}
	b.pending = append(b.pending, transition{from: fromGobreaker(from), to: fromGobreaker(to), at: now})
}

// announce logs, records and passes to the hook every pending transition, on the calling
// goroutine and outside gobreaker's lock. If another goroutine (or this one, from inside
// the hook) is announcing already, that one picks the new transitions up: it looks again
// after letting go.
func (b *Breaker) announce(ctx context.Context) {
	for b.hasPending() && b.announcing.TryLock() {
		b.drain(ctx)
	}
}

func (b *Breaker) hasPending() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending) > 0
}

func (b *Breaker) drain(ctx context.Context) {
	defer b.announcing.Unlock() // a panicking hook must not stop all later announcements
	for {
		b.mu.Lock()
		if len(b.pending) == 0 {
			b.mu.Unlock()
			return
		}
		t := b.pending[0]
		b.pending[0] = transition{}
		b.pending = b.pending[1:]
		b.mu.Unlock()
		b.announceOne(ctx, t)
	}
}

func (b *Breaker) announceOne(ctx context.Context, t transition) {
	level, msg := slog.LevelInfo, "circuit breaker state changed"
	attrs := []slog.Attr{
		slog.String("breaker", b.name),
		slog.String("from", t.from.String()),
		slog.String("to", t.to.String()),
	}
	if t.to == StateOpen {
		level, msg = slog.LevelWarn, b.openedLine()
		attrs = append(attrs, slog.Duration("open_timeout", b.cfg.OpenTimeout))
	}
	b.cfg.Logger.LogAttrs(ctx, level, msg, attrs...)
	trace.SpanFromContext(ctx).AddEvent(t.to.eventName(), trace.WithTimestamp(t.at), trace.WithAttributes(
		attrName.String(b.name),
		attrFrom.String(t.from.String()),
		attrTo.String(t.to.String()),
	))
	if b.cfg.OnStateChange != nil {
		b.cfg.OnStateChange(b.name, t.from, t.to)
	}
	b.watchers.notify(b.name, t.from, t.to)
}

// openedLine is the log line of an opening, named for what the guarded handlers do.
func (b *Breaker) openedLine() string {
	switch pausing, deferring := b.pausing.Load(), b.deferring.Load(); {
	case pausing && deferring:
		return "circuit breaker opened; pausing handlers paused, other calls deferred"
	case pausing:
		return "circuit breaker opened; handler paused"
	}
	return "circuit breaker opened; calls are deferred"
}
