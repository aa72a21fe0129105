package sluice_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/markers"
	"github.com/sluice-go/sluice/internal/panics"
)

var errBoom = errors.New("boom")

// typedErr names its own type, as a domain error does for failure records, and may wrap
// another error.
type typedErr struct {
	name string
	err  error
}

func (e *typedErr) Error() string     { return "typed: " + e.name }
func (e *typedErr) ErrorType() string { return e.name }
func (e *typedErr) Unwrap() error     { return e.err }

// customErr is a struct error without an ErrorType method.
type customErr struct{ code int }

func (e *customErr) Error() string { return fmt.Sprintf("custom %d", e.code) }

// valueErr is an error implemented on a value receiver.
type valueErr struct{}

func (valueErr) Error() string { return "value" }

// wrapperErr wraps another error without naming a type of its own.
type wrapperErr struct{ err error }

func (e *wrapperErr) Error() string { return "wrapper: " + e.err.Error() }
func (e *wrapperErr) Unwrap() error { return e.err }

// recoveredPanic returns the error Watermill's Recoverer makes of a handler's panic, as a
// Recoverer in the user's own router produces it.
func recoveredPanic(t *testing.T) error {
	t.Helper()
	return panicThrough(t, middleware.Recoverer)
}

// sluicePanic returns the error sluice's router makes of a handler's panic (its own
// recoverer, which does not import Watermill's middleware package).
func sluicePanic(t *testing.T) error {
	t.Helper()
	return panicThrough(t, panics.Recoverer)
}

// panicThrough returns what recoverer makes of a handler panicking with "handler exploded".
func panicThrough(t *testing.T, recoverer message.HandlerMiddleware) error {
	t.Helper()
	h := recoverer(func(*message.Message) ([]*message.Message, error) {
		panic("handler exploded")
	})
	out, err := h(message.NewMessage(watermill.NewUUID(), nil))
	require.Error(t, err)
	require.Empty(t, out)
	return err
}

func TestClassOf(t *testing.T) {
	sentinel := errors.New("sentinel")
	tests := []struct {
		name string
		err  error
		want sluice.Class
	}{
		{"nil", nil, sluice.ClassNone},
		{"plain error", errBoom, sluice.ClassRetryable},
		{"fmt.Errorf without %w", fmt.Errorf("x: %v", sluice.Permanent(errBoom)), sluice.ClassRetryable},
		{"Permanent", sluice.Permanent(errBoom), sluice.ClassPermanent},
		{"Discard", sluice.Discard(errBoom), sluice.ClassDiscard},
		{"RetryAfter", sluice.RetryAfter(time.Second, errBoom), sluice.ClassRetryable},
		{"Defer", sluice.Defer(time.Second, errBoom), sluice.ClassDefer},
		{"Defer without reason", sluice.Defer(time.Second, nil), sluice.ClassDefer},
		{"Permanent wrapped with %w", fmt.Errorf("charge: %w", sluice.Permanent(errBoom)), sluice.ClassPermanent},
		{"Discard wrapped twice with %w", fmt.Errorf("a: %w", fmt.Errorf("b: %w", sluice.Discard(errBoom))), sluice.ClassDiscard},
		{"Defer wrapped with %w", fmt.Errorf("breaker: %w", sluice.Defer(time.Second, nil)), sluice.ClassDefer},
		{"Permanent in a custom wrapper", &wrapperErr{sluice.Permanent(errBoom)}, sluice.ClassPermanent},
		{"Permanent outside RetryAfter", sluice.Permanent(sluice.RetryAfter(time.Second, errBoom)), sluice.ClassPermanent},
		{"RetryAfter outside Permanent", sluice.RetryAfter(time.Second, sluice.Permanent(errBoom)), sluice.ClassRetryable},
		{"Discard outside Permanent", sluice.Discard(sluice.Permanent(errBoom)), sluice.ClassDiscard},
		{"Permanent outside Discard", sluice.Permanent(sluice.Discard(errBoom)), sluice.ClassPermanent},
		{"Defer outside Permanent", sluice.Defer(time.Second, sluice.Permanent(errBoom)), sluice.ClassDefer},
		{"Permanent outside Defer", sluice.Permanent(sluice.Defer(time.Second, nil)), sluice.ClassPermanent},
		{"wrapped Permanent outside Discard", fmt.Errorf("x: %w", sluice.Permanent(sluice.Discard(errBoom))), sluice.ClassPermanent},
		{"Permanent as the second of two %w", fmt.Errorf("%w: %w", sentinel, sluice.Permanent(errBoom)), sluice.ClassPermanent},
		{"Discard in errors.Join", errors.Join(errBoom, sluice.Discard(errBoom)), sluice.ClassDiscard},
		{"first marker of two %w wins", fmt.Errorf("%w, %w", sluice.Discard(errBoom), sluice.Permanent(errBoom)), sluice.ClassDiscard},
		{"plain errors joined", errors.Join(errBoom, sentinel), sluice.ClassRetryable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := sluice.ClassOf(tt.err)
			assert.Equal(t, tt.want, got, "ClassOf(%v) = %s", tt.err, got)
		})
	}
}

func TestClass_String(t *testing.T) {
	tests := []struct {
		class sluice.Class
		want  string
	}{
		{sluice.ClassNone, "none"},
		{sluice.ClassRetryable, "retryable"},
		{sluice.ClassPermanent, "permanent"},
		{sluice.ClassDiscard, "discard"},
		{sluice.ClassDefer, "defer"},
		{sluice.Class(42), "class(42)"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.class.String())
		})
	}
}

// The helpers keep the wrapped error reachable, so errors.Is on the user's own sentinel
// still works after marking.
func TestHelpers_WrapAndUnwrap(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		wantText string
	}{
		{"Permanent", sluice.Permanent(errBoom), "permanent: boom"},
		{"Discard", sluice.Discard(errBoom), "discard: boom"},
		{"RetryAfter", sluice.RetryAfter(3*time.Second, errBoom), "retry after 3s: boom"},
		{"Defer", sluice.Defer(2*time.Second, errBoom), "deferred for 2s: boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Error(t, tt.err)
			assert.ErrorIs(t, tt.err, errBoom)
			assert.Equal(t, tt.wantText, tt.err.Error())
		})
	}
}

func TestHelpers_NilIsNil(t *testing.T) {
	tests := []struct {
		name string
		err  error
	}{
		{"Permanent", sluice.Permanent(nil)},
		{"Discard", sluice.Discard(nil)},
		{"RetryAfter", sluice.RetryAfter(time.Second, nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A typed nil in an error interface would be non-nil and classified as a failure.
			assert.NoError(t, tt.err)
			assert.Equal(t, sluice.ClassNone, sluice.ClassOf(tt.err))
		})
	}
}

func TestRetryAfter_CarriesTheWait(t *testing.T) {
	err := fmt.Errorf("gateway: %w", sluice.RetryAfter(1500*time.Millisecond, errBoom))
	var ra *markers.RetryAfter
	require.ErrorAs(t, err, &ra)
	assert.Equal(t, 1500*time.Millisecond, ra.After)
	assert.Equal(t, errBoom, ra.Err)
}

func TestDefer(t *testing.T) {
	reason := errors.New("breaker open")
	tests := []struct {
		name       string
		d          time.Duration
		reason     error
		wantReason error
	}{
		{"with a reason", 5 * time.Second, reason, reason},
		{"nil reason uses ErrDeferred", time.Second, nil, sluice.ErrDeferred},
		{"zero delay", 0, nil, sluice.ErrDeferred},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := sluice.Defer(tt.d, tt.reason)
			require.Error(t, err)
			var de *markers.Defer
			require.ErrorAs(t, err, &de)
			assert.Equal(t, tt.d, de.After)
			assert.Equal(t, tt.wantReason, de.Reason)
			assert.ErrorIs(t, err, tt.wantReason)
			assert.Contains(t, err.Error(), tt.wantReason.Error())
		})
	}
}

func TestErrorType(t *testing.T) {
	panicErr := recoveredPanic(t)
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"errors.New", errBoom, "error"},
		{"fmt.Errorf with %w", fmt.Errorf("x: %w", errBoom), "error"},
		{"fmt.Errorf with two %w", fmt.Errorf("%w: %w", errBoom, errBoom), "error"},
		{"fmt.Errorf without %w", fmt.Errorf("x: %v", errBoom), "error"},
		{"errors.Join", errors.Join(errBoom, errBoom), "error"},
		{"custom struct type", &customErr{code: 7}, "sluice_test.customErr"},
		{"custom value type", valueErr{}, "sluice_test.valueErr"},
		{"custom struct behind markers", sluice.Permanent(fmt.Errorf("x: %w", &customErr{})), "sluice_test.customErr"},
		{"a user's wrapper names itself", &wrapperErr{errBoom}, "sluice_test.wrapperErr"},
		{"TypedError", &typedErr{name: "insufficient_funds"}, "insufficient_funds"},
		{"TypedError wrapped", sluice.Permanent(fmt.Errorf("charge: %w", &typedErr{name: "card_declined"})), "card_declined"},
		{"outer TypedError wins over inner", &typedErr{name: "outer", err: &typedErr{name: "inner"}}, "outer"},
		{"TypedError wins over an inner custom type", fmt.Errorf("%w", &wrapperErr{&typedErr{name: "gateway_timeout"}}), "gateway_timeout"},
		{"TypedError wins over a panic", errors.Join(&typedErr{name: "typed"}, panicErr), "typed"},
		{"recovered panic", panicErr, "panic"},
		{"recovered panic wrapped", sluice.Permanent(fmt.Errorf("step: %w", panicErr)), "panic"},
		{"recovered by sluice", sluicePanic(t), "panic"},
		{"recovered by sluice, wrapped", fmt.Errorf("step: %w", sluicePanic(t)), "panic"},
		{"sluice's panic pointer", &panics.Error{Value: "x", Stack: "s"}, "panic"},
		{"RecoveredPanicError value", middleware.RecoveredPanicError{V: "x", Stacktrace: "s"}, "panic"},
		{"RecoveredPanicError pointer", &middleware.RecoveredPanicError{V: "x", Stacktrace: "s"}, "panic"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, sluice.ErrorType(tt.err))
		})
	}
}

func TestPanicStack(t *testing.T) {
	panicErr := recoveredPanic(t)
	tests := []struct {
		name      string
		err       error
		wantOK    bool
		wantStack string // a substring; empty: exactly ""
	}{
		{"recovered by watermill", panicErr, true, "TestPanicStack"},
		{"recovered by sluice", sluicePanic(t), true, "TestPanicStack"},
		{"recovered by sluice, wrapped by markers", sluice.Permanent(fmt.Errorf("x: %w", sluicePanic(t))), true, "TestPanicStack"},
		{"wrapped by markers", sluice.Permanent(fmt.Errorf("x: %w", panicErr)), true, "TestPanicStack"},
		{"value", middleware.RecoveredPanicError{Stacktrace: "value stack"}, true, "value stack"},
		{"pointer", &middleware.RecoveredPanicError{Stacktrace: "pointer stack"}, true, "pointer stack"},
		{"nil pointer", (*middleware.RecoveredPanicError)(nil), false, ""},
		{"plain error", errBoom, false, ""},
		{"nil", nil, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stack, ok := sluice.PanicStack(tt.err)
			assert.Equal(t, tt.wantOK, ok)
			if tt.wantStack == "" {
				assert.Empty(t, stack)
				return
			}
			assert.Contains(t, stack, tt.wantStack)
		})
	}
}
