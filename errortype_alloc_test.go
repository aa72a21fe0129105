package sluice_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/panics"
)

// asPanic claims, through an As method, to be a recovered panic of sluice's (package sluice
// reads Watermill's RecoveredPanicError without importing it, so it cannot ask an As method
// for one).
type asPanic struct{}

func (asPanic) Error() string { return "claims a panic" }
func (asPanic) As(target any) bool {
	if p, ok := target.(*panics.Error); ok {
		*p = panics.Error{Value: "claimed", Stack: "claimed stack"}
		return true
	}
	return false
}

func TestPanicStackFindsThePanicWhereverTheChainHoldsIt(t *testing.T) {
	value := middleware.RecoveredPanicError{V: "boom", Stacktrace: "value stack"}
	pointer := &middleware.RecoveredPanicError{V: "boom", Stacktrace: "pointer stack"}
	own := panics.Error{Value: "boom", Stack: "own stack"}
	tests := []struct {
		name      string
		err       error
		wantStack string
		wantOK    bool
	}{
		{"plain error", errors.New("plain"), "", false},
		{"value", value, "value stack", true},
		{"value wrapped", fmt.Errorf("handle: %w", value), "value stack", true},
		{"pointer wrapped", fmt.Errorf("handle: %w", pointer), "pointer stack", true},
		{"nil pointer", (*middleware.RecoveredPanicError)(nil), "", false},
		{"joined, second", errors.Join(errors.New("first"), value), "value stack", true},
		{"joined, none", errors.Join(errors.New("first"), errors.New("second")), "", false},
		{"As method", fmt.Errorf("wrap: %w", asPanic{}), "claimed stack", true},
		{"sluice's, wrapped", fmt.Errorf("handle: %w", own), "own stack", true},
		{"sluice's pointer, joined", errors.Join(errors.New("first"), &own), "own stack", true},
		{"sluice's nil pointer", (*panics.Error)(nil), "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stack, ok := sluice.PanicStack(tt.err)
			assert.Equal(t, tt.wantOK, ok)
			assert.Equal(t, tt.wantStack, stack)
		})
	}
}

// The retry path calls ErrorMessage several times per failed attempt: on an error that is
// no panic it must not allocate.
func TestErrorMessageOfAPlainErrorAllocatesNothing(t *testing.T) {
	err := fmt.Errorf("charge: %w", errors.New("card declined"))
	assert.Equal(t, "charge: card declined", sluice.ErrorMessage(err))
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = sluice.ErrorMessage(err) }))
}

// The retry path names each failed attempt's error type twice (failure record, span): for
// a typed or a plain error it must not allocate.
func TestErrorTypeAllocatesNothing(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("charge: %w", errors.New("card declined")),
		fmt.Errorf("charge: %w", typedDecline{}),
	} {
		_ = sluice.ErrorType(err)
		assert.Zero(t, testing.AllocsPerRun(100, func() { _ = sluice.ErrorType(err) }), err.Error())
	}
	assert.Equal(t, "card_declined", sluice.ErrorType(fmt.Errorf("charge: %w", typedDecline{})))
}

type typedDecline struct{}

func (typedDecline) Error() string     { return "card declined" }
func (typedDecline) ErrorType() string { return "card_declined" }
