package failure

import "errors"

// HandoffError means a step could not hand the message over to the broker (the delayed or
// dead-letter copy was not confirmed). The message must go back to the broker unacked and
// be redelivered: it is never dead-lettered or acked on this attempt.
type HandoffError struct{ Err error }

// Error returns the failed hand-off's text.
func (e *HandoffError) Error() string { return "hand-off failed: " + e.Err.Error() }

// Unwrap returns the publish error.
func (e *HandoffError) Unwrap() error { return e.Err }

// Handoff wraps a failed hand-off publish. Handoff(nil) returns nil.
func Handoff(err error) error {
	if err == nil {
		return nil
	}
	return &HandoffError{Err: err}
}

// IsHandoff reports whether err is a failed hand-off somewhere in its chain.
func IsHandoff(err error) bool {
	// AsType, not As: As's target escapes, an allocation on every failed attempt.
	_, ok := errors.AsType[*HandoffError](err)
	return ok
}
