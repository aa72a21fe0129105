package disposition

import (
	"context"
)

// Outcome is what one delivery attempt ended in, as observers see it.
type Outcome struct {
	// Disposition is what was done with the message. A hand-off that failed is a
	// GiveBack whose Reason is the failed publish.
	Disposition Disposition
	// ErrorType is sluice.ErrorType of the reason ("" for an Ack).
	ErrorType string
	// RetriedErrorType is the error type of the failure that had this attempt retried
	// (the message's x-last-error), "" on a message's first attempt: it tells a recovery
	// which failure it recovered from (see RetryEventOf). It is read only for an attempt
	// after the first, so a message that never failed costs nothing more.
	RetriedErrorType string
	// Attempt counts from 1.
	Attempt int
	// Queue, Handler and MessageID say which message it was.
	Queue, Handler, MessageID string
	// Dependency is the handler's dependency (its breaker's name), "" when none is named.
	Dependency string
	// Compensation, on the DeadLetter of a handler with a compensation
	// (router.WithCompensation), says what became of its event: CompensationSent,
	// CompensationBuildFailed or CompensationWithheld; "" otherwise.
	Compensation string
}

// What became of a compensation event (Outcome.Compensation); the outcome label of the
// sluice.compensations metric.
const (
	// CompensationSent: the event was published and confirmed with the dead letter.
	CompensationSent = "sent"
	// CompensationBuildFailed: the handler's builder failed or returned no event; the dead
	// letter went alone, its record saying why (x-compensation-error).
	CompensationBuildFailed = "build_failed"
	// CompensationWithheld: the last attempt was abandoned at its handler timeout and may
	// still run, so nothing was compensated; the record says so.
	CompensationWithheld = "withheld"
)

// Observer is told the Outcome of every attempt the step it is given to carries out, once,
// after the hand-off. Observe runs on the handler's goroutine: it must be quick and must not
// keep o.Disposition.Reason's message beyond the call unless it copies it.
type Observer interface {
	Observe(ctx context.Context, o Outcome)
}

// ObserverFunc is a function as an Observer.
type ObserverFunc func(ctx context.Context, o Outcome)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, o Outcome) { f(ctx, o) }

// Observers calls each of its observers in order.
type Observers []Observer

// Observe calls every observer.
func (os Observers) Observe(ctx context.Context, o Outcome) {
	for _, ob := range os {
		ob.Observe(ctx, o)
	}
}
