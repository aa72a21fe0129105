// Package disposition holds the fate of one delivery attempt as a typed value, and the one
// function that decides it.
//
// A handler's attempt ends in exactly one Disposition: Ack, Retry after a delay, Defer
// (try again later without using an attempt), DeadLetter with a reason, Discard, or
// GiveBack (return the message to its queue unacked, to be redelivered). Decide computes it
// from the attempt's error and history and the retry Policy, and nothing else: it reads no
// context and no clock, so the whole decision table is tested as a plain function
// (decide_test.go). The retry step (package middleware/retry) calls Decide once per failed
// attempt and carries the result out in one place; an inner step that knows the fate
// itself (the breaker giving a message back while it is open) says so with Return, which
// Decide honours unchanged.
//
// Observers see every attempt's Outcome: the step that carries the disposition out calls
// Observer.Observe once per attempt, after the hand-off it made was confirmed (or failed).
package disposition

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sluice-go/sluice"
)

// Kind is what happens to the message after one attempt.
type Kind uint8

// The kinds of disposition.
const (
	// Ack acknowledges the message: the handler succeeded.
	Ack Kind = iota
	// Retry hands a copy to the broker's delay, to be tried again after Delay, and acks
	// the original once the copy is confirmed.
	Retry
	// Defer is Retry without using an attempt: the message was not processed.
	Defer
	// DeadLetter publishes the message with its failure record to its queue's dead-letter
	// queue and acks the original once the copy is confirmed.
	DeadLetter
	// Discard acks the message without processing it any further; it is logged.
	Discard
	// GiveBack returns the message to its queue unacked: it is redelivered and no attempt
	// is used. A failed hand-off, a stopping consumer and an open breaker that pauses its
	// handler end this way.
	GiveBack
	// Duplicate acks a message the idempotency step found already done, without calling
	// the handler. Only observed: Decide never returns it.
	Duplicate
)

// String returns the kind's name as the outcome label of metrics, spans and logs (the
// labels sluice has always used: Defer is "deferred", GiveBack is "nack").
func (k Kind) String() string {
	switch k {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case Defer:
		return "deferred"
	case DeadLetter:
		return "dead_letter"
	case Discard:
		return "discard"
	case GiveBack:
		return "nack"
	case Duplicate:
		return "duplicate"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Disposition is the fate of one attempt.
type Disposition struct {
	Kind Kind
	// Delay is how long the broker holds the copy of a Retry or Defer.
	Delay time.Duration
	// Reason is the error behind every kind but Ack: the handler's error, or what ended
	// the retries (an *ExhaustedError wrapping it), or why a message is given back.
	Reason error
	// Unprocessed, on a GiveBack, says the handler never processed the message (a paused
	// handler, a stopping consumer): it is returned with a basic.nack, which RabbitMQ 4.x
	// does not count toward a quorum queue's delivery limit. A GiveBack without it (a
	// failed hand-off) is a basic.reject, which it counts, so a hand-off that keeps failing
	// ends in the queue's DLQ rather than in an endless loop.
	Unprocessed bool
}

// Errors that end a message's retries; they travel in a DeadLetter's Reason.
var (
	// ErrRetriesExhausted matches the reason of a message that used all its retries or
	// grew older than the policy's MaxTotalAge.
	ErrRetriesExhausted = errors.New("retries exhausted")
	// ErrDeferralExpired is the reason of a message deferred for longer than MaxTotalAge.
	ErrDeferralExpired = errors.New("deferred past the maximum total age")
)

// ExhaustedError is the reason of a message that used all its retries or outlived
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

// Policy is the retry policy Decide applies. The retry step builds it from its Config,
// adapted per attempt by its overload protection.
type Policy struct {
	// MaxRetries is how many retries a message gets after its first attempt.
	MaxRetries int
	// MaxTotalAge bounds a message's life from its first failure or deferral.
	MaxTotalAge time.Duration
	// MaxRetryAfter caps a RetryAfter wait and a single Defer.
	MaxRetryAfter time.Duration
	// Backoff returns the delay before retry number n (counting from 1). Nil means no
	// delay.
	Backoff func(n int) time.Duration
	// NoDelay says there is no broker delay to carry a Retry or Defer out (the poison step
	// used alone): what would be retried or deferred is dead-lettered at once, with the
	// handler's error as its reason.
	NoDelay bool
	// Unlikely, when not nil, is the learned retry policy's evidence that retrying this
	// attempt's error is unlikely to help (package middleware/retry, Learned): a retryable
	// failure is dead-lettered at once, its reason an *UnlikelyError carrying the
	// evidence. Nil means retry as the policy says. It never changes the fate of any other
	// class of error.
	Unlikely *Evidence
}

// History is what the message's headers say about its earlier attempts.
type History struct {
	// Retries is x-retry-count: the retries already made.
	Retries int
	// Arrived is the part of Retries the message brought from outside sluice (a
	// producer's x-retry-count); Made the attempts sluice made before this one. Both only
	// name the limit in an ExhaustedError.
	Arrived, Made int
	// FirstFailure and FirstDefer are the first failure's and first deferral's times;
	// zero when there was none. The caller reads only sluice's own headers for them: a
	// producer's time must not age a message.
	FirstFailure, FirstDefer time.Time
	// Now is the time of this attempt's end.
	Now time.Time
}

// Decide returns the disposition of an attempt that ended with err, under policy p. It is
// the whole decision table of sluice, by the error's class (package sluice):
//
//   - nil: Ack;
//   - an inner step's own decision (Return): that decision, unchanged;
//   - Permanent: DeadLetter, reason err;
//   - Discard: Discard;
//   - Defer(d, reason): Defer after d capped at MaxRetryAfter, until the message is older
//     than MaxTotalAge (from its first deferral or failure), then DeadLetter with a
//     Permanent ErrDeferralExpired;
//   - retryable: Retry after RetryAfter's wait (capped at MaxRetryAfter) or the backoff
//     of the next retry, while retries are left and the message is younger than
//     MaxTotalAge; then DeadLetter with an *ExhaustedError.
func Decide(p Policy, h History, err error) Disposition {
	if err == nil {
		return Disposition{Kind: Ack}
	}
	if d, ok := Of(err); ok {
		return d
	}
	class := sluice.ClassOf(err)
	if p.NoDelay && (class == sluice.ClassRetryable || class == sluice.ClassDefer) {
		return Disposition{Kind: DeadLetter, Reason: err}
	}
	switch class {
	case sluice.ClassPermanent:
		return Disposition{Kind: DeadLetter, Reason: err}
	case sluice.ClassDiscard:
		return Disposition{Kind: Discard, Reason: err}
	case sluice.ClassDefer:
		since := h.Now
		if !h.FirstDefer.IsZero() && h.FirstDefer.Before(since) {
			since = h.FirstDefer
		}
		if !h.FirstFailure.IsZero() && h.FirstFailure.Before(since) {
			since = h.FirstFailure
		}
		if age := h.Now.Sub(since); age > p.MaxTotalAge {
			return Disposition{Kind: DeadLetter, Reason: sluice.Permanent(fmt.Errorf("%w (%s > %s): %w",
				ErrDeferralExpired, age.Round(time.Millisecond), p.MaxTotalAge, err))}
		}
		var after time.Duration
		if de, ok := errors.AsType[*sluice.DeferError](err); ok {
			after = de.After
		}
		// Capped like a RetryAfter: the broker cannot hold a message forever either.
		return Disposition{Kind: Defer, Delay: min(max(after, 0), p.MaxRetryAfter), Reason: err}
	}
	if p.Unlikely != nil {
		return Disposition{Kind: DeadLetter, Reason: &UnlikelyError{Evidence: *p.Unlikely, Retries: h.Retries, Err: err}}
	}
	if h.Retries >= p.MaxRetries {
		return Disposition{Kind: DeadLetter, Reason: &ExhaustedError{Retries: h.Retries, Arrived: h.Arrived, Made: h.Made + 1, Err: err}}
	}
	if !h.FirstFailure.IsZero() {
		if age := h.Now.Sub(h.FirstFailure); age > p.MaxTotalAge {
			return Disposition{Kind: DeadLetter, Reason: &ExhaustedError{Retries: h.Retries, Arrived: h.Arrived, Made: h.Made + 1, Age: age, Err: err}}
		}
	}
	// AsType, not As: As's target escapes, an allocation per failed attempt.
	if ra, ok := errors.AsType[*sluice.RetryAfterError](err); ok && ra.After > 0 {
		return Disposition{Kind: Retry, Delay: min(ra.After, p.MaxRetryAfter), Reason: err}
	}
	var delay time.Duration
	if p.Backoff != nil {
		delay = p.Backoff(h.Retries + 1)
	}
	return Disposition{Kind: Retry, Delay: delay, Reason: err}
}

// DecidedError is an inner step's own decision, returned as its error so that it reaches
// the step that carries dispositions out through Watermill's handler chain. Decide returns
// it unchanged. It unwraps to the disposition's reason.
type DecidedError struct{ D Disposition }

// Error returns the decision and its reason.
func (e *DecidedError) Error() string {
	if e.D.Reason == nil {
		return e.D.Kind.String()
	}
	return e.D.Kind.String() + ": " + e.D.Reason.Error()
}

// Unwrap returns the reason.
func (e *DecidedError) Unwrap() error { return e.D.Reason }

// Return returns d as an error for the step that carries dispositions out.
func Return(d Disposition) error { return &DecidedError{D: d} }

// GiveBackError returns the error of a message to be given back to its queue because of
// reason (GiveBack). GiveBackError(nil) returns nil.
func GiveBackError(reason error) error {
	if reason == nil {
		return nil
	}
	return &DecidedError{D: Disposition{Kind: GiveBack, Reason: reason}}
}

// ReturnUnprocessedError returns the error of a message given back to its queue without
// being processed, because of reason (GiveBack, Unprocessed): what a paused handler's step
// returns. ReturnUnprocessedError(nil) returns nil.
func ReturnUnprocessedError(reason error) error {
	if reason == nil {
		return nil
	}
	return &DecidedError{D: Disposition{Kind: GiveBack, Reason: reason, Unprocessed: true}}
}

// Of returns the decision Return put in err's chain, if there is one.
func Of(err error) (Disposition, bool) {
	// AsType, not As: As's target escapes, an allocation on every failed attempt.
	if de, ok := errors.AsType[*DecidedError](err); ok {
		return de.D, true
	}
	return Disposition{}, false
}

// IsGiveBack reports whether err carries a GiveBack decision.
func IsGiveBack(err error) bool {
	d, ok := Of(err)
	return ok && d.Kind == GiveBack
}
