// Package lifecycle tells a consumer's shutdown from a handler's deadline, for the steps
// that decide between handing a message off and giving it back.
//
// A message's context can end two ways while a handler runs. The router or subscriber
// stopping cancels it (context.Canceled): the failure is an artifact of the shutdown and
// the message goes back to the broker untouched. A deadline — sluice's HandlerTimeout or
// Watermill's middleware.Timeout, wherever it sits — ends it with
// context.DeadlineExceeded: that is the handler failing, to be retried or dead-lettered
// like any failure, and the hand-off itself must not inherit the expired deadline.
package lifecycle

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// HandoffTimeout bounds a hand-off publish (retry copy, dead letter, outputs) made with a
// context whose deadline was dropped by HandoffContext.
const HandoffTimeout = 30 * time.Second

// ShuttingDown reports whether ctx was cancelled, which in a consumer means the router or
// subscriber is stopping. A context past its deadline is not shutting down.
func ShuttingDown(ctx context.Context) bool {
	return errors.Is(ctx.Err(), context.Canceled)
}

// HandoffContext returns the context a hand-off publish runs with: ctx's values and its
// cancellation (a shutdown still stops the publish), but not its deadline, which belongs to
// the handler; HandoffTimeout bounds the publish instead. A ctx without a deadline is
// returned as it is.
func HandoffContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); !ok {
		return ctx, func() {}
	}
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), HandoffTimeout)
	stop := context.AfterFunc(ctx, func() {
		if ShuttingDown(ctx) {
			cancel()
		}
	})
	return hctx, func() {
		stop()
		cancel()
	}
}

// MessageDeadline returns a context with the deadline of m's context and none of its
// cancellation, for publishing what m's handler produced after the handler returned (the
// stack's output publishers). Moved from package broker.
func MessageDeadline(m *message.Message) (context.Context, context.CancelFunc) {
	parent := m.Context()
	ctx := context.WithoutCancel(parent)
	if dl, ok := parent.Deadline(); ok {
		return context.WithDeadline(ctx, dl)
	}
	return ctx, func() {}
}
