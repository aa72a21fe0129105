// Package markers holds the error types behind sluice's failure vocabulary that carry a
// value the stack reads (RetryAfter's and Defer's waits) or a decision no handler makes (a
// message returned unprocessed). The root package's constructors return them as errors;
// the decision (internal/decide) reads them. Users name none of them: they write
// sluice.RetryAfter, sluice.Defer, and errors.Is against their own errors.
package markers

import (
	"errors"
	"fmt"
	"time"
)

// RetryAfter is a retryable error whose next attempt waits exactly After.
type RetryAfter struct {
	After time.Duration
	Err   error
}

func (e *RetryAfter) Error() string { return fmt.Sprintf("retry after %s: %v", e.After, e.Err) }
func (e *RetryAfter) Unwrap() error { return e.Err }

// Defer asks for the message to be tried again after After without using a retry attempt.
type Defer struct {
	After  time.Duration
	Reason error
}

func (e *Defer) Error() string { return fmt.Sprintf("deferred for %s: %v", e.After, e.Reason) }
func (e *Defer) Unwrap() error { return e.Reason }

// Unprocessed returns a message to its queue unacked, not processed and using no attempt:
// what a paused handler's step, a stack closing before a journal is restored, and an
// attempt abandoned at close return. Not a verdict on the message: the subscriber returns it
// with a basic.nack, which RabbitMQ 4.x does not count toward a quorum queue's delivery
// limit.
type Unprocessed struct{ Reason error }

func (e *Unprocessed) Error() string { return "returned unprocessed: " + e.Reason.Error() }
func (e *Unprocessed) Unwrap() error { return e.Reason }

// ReturnUnprocessed returns reason as an Unprocessed error; nil for a nil reason.
func ReturnUnprocessed(reason error) error {
	if reason == nil {
		return nil
	}
	return &Unprocessed{Reason: reason}
}

// UnprocessedOf reports whether err's chain holds an Unprocessed, and its reason.
func UnprocessedOf(err error) (error, bool) {
	// AsType, not As: As's target escapes, an allocation on every failed attempt.
	if u, ok := errors.AsType[*Unprocessed](err); ok {
		return u.Reason, true
	}
	return nil, false
}

// Sentinels of failures that name a case of the decision table (internal/decide); each is
// exported by the public package that returns it (breaker.ErrOpen, idempotency.ErrStillRunning).
var (
	// ErrBreakerOpen is the reason of a message the open circuit breaker did not let
	// through.
	ErrBreakerOpen = errors.New("circuit breaker open")
	// ErrStillRunning is matched by the failure of a message whose idempotency key is held
	// by an abandoned attempt still running.
	ErrStillRunning = errors.New("idempotency: key held by an abandoned attempt still running")
)
