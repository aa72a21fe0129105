package sluice_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	pkgerrors "github.com/pkg/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/internal/panics"
)

var errInsufficientFunds = errors.New("insufficient funds")

func init() { sluice.RegisterErrorType(errInsufficientFunds, "insufficient_funds") }

// dialError is what net.Dial returns for a refused connection, built without a network.
func dialError() error {
	return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", errors.New("connection refused"))}
}

func syntaxError(t *testing.T) error {
	t.Helper()
	var v map[string]any
	err := json.Unmarshal([]byte("{not json"), &v)
	require.Error(t, err)
	return err
}

// Issue 17: every fmt.Errorf error had the type "error", which made `dlq stats` and
// `replay --error-type` useless. An error's Go type through the wrap chain, or a registered
// sentinel's name, is its type now.
func TestErrorType_NamesUntypedErrorsUsefully(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"net.OpError wrapped by fmt.Errorf", fmt.Errorf("charge: %w", dialError()), "net.OpError"},
		{"json.SyntaxError behind Permanent", sluice.Permanent(fmt.Errorf("decode: %w", syntaxError(t))), "json.SyntaxError"},
		{"behind RetryAfter and a hand-off", &carry.GiveBack{Reason: sluice.RetryAfter(time.Second, dialError())}, "net.OpError"},
		{"behind pkg/errors WithStack and WithMessage", pkgerrors.WithMessage(pkgerrors.WithStack(dialError()), "ctx"), "net.OpError"},
		{"first named type in errors.Join", errors.Join(errBoom, syntaxError(t), dialError()), "json.SyntaxError"},
		{"registered sentinel", fmt.Errorf("charge ord_1: %w", errInsufficientFunds), "insufficient_funds"},
		{"registered sentinel behind a named type", &wrapperErr{fmt.Errorf("x: %w", errInsufficientFunds)}, "insufficient_funds"},
		{"context.DeadlineExceeded", fmt.Errorf("gateway: %w", context.DeadlineExceeded), "deadline_exceeded"},
		{"context.Canceled", fmt.Errorf("gateway: %w", context.Canceled), "canceled"},
		{"TypedError wins over a registered sentinel", &typedErr{name: "declined", err: errInsufficientFunds}, "declined"},
		{"nothing better than errors.New", fmt.Errorf("x: %w", errBoom), sluice.ErrorTypeGeneric},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, sluice.ErrorType(tt.err))
		})
	}
}

func TestRegisterErrorType(t *testing.T) {
	errLate := errors.New("late")
	assert.Equal(t, sluice.ErrorTypeGeneric, sluice.ErrorType(errLate))
	sluice.RegisterErrorType(errLate, "late_v1")
	assert.Equal(t, "late_v1", sluice.ErrorType(fmt.Errorf("x: %w", errLate)))
	sluice.RegisterErrorType(errLate, "late")
	assert.Equal(t, "late", sluice.ErrorType(errLate), "registering again replaces the name")

	assert.Panics(t, func() { sluice.RegisterErrorType(nil, "x") })
	assert.Panics(t, func() { sluice.RegisterErrorType(errLate, "") })
}

// Issue 17: a panic's whole stack was copied into x-error-message, every history entry, the
// DLQ list row and every log line.
func TestErrorMessage_PanicIsItsValue(t *testing.T) {
	panicErr := recoveredPanic(t) // panics with "handler exploded"
	require.Contains(t, panicErr.Error(), "goroutine", "Watermill's text carries the stack")
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"plain", errBoom, "boom"},
		{"recovered panic", panicErr, "panic: handler exploded"},
		{"wrapped panic", fmt.Errorf("step: %w", panicErr), "step: panic: handler exploded"},
		{"permanent panic", sluice.Permanent(panicErr), "permanent: panic: handler exploded"},
		{"panic with an error value", middleware.RecoveredPanicError{V: errBoom, Stacktrace: "goroutine 1"}, "panic: boom"},
		{"panic pointer", &middleware.RecoveredPanicError{V: 42, Stacktrace: "goroutine 1"}, "panic: 42"},
		{"recovered by sluice", sluicePanic(t), "panic: handler exploded"},
		{"recovered by sluice, wrapped", fmt.Errorf("step: %w", sluicePanic(t)), "step: panic: handler exploded"},
		{"sluice's panic with an error value", panics.Error{Value: errBoom, Stack: "goroutine 1"}, "panic: boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := sluice.ErrorMessage(tt.err)
			assert.Equal(t, tt.want, got)
			assert.NotContains(t, got, "goroutine")
		})
	}
}

// Issue 17: a decode failure read "permanent: idempotency: ...: permanent: decode ...".
func TestPermanent_MarkerAppearsOnce(t *testing.T) {
	inner := sluice.Permanent(fmt.Errorf("decode payment request: %w", syntaxError(t)))
	tests := []struct {
		name string
		err  error
	}{
		{"Permanent of Permanent", sluice.Permanent(inner)},
		{"Permanent of a wrapped Permanent", sluice.Permanent(fmt.Errorf("key of m-1: %w", inner))},
		{"Permanent of a joined Permanent", sluice.Permanent(errors.Join(errBoom, inner))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, sluice.ClassPermanent, sluice.ClassOf(tt.err))
			assert.Equal(t, 1, strings.Count(tt.err.Error(), "permanent"), tt.err.Error())
			assert.Equal(t, "json.SyntaxError", sluice.ErrorType(tt.err))
		})
	}
}

// The outermost registered sentinel names the error, whichever was registered first.
func TestRegisterErrorType_OutermostWins(t *testing.T) {
	errInner, errOuter := errors.New("inner"), errors.New("outer")
	sluice.RegisterErrorType(errInner, "inner")
	sluice.RegisterErrorType(errOuter, "outer")
	assert.Equal(t, "outer", sluice.ErrorType(fmt.Errorf("%w: %w", errOuter, errInner)))
	assert.Equal(t, "outer", sluice.ErrorType(fmt.Errorf("x: %w", fmt.Errorf("%w: %w", errOuter, errInner))))
	assert.Equal(t, "inner", sluice.ErrorType(fmt.Errorf("%w: %w", errInner, errOuter)))
	assert.Equal(t, "inner", sluice.ErrorType(&wrapperErr{fmt.Errorf("%w", errInner)}))
}
