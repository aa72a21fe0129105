// Package panics turns a handler's panic into an error that carries the panic's value and
// stack, as Watermill's middleware.Recoverer does, for the router's steps and its batch
// handlers.
//
// It exists so that sluice does not import Watermill's middleware package for its
// Recoverer and RecoveredPanicError alone: that package compiles gobreaker v1 and backoff
// v5 into every program that uses sluice's router, beside the gobreaker v2 and backoff v4
// sluice itself uses. Package sluice still reads Watermill's RecoveredPanicError, which a
// user's own router produces (sluice.PanicStack, sluice.ErrorMessage).
package panics

import (
	"fmt"
	"runtime/debug"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Error is a recovered panic: the value passed to panic and the stack of the goroutine
// that panicked.
type Error struct {
	Value any
	Stack string
}

// Error returns the text Watermill's RecoveredPanicError has, stack included, so that log
// lines, sluice.ErrorMessage (which cuts the stack off) and the dead-letter tools'
// fingerprints read both recoverers' errors alike.
func (e Error) Error() string {
	return fmt.Sprintf("panic occurred: %#v, stacktrace: \n%s", e.Value, e.Stack)
}

// Recoverer returns h, with a panic in h returned as an Error instead: the handler failed,
// and its message is retried and dead-lettered like any failure. The recovering frames are
// named Recoverer, which the dead-letter fingerprint leaves out as it leaves out
// Watermill's. (Since Go 1.21 panic(nil) recovers a *runtime.PanicNilError, so every panic
// is seen.)
func Recoverer(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) (out []*message.Message, err error) {
		defer func() {
			if r := recover(); r != nil {
				out, err = nil, Of(r)
			}
		}()
		return h(msg)
	}
}

// Of returns the Error of recovered, with the stack of the calling goroutine: call it in
// the deferred function that recovered the panic, where the stack still holds the
// panicking frames.
func Of(recovered any) Error {
	return Error{Value: recovered, Stack: string(debug.Stack())}
}
