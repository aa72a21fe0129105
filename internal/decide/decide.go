// Package decide is sluice's one decision: the fate of a delivery attempt, from explicit
// inputs only (its error, the retry policy, the message's history, the retry budget's
// admission, the learned policy's estimate, what the broker can do, whether the consumer is
// stopping, whether carrying out an earlier decision failed). It reads no context and no
// clock, so the whole table is tested as a plain function (decide_test.go).
//
// The table is data: an ordered list of rules, each a condition, the fate it gives and
// the sentence that says so. Decide takes the first rule whose condition holds; Explain
// renders the same rules, with a handler's settings, as what Describe, `sluice policy` and
// the docs show. Nothing else decides a fate or describes one.
package decide

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/markers"
)

// Policy is the retry policy an attempt is decided under: the retry step's settings,
// adapted per attempt by the overload protection and the learned policy.
type Policy struct {
	// MaxRetries is how many retries a message gets after its first attempt.
	MaxRetries int
	// MaxTotalAge bounds a message's life from its first failure or deferral.
	MaxTotalAge time.Duration
	// MaxRetryAfter caps a RetryAfter wait and a single Defer.
	MaxRetryAfter time.Duration
	// Backoff returns the delay before retry number n (counting from 1). Nil means no delay.
	Backoff func(n int) time.Duration
	// NoDelay says there is no broker delay to carry a Retry or Defer out (the poison step
	// used alone): what would be retried or deferred is dead-lettered at once.
	NoDelay bool
	// Unlikely, when not nil, is the learned policy's evidence that retrying this attempt's
	// error is unlikely to help: a retryable failure is dead-lettered at once.
	Unlikely *Evidence
	// Shortened, when not nil, is the learned policy's cut of this error type's schedule
	// (MaxRetries is already cut): a message whose retries it exhausted names it.
	Shortened *Shortening
}

// Shortening is the learned policy's cut of a schedule (retry.Learned.Shorten).
type Shortening struct {
	// To is the attempt the schedule was cut to; Recoveries how many recoveries of the type
	// the window held.
	To         int
	Recoveries int64
	Evidence   Evidence
}

// History is what the message's headers say about its earlier attempts.
type History struct {
	// Retries is x-retry-count: the retries already made.
	Retries int
	// Arrived is the part of Retries the message brought from outside sluice (a producer's
	// x-retry-count); Made the attempts sluice made before this one. Both only name the
	// limit in an *Exhausted.
	Arrived, Made int
	// FirstFailure and FirstDefer are the first failure's and first deferral's times; zero
	// when there was none. Only sluice's own headers are read for them.
	FirstFailure, FirstDefer time.Time
	// Now is the time of this attempt's end.
	Now time.Time
}

// Native is the queue's native delayed retry (router.WithNativeRetry), for one attempt.
type Native struct {
	// Delay is how long the queue holds this message back if it is rejected now.
	Delay time.Duration
	// Probe is set on a learned policy's probe, which must keep its mark on a copy.
	Probe bool
}

// Admit is the retry budget's admission of a retry with delay: the delay to use (a spent
// budget stretches it), or the error that ends the message's retries instead.
type Admit func(delay time.Duration) (time.Duration, error)

// Input is everything a fate depends on.
type Input struct {
	// Err is the attempt's error; nil when it succeeded.
	Err error
	// Policy and History: see their types.
	Policy  Policy
	History History
	// Stopping says the consumer is shutting down (the attempt's context was cancelled, not
	// past a deadline): a failure then is an artifact of the shutdown.
	Stopping bool
	// Admit is the retry budget; nil admits every retry as it is.
	Admit Admit
	// Native is the queue's native delayed retry; nil without one.
	Native *Native
	// HandOff is the error of carrying out an earlier decision for this attempt (the retry
	// copy or the dead letter could not be confirmed); nil when nothing failed.
	HandOff error
	// Compensation says the handler has a compensation event (router.WithCompensation): a
	// final fate (a dead letter) compensates, unless the effect may still happen.
	Compensation bool
}

// rule is one row of the table.
type rule struct {
	// name is the case as operators read it: a class of error, or a condition.
	name string
	// when reports whether the rule holds; then decides. A rule without then names a case
	// that the rules after it decide.
	when func(in *Input, class sluice.Class) bool
	then func(in *Input, class sluice.Class) disposition.Disposition
	// says is the fate in words, with a handler's settings; "" leaves the rule out of
	// Explain (a rule no handler setting changes and no operator asks about).
	says func(v View) string
}

// Decide returns the fate of an attempt: the first rule of the table that holds.
func Decide(in Input) disposition.Disposition {
	class := sluice.ClassOf(in.Err)
	for i := range rules {
		if rules[i].then != nil && rules[i].when(&in, class) {
			d := rules[i].then(&in, class)
			d.Compensate = d.Kind == disposition.DeadLetter && in.Compensation && !mayStillRun(in.Err)
			return d
		}
	}
	panic("decide: no rule holds") // the last rule always holds
}

// mayStillRun reports whether err says the message's work may still be done: its attempt
// was abandoned at its handler timeout, or its key is held by an abandoned attempt still
// running. Its dead letter is not compensated: the operator decides.
func mayStillRun(err error) bool {
	return errors.Is(err, sluice.ErrHandlerTimeout) || errors.Is(err, markers.ErrStillRunning)
}

// rules is the table, in the order Decide reads it.
var rules = []rule{
	{
		name: "success",
		when: func(in *Input, _ sluice.Class) bool { return in.Err == nil && in.HandOff == nil },
		then: func(*Input, sluice.Class) disposition.Disposition {
			return disposition.Disposition{Kind: disposition.Ack}
		},
		says: func(View) string { return "acked" },
	},
	{
		name: "hand-off failed",
		when: func(in *Input, _ sluice.Class) bool { return in.HandOff != nil },
		then: func(in *Input, _ sluice.Class) disposition.Disposition {
			// A basic.reject: RabbitMQ 4.x counts it toward a quorum queue's delivery limit, so a
			// hand-off that keeps failing ends in the queue's dead-letter queue, not a loop.
			return disposition.Disposition{Kind: disposition.GiveBack, Reason: in.HandOff}
		},
		says: func(View) string {
			return "the retry copy or dead letter was not confirmed: the message goes back to its queue unacked (basic.reject), redelivered after a growing pause, never lost"
		},
	},
	{
		name: "unprocessed",
		when: func(in *Input, _ sluice.Class) bool { _, ok := markers.UnprocessedOf(in.Err); return ok },
		then: func(in *Input, _ sluice.Class) disposition.Disposition {
			reason, _ := markers.UnprocessedOf(in.Err)
			return disposition.Disposition{Kind: disposition.GiveBack, Reason: reason, Unprocessed: true}
		},
		says: func(View) string {
			return "a step returned the message unprocessed (a paused handler, a stack closing): back to its queue unacked (basic.nack), no attempt used"
		},
	},
	{
		name: "consumer stopping",
		when: func(in *Input, _ sluice.Class) bool { return in.Stopping },
		then: func(in *Input, _ sluice.Class) disposition.Disposition {
			return disposition.Disposition{Kind: disposition.GiveBack, Unprocessed: true,
				Reason: fmt.Errorf("consumer shutting down while the message was handled: %w", in.Err)}
		},
		says: func(View) string {
			return "the consumer shut down during the attempt: back to its queue unacked (basic.nack), no attempt used"
		},
	},
	{
		name: "no delay",
		when: func(in *Input, c sluice.Class) bool {
			return in.Policy.NoDelay && (c == sluice.ClassRetryable || c == sluice.ClassDefer)
		},
		then: func(in *Input, _ sluice.Class) disposition.Disposition {
			return disposition.Disposition{Kind: disposition.DeadLetter, Reason: in.Err}
		},
	},
	{
		name: sluice.ClassPermanent.String(),
		when: func(_ *Input, c sluice.Class) bool { return c == sluice.ClassPermanent },
		then: func(in *Input, _ sluice.Class) disposition.Disposition {
			return disposition.Disposition{Kind: disposition.DeadLetter, Reason: in.Err}
		},
		says: func(v View) string { return "dead-lettered to " + v.dlq() + " at once" },
	},
	{
		name: sluice.ClassDiscard.String(),
		when: func(_ *Input, c sluice.Class) bool { return c == sluice.ClassDiscard },
		then: func(in *Input, _ sluice.Class) disposition.Disposition {
			return disposition.Disposition{Kind: disposition.Discard, Reason: in.Err}
		},
		says: func(View) string { return "acked and logged (warn); not dead-lettered" },
	},
	{
		name: "deferral expired",
		when: func(in *Input, c sluice.Class) bool {
			return c == sluice.ClassDefer && deferAge(in) > in.Policy.MaxTotalAge
		},
		then: func(in *Input, _ sluice.Class) disposition.Disposition {
			return disposition.Disposition{Kind: disposition.DeadLetter, Reason: sluice.Permanent(fmt.Errorf("%w (%s > %s): %w",
				disposition.ErrDeferralExpired, deferAge(in).Round(time.Millisecond), in.Policy.MaxTotalAge, in.Err))}
		},
	},
	{
		name: sluice.ClassDefer.String(),
		when: func(_ *Input, c sluice.Class) bool { return c == sluice.ClassDefer },
		then: func(in *Input, _ sluice.Class) disposition.Disposition {
			var after time.Duration
			if de, ok := errors.AsType[*markers.Defer](in.Err); ok {
				after = de.After
			}
			// Capped like a RetryAfter: the broker cannot hold a message forever either.
			return disposition.Disposition{Kind: disposition.Defer, Delay: min(max(after, 0), in.Policy.MaxRetryAfter), Reason: in.Err}
		},
		says: func(v View) string {
			return fmt.Sprintf("redelivered after the given delay (at most %s) without using an attempt, until %s after the first deferral; then dead-lettered (deferral expired)",
				v.MaxRetryAfter, v.MaxTotalAge)
		},
	},
	{
		name: "retry_unlikely",
		when: func(in *Input, _ sluice.Class) bool { return in.Policy.Unlikely != nil },
		then: func(in *Input, _ sluice.Class) disposition.Disposition {
			return disposition.Disposition{Kind: disposition.DeadLetter, Reason: &UnlikelyError{Evidence: *in.Policy.Unlikely, Retries: in.History.Retries, Err: in.Err}}
		},
		says: func(v View) string {
			l := v.Learned
			if l == nil {
				return ""
			}
			explore := "none explored"
			if l.Explore > 0 {
				explore = fmt.Sprintf("%g%% still retried to explore", l.Explore*100)
			}
			return fmt.Sprintf("a retryable error type with at least %d retried messages ended in the window, below %g%% recovered, is dead-lettered at once (%s)",
				l.MinEvidence, l.UnlikelyBelow*100, explore)
		},
	},
	{
		name: "retries exhausted",
		when: func(in *Input, _ sluice.Class) bool { return in.History.Retries >= in.Policy.MaxRetries },
		then: func(in *Input, _ sluice.Class) disposition.Disposition {
			var reason error = &ExhaustedError{Retries: in.History.Retries, Arrived: in.History.Arrived, Made: in.History.Made + 1, Err: in.Err}
			if s := in.Policy.Shortened; s != nil {
				reason = &ShortenedError{To: s.To, Recoveries: s.Recoveries, Evidence: s.Evidence, Err: reason}
			}
			return disposition.Disposition{Kind: disposition.DeadLetter, Reason: reason}
		},
	},
	{
		name: "max age",
		when: func(in *Input, _ sluice.Class) bool {
			h := in.History
			return !h.FirstFailure.IsZero() && h.Now.Sub(h.FirstFailure) > in.Policy.MaxTotalAge
		},
		then: func(in *Input, _ sluice.Class) disposition.Disposition {
			h := in.History
			return disposition.Disposition{Kind: disposition.DeadLetter, Reason: &ExhaustedError{
				Retries: h.Retries, Arrived: h.Arrived, Made: h.Made + 1, Age: h.Now.Sub(h.FirstFailure), Err: in.Err}}
		},
	},
	{
		name: "retry_after",
		when: func(in *Input, _ sluice.Class) bool { return retryAfter(in.Err) > 0 },
		then: func(in *Input, _ sluice.Class) disposition.Disposition {
			return admitted(in, disposition.Disposition{Kind: disposition.Retry, Delay: min(retryAfter(in.Err), in.Policy.MaxRetryAfter), Reason: in.Err})
		},
		says: func(v View) string {
			return fmt.Sprintf("retried after the error's own delay (at most %s), using an attempt; as retryable otherwise", v.MaxRetryAfter)
		},
	},
	{
		name: sluice.ClassRetryable.String(),
		when: func(*Input, sluice.Class) bool { return true },
		then: func(in *Input, _ sluice.Class) disposition.Disposition {
			var delay time.Duration
			if in.Policy.Backoff != nil {
				delay = in.Policy.Backoff(in.History.Retries + 1)
			}
			d := admitted(in, disposition.Disposition{Kind: disposition.Retry, Delay: delay, Reason: in.Err})
			// The queue holds it back itself when its hold is the delay decided, and nothing it
			// cannot carry rides on the copy (a learned probe's mark).
			if n := in.Native; n != nil && d.Kind == disposition.Retry && d.Delay == n.Delay && !n.Probe {
				d.HeldBack = true
			}
			return d
		},
		says: func(v View) string { return v.retryable() },
	},
}

// admitted passes a Retry through the retry budget: a refused one is dead-lettered with
// the budget's reason.
func admitted(in *Input, d disposition.Disposition) disposition.Disposition {
	if in.Admit == nil {
		return d
	}
	delay, err := in.Admit(d.Delay)
	if err != nil {
		return disposition.Disposition{Kind: disposition.DeadLetter, Reason: err}
	}
	d.Delay = delay
	return d
}

// deferAge is how long a deferred message has been deferred or failing.
func deferAge(in *Input) time.Duration {
	h := in.History
	since := h.Now
	if !h.FirstDefer.IsZero() && h.FirstDefer.Before(since) {
		since = h.FirstDefer
	}
	if !h.FirstFailure.IsZero() && h.FirstFailure.Before(since) {
		since = h.FirstFailure
	}
	return h.Now.Sub(since)
}

// retryAfter is a RetryAfter's wait, zero when err has none.
func retryAfter(err error) time.Duration {
	// AsType, not As: As's target escapes, an allocation per failed attempt.
	if ra, ok := errors.AsType[*markers.RetryAfter](err); ok {
		return ra.After
	}
	return 0
}

// ExhaustedError is the reason of a message that used all its retries or outlived
// MaxTotalAge. It matches disposition.ErrRetriesExhausted and unwraps to the last error.
type ExhaustedError struct {
	Retries int
	// Arrived is the part of Retries the message arrived with from outside sluice (a
	// producer's x-retry-count), Made the attempts made here, this one included.
	Arrived, Made int
	// Age is set when MaxTotalAge ended the retries.
	Age time.Duration
	Err error
}

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

func (e *ExhaustedError) Unwrap() error        { return e.Err }
func (e *ExhaustedError) Is(target error) bool { return target == disposition.ErrRetriesExhausted }

// Evidence is the learned retry policy's account of an error type over its window: of the
// messages retried after failing with it whose retries ended, how many recovered.
type Evidence struct {
	ErrorType        string
	Recovered, Ended int64
	Window           time.Duration
}

// String reads "0 of 312 recovered in the last hour".
func (e Evidence) String() string {
	return fmt.Sprintf("%d of %d recovered in the last %s", e.Recovered, e.Ended, windowName(e.Window))
}

// windowName names a window as a person would: "hour", "30m", "2h".
func windowName(d time.Duration) string {
	switch d {
	case time.Hour:
		return "hour"
	case time.Minute:
		return "minute"
	case 24 * time.Hour:
		return "day"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// UnlikelyError is the reason of a message the learned policy dead-lettered without
// retrying. It matches disposition.ErrRetryUnlikely and unwraps to the handler's error, so
// the dead letter keeps that error's type and class (a replay retries it as usual).
type UnlikelyError struct {
	Evidence Evidence
	Retries  int
	Err      error
}

func (e *UnlikelyError) Error() string {
	return fmt.Sprintf("retry_unlikely: %s (error type %s): %v", e.Evidence, e.Evidence.ErrorType, e.Err)
}
func (e *UnlikelyError) Unwrap() error        { return e.Err }
func (e *UnlikelyError) Is(target error) bool { return target == disposition.ErrRetryUnlikely }

// ErrScheduleShortened matches the reason of a message whose retries the learned policy's
// Shorten cut (retry.ErrScheduleShortened is this value).
var ErrScheduleShortened = errors.New("retry schedule shortened")

// ShortenedError is the reason of a message dead-lettered at the attempt its type's
// schedule was cut to. It matches ErrScheduleShortened and disposition.ErrRetryUnlikely
// (its dead-letter reason is retry_unlikely) and unwraps to the *ExhaustedError.
type ShortenedError struct {
	To         int
	Recoveries int64
	Evidence   Evidence
	Err        error
}

func (e *ShortenedError) Error() string {
	return fmt.Sprintf("retry_unlikely: schedule shortened to attempt %d, by which 99%% of %d recoveries came (error type %s; %s): %v",
		e.To, e.Recoveries, e.Evidence.ErrorType, e.Evidence, e.Err)
}
func (e *ShortenedError) Unwrap() error { return e.Err }
func (e *ShortenedError) Is(target error) bool {
	return target == ErrScheduleShortened || target == disposition.ErrRetryUnlikely
}
func (e *ShortenedError) DeadLetterReason() string { return ReasonRetryUnlikely }
