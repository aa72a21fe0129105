package disposition

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrRetryUnlikely matches the reason of a message the learned retry policy dead-lettered
// without retrying, because messages that failed with its error type have not been
// recovering (an *UnlikelyError). Its dead letter replays like any other.
var ErrRetryUnlikely = errors.New("retry_unlikely")

// Evidence is the learned retry policy's account of an error type over its window: of the
// messages retried after failing with it whose retries ended, how many recovered.
type Evidence struct {
	// ErrorType is the error type (sluice.ErrorType).
	ErrorType string
	// Recovered of Ended messages recovered.
	Recovered, Ended int64
	// Window is the time the counts cover.
	Window time.Duration
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

// UnlikelyError is the reason of a message the learned retry policy dead-lettered without
// retrying (Policy.Unlikely). It matches ErrRetryUnlikely with errors.Is and unwraps to
// the handler's error, so the dead letter keeps that error's type (sluice.ErrorType looks
// through it) and its class (retryable: a replay retries it as usual).
type UnlikelyError struct {
	Evidence Evidence
	// Retries is the message's retry count when the policy stopped it.
	Retries int
	Err     error
}

// Error reads "retry_unlikely: 0 of 312 recovered in the last hour (error type X): <err>".
func (e *UnlikelyError) Error() string {
	return fmt.Sprintf("retry_unlikely: %s (error type %s): %v", e.Evidence, e.Evidence.ErrorType, e.Err)
}

// Unwrap returns the handler's error.
func (e *UnlikelyError) Unwrap() error { return e.Err }

// Is matches ErrRetryUnlikely.
func (e *UnlikelyError) Is(target error) bool { return target == ErrRetryUnlikely }
