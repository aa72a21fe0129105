package sluice

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/internal/markers"
)

// Class says what the stack does with a handler's error.
type Class int

const (
	// ClassNone is the class of a nil error: the message succeeded.
	ClassNone Class = iota
	// ClassRetryable is the class of any error not wrapped by one of the helpers below.
	ClassRetryable
	// ClassPermanent errors are never retried; the message goes to the dead-letter queue.
	ClassPermanent
	// ClassDiscard errors are acknowledged and logged; no retry, no dead-letter copy.
	ClassDiscard
	// ClassDefer is not a failure: the message is tried again later without using an attempt.
	ClassDefer
)

// String returns the class name used in logs and span attributes.
func (c Class) String() string {
	switch c {
	case ClassNone:
		return "none"
	case ClassRetryable:
		return "retryable"
	case ClassPermanent:
		return "permanent"
	case ClassDiscard:
		return "discard"
	case ClassDefer:
		return "defer"
	default:
		return fmt.Sprintf("class(%d)", int(c))
	}
}

// errDeferred is the error a Defer carries when it is given no reason.
var errDeferred = errors.New("deferred")

// ErrHandlerTimeout is matched (errors.Is) by the failure of an attempt the stack stopped
// waiting for: its handler ran past the handler timeout and its grace without returning
// (error type sluice.handler_timeout; the handler's goroutine may still be running), or was
// still running when the stack closed.
var ErrHandlerTimeout = errors.New("handler abandoned past its timeout")

// ErrQueueNotFound is the one error every sluice package wraps for a queue that does not
// exist on the broker: a depth read (broker/amqp, telemetry's depth sources), a DLQ that
// is not there (dlq, the CLI). errors.Is(err, ErrQueueNotFound) tells it apart wherever
// it comes from.
var ErrQueueNotFound = errors.New("queue not found")

type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

type discardError struct{ err error }

func (e *discardError) Error() string { return "discard: " + e.err.Error() }
func (e *discardError) Unwrap() error { return e.err }

// Permanent marks err as never retryable: the message goes to the dead-letter queue on this
// attempt. Use it for validation and decode failures and business refusals. Permanent(nil)
// returns nil, and an error that is already permanent is returned as it is.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	if ClassOf(err) == ClassPermanent {
		// Already permanent: a second marker would change nothing but the text, which
		// would read "permanent: ... permanent: ...".
		return err
	}
	return &permanentError{err: err}
}

// Discard marks err as not worth keeping: the message is acknowledged and the error logged
// at warn level, with no retry and no dead-letter copy. Discard(nil) returns nil.
func Discard(err error) error {
	if err == nil {
		return nil
	}
	return &discardError{err: err}
}

// RetryAfter marks err as retryable with the next attempt exactly d later, instead of the
// backoff policy's delay (a 429's Retry-After). A non-positive d means "use the policy".
// RetryAfter(d, nil) returns nil.
func RetryAfter(d time.Duration, err error) error {
	if err == nil {
		return nil
	}
	return &markers.RetryAfter{After: d, Err: err}
}

// Defer asks for the message to be tried again after d without counting an attempt. reason
// may be nil. Deferral has its own bound (the retry step's maximum total age).
func Defer(d time.Duration, reason error) error {
	if reason == nil {
		reason = errDeferred
	}
	return &markers.Defer{After: d, Reason: reason}
}

// ClassOf returns the class of err. The outermost marker in the chain wins, so
// Permanent(RetryAfter(...)) is permanent. An error wrapping several (fmt.Errorf with two
// %w, errors.Join) is searched in the order errors.As uses, so the first marker found wins.
func ClassOf(err error) Class {
	if err == nil {
		return ClassNone
	}
	if c, ok := markerClass(err); ok {
		return c
	}
	return ClassRetryable
}

// markerClass returns the class of the first marker in err's tree, depth first.
func markerClass(err error) (Class, bool) {
	for e := err; e != nil; {
		switch e.(type) {
		case *permanentError:
			return ClassPermanent, true
		case *discardError:
			return ClassDiscard, true
		case *markers.Defer:
			return ClassDefer, true
		case *markers.RetryAfter:
			return ClassRetryable, true
		}
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			e = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, inner := range u.Unwrap() {
				if c, ok := markerClass(inner); ok {
					return c, true
				}
			}
			return 0, false
		default:
			return 0, false
		}
	}
	return 0, false
}

// TypedError is implemented by errors that name their own type for failure records,
// metrics and spans (for example "insufficient_funds").
type TypedError interface {
	ErrorType() string
}

// PanicStack returns the stack of a recovered panic carried by err, if any: the router's
// (a handler's panic), or Watermill's middleware.RecoveredPanicError from a Recoverer of the
// user's own.
func PanicStack(err error) (string, bool) {
	p, ok := recoveredPanic(err)
	return p.Stack, ok
}
