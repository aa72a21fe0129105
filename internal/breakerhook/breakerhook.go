// Package breakerhook reaches what sluice's own packages need of a *breaker.Breaker and a
// user never calls: the router's pause step follows a breaker's state and has the messages
// it rejects returned to their queue, and the policy description reads its open timeout
// and probes. Package breaker sets Of when it is initialized. This package cannot name
// *breaker.Breaker (breaker imports it), hence Of's any, the way gRPC's internal hooks are.
package breakerhook

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Breaker is the part of a *breaker.Breaker that only sluice's own packages use. A state
// is a breaker.State's value.
type Breaker interface {
	// Watch registers f to be called on each state change of the breaker, in order, after
	// the change was logged and passed to Config.OnStateChange, under the same rules as
	// that hook (outside the breaker's lock, on the goroutine that observed the change, so
	// quick). The returned function unregisters f.
	Watch(f func(from, to int)) (stop func())
	// OpenRemaining is how long the breaker stays open before it lets its probes through:
	// zero when it is not open (or its OpenTimeout has passed and nobody looked at it yet).
	OpenRemaining() time.Duration
	// OpenTimeout is how long the breaker stays open before it lets probes through.
	OpenTimeout() time.Duration
	// Probes is the number of calls the breaker lets through when half-open.
	Probes() int
	// ReturningMiddleware guards h like the breaker's Middleware, except that a call the
	// breaker rejects is neither deferred nor handed to Config.Fallback: onReturn is called
	// with the breaker's state (so its caller can stop consuming) and the message goes
	// back to its queue unacked, as an unprocessed GiveBack wrapping breaker.ErrOpen,
	// without using an attempt. It is the breaker step of a handler that pauses while its
	// breaker is open.
	ReturningMiddleware(onReturn func(state int)) message.HandlerMiddleware
}

// Of returns b's Breaker; b is a *breaker.Breaker (anything else panics).
var Of func(b any) Breaker
