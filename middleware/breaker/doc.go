// Package breaker is sluice's circuit-breaker step: it stops calling a dependency that keeps
// failing, and while the dependency is given time to recover it defers messages broker-side
// instead of failing them.
//
// # Why defer instead of returning an error
//
// Watermill's own middleware.CircuitBreaker returns gobreaker's "circuit breaker is open"
// error when the breaker rejects a call. For a message consumer that error is a nack, and a
// nacked message is redelivered at once: every message in the queue then spins between the
// broker and the consumer for as long as the breaker stays open, a hot loop that burns CPU
// and broker bandwidth and, if a retry step sits above, uses up retry attempts on calls that
// were never made. This package instead returns
//
//	nil, sluice.Defer(d, err) // err wraps ErrOpen
//
// where d is the time left until the breaker lets its next probe through plus a small random
// spread. sluice's retry step turns a *markers.Defer into a broker-side delay without using
// a retry attempt, so each message comes back about when the dependency may be tried again,
// and not all at the same instant. Deferral is bounded by the retry step's maximum total age,
// after which the message goes to the dead-letter queue; that bound is not this package's
// concern.
//
// # Pausing instead of deferring
//
// Deferral still moves every message of a backlog through the delay cascade once per open
// timeout. Pausing is the other way, which the router uses by default (router's
// WithDeferWhileOpen turns it off): a rejected message goes back to its queue unacked (a
// GiveBack disposition wrapping ErrOpen) and the router stops the handler's consumer, so the
// backlog waits in the queue. It resumes at half-open with Config.HalfOpenProbes deliveries
// and fully once closed, and looks at the breaker again when its open timeout ends, since an
// open breaker turns half-open only when someone reads its state. The mechanism is the
// router's alone (internal/breakerhook): a plain Watermill router defers.
//
// # States and what counts as a failure
//
// The state machine is github.com/sony/gobreaker/v2: closed (calls pass and are counted),
// open (no calls for Config.OpenTimeout), half-open (Config.HalfOpenProbes calls are let
// through; all succeeding closes the breaker, any failing re-opens it). The breaker trips on
// Config.ConsecutiveFailures consecutive failures, or on a failure ratio of at least
// Config.FailureRatio over a rolling window of Config.Interval once Config.MinRequests calls
// have completed in it; by default, half of at least 20 calls failing. A message counts as
// a failure once per window: its retries failing again are left out, so one poison message
// in a quiet queue cannot open the breaker and delay healthy ones.
//
// Only errors of class sluice.ClassRetryable are failures, because only they say the
// dependency may be sick. A nil error is a success. Permanent, Discard and Defer errors are
// neither: a validation refusal says nothing about the dependency's health and a Defer from
// below is not a call to it, so they are excluded from the counts (they neither trip the
// breaker nor heal it). A call cut short because the message's own context was cancelled
// (the stack is shutting down) is excluded too; a handler deadline is a failure. A panic in
// the handler is a failure (recover it inside the breaker, as the sluice stack does, so
// that it is counted once per message too).
//
// # Naming and sharing
//
// A breaker guards one dependency, not one handler: a Registry hands out one Breaker per
// dependency name, so two handlers calling the same payment gateway share its breaker and
// both stop calling it when it trips. By default the name is the handler's name
// (message.HandlerNameFromCtx); Registry.NewMiddleware(name) (the router's WithBreaker) or
// Config.Name names it explicitly.
//
// # Observability
//
// State changes are logged, passed to Config.OnStateChange and recorded as span events
// ("breaker.open", "breaker.half_open", "breaker.closed") on the span of an attempt that saw
// the change; a deferral is recorded as a "breaker.deferred" span event and reported with
// outcome "deferred". Registry.State and Registry.States expose
// the states for metrics. The package starts no goroutines.
//
// # Used alone
//
// In a plain Watermill router, without sluice's retry step to turn a deferral into a
// broker-side delay, Registry.Middleware behaves like Watermill's middleware.CircuitBreaker:
// a rejection is an error the router nacks and the pub/sub redelivers. The dependency is
// still not called while the breaker is open, and nothing is lost
// (TestRegistry_AloneInAPlainWatermillRouter).
package breaker
