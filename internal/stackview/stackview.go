// Package stackview is what telemetry/otelsetup reads of a router.Stack beyond its
// exported methods: its broker, instrumentation, pauses, debug endpoints, journal figures
// and queues. The router registers the view when it is linked (router imports this package,
// never otelsetup), so that none of it is public API.
package stackview

import (
	"net/http"
	"sync/atomic"

	"github.com/sluice-go/sluice/internal/health"
	"github.com/sluice-go/sluice/internal/otelstep"
)

// View is one stack's insides.
type View struct {
	// Broker is the stack's broker: otelsetup reads its connection (Connected,
	// Reconnects) and queue depths (QueueDepth) when it has them.
	Broker any
	// Telemetry is the instrumentation the stack built from router.Config.Telemetry, nil
	// without one.
	Telemetry *otelstep.Instrumentation
	// Pauses are what paused the stack's consumption: a handler's open breaker, its
	// abandoned attempts at MaxAbandoned, the idempotency journals restoring.
	Pauses *health.Pauses
	// Policy serves the stack's description (router.Description) as JSON, or as Markdown
	// with ?format=markdown.
	Policy http.Handler
	// Retries serves the stack's retry statistics as JSON; nil when it keeps none.
	Retries http.Handler
	// Journal returns the idempotency journal's figures, and false when the stack keeps
	// no journal.
	Journal func() (otelstep.JournalState, bool)
	// Queues returns the queues the stack's handlers consume (each partition of a
	// partitioned one), and those whose dead-letter queue and archive it declares (a
	// partitioned queue's partitions dead-letter to its own).
	Queues func() (consumed, deadLettered []string)
}

var of atomic.Pointer[func(stack any) (View, bool)]

// Register sets how Of reads a stack; the router calls it from its init.
func Register(f func(stack any) (View, bool)) { of.Store(&f) }

// Of returns stack's view, and false for anything but a *router.Stack (or before the
// router registered).
func Of(stack any) (View, bool) {
	f := of.Load()
	if f == nil {
		return View{}, false
	}
	return (*f)(stack)
}
