package idempotency

import "github.com/sluice-go/sluice"

// errorTypeKey is the error type of a key function's failure whose error names no type of
// its own.
const errorTypeKey = "idempotency_key"

// keyError is the error of a message whose key function failed. Its text starts with the
// key function's error, so a payload that does not decode reads as a decode failure in the
// dead-letter record; it matches ErrKey with errors.Is.
type keyError struct {
	// MessageID is the message whose key could not be derived.
	MessageID string
	// Err is what the key function returned.
	Err error
}

// Error returns the key function's error, then what it prevented.
func (e *keyError) Error() string {
	return e.Err.Error() + " (no idempotency key for message " + e.MessageID + ")"
}

// Unwrap returns the key function's error.
func (e *keyError) Unwrap() error { return e.Err }

// Is matches ErrKey.
func (e *keyError) Is(target error) bool { return target == ErrKey }

// ErrorType is the key function's error type (a decode failure stays "decode"), or
// "idempotency_key" when that error says nothing about itself.
func (e *keyError) ErrorType() string {
	if t := sluice.ErrorType(e.Err); t != sluice.ErrorTypeGeneric {
		return t
	}
	return errorTypeKey
}

// FailedStage names the step that failed, so that a dead letter's record names it instead
// of a handler that never ran (x-failed-stage).
func (e *keyError) FailedStage() string { return "idempotency key function" }
