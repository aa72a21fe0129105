// Package report carries the outcome of one delivery attempt from the step that decides it
// (retry, poison, breaker, idempotency) to the telemetry step that records it.
package report

import (
	"context"
	"sync"
	"time"
)

// Outcome is what happened to one delivery attempt. Steps report it; telemetry records it.
type Outcome string

// The outcomes of an attempt.
const (
	OutcomeAck        Outcome = "ack"
	OutcomeRetry      Outcome = "retry"
	OutcomeDeadLetter Outcome = "dead_letter"
	OutcomeDiscard    Outcome = "discard"
	OutcomeDuplicate  Outcome = "duplicate"
	OutcomeDeferred   Outcome = "deferred"
	// OutcomeNack means the message goes back to the broker unprocessed (a hand-off or
	// dead-letter publish failed, or the stack is shutting down) and will be redelivered.
	OutcomeNack Outcome = "nack"
)

// Report is what the steps learned about one attempt.
type Report struct {
	Outcome Outcome
	// Delay is the broker-side delay of a retry or deferral.
	Delay time.Duration
	// Attempt counts from 1.
	Attempt int
	// Err is the error behind a non-ack outcome.
	Err error
}

// Reporter collects the Report of one attempt. The outermost step (telemetry) puts one in
// the message context; inner steps fill it. The last Set wins.
type Reporter struct {
	mu sync.Mutex
	r  Report
	ok bool
}

// Set records the attempt's report.
func (r *Reporter) Set(rep Report) {
	r.mu.Lock()
	r.r, r.ok = rep, true
	r.mu.Unlock()
}

// Get returns the report and whether any step set one.
func (r *Reporter) Get() (Report, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.r, r.ok
}

type reporterKey struct{}

// WithReporter returns ctx carrying r, a Reporter the caller made (tests read it back).
func WithReporter(ctx context.Context, r *Reporter) context.Context {
	return context.WithValue(ctx, reporterKey{}, r)
}

// NewContext returns ctx carrying a new Reporter, and that Reporter: one allocation for
// both, where context.WithValue and a Reporter would be two, on every attempt.
func NewContext(ctx context.Context) (context.Context, *Reporter) {
	c := &reporterContext{Context: ctx}
	return c, &c.r
}

// reporterContext is ctx with a Reporter under reporterKey, the Reporter inside it.
type reporterContext struct {
	context.Context
	r Reporter
}

func (c *reporterContext) Value(key any) any {
	if _, ok := key.(reporterKey); ok {
		return &c.r
	}
	return c.Context.Value(key)
}

// ReportOutcome records rep in the Reporter carried by ctx, if there is one.
func ReportOutcome(ctx context.Context, rep Report) {
	if r, ok := ctx.Value(reporterKey{}).(*Reporter); ok {
		r.Set(rep)
	}
}
