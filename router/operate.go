package router

import (
	"fmt"
	"slices"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/describe"
	"github.com/sluice-go/sluice/internal/otelstep"
	"github.com/sluice-go/sluice/internal/stackview"
	"github.com/sluice-go/sluice/telemetry"
)

// What operations wiring (telemetry/otelsetup.Operate) reads of a stack: whether it
// consumes, which handlers are paused, and the queues whose depth an operator watches,
// here; its instrumentation, pauses, broker, debug endpoints and journal figures through
// internal/stackview, registered below.

func init() { stackview.Register(view) }

// view is a *Stack's stackview.View.
func view(x any) (stackview.View, bool) {
	var s *Stack
	switch x := x.(type) { // a switch: the router asserts no broker type (deps_test.go)
	case *Stack:
		s = x
	}
	if s == nil {
		return stackview.View{}, false
	}
	return stackview.View{
		Broker:    s.broker,
		Telemetry: s.tel,
		Pauses:    &s.pauses,
		Policy:    describe.PolicyHandler(s.Describe),
		Retries:   describe.RetriesHandler(s.retry),
		Journal:   s.journalState,
		Queues: func() (consumed, deadLettered []string) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.plan.Consumed(), s.plan.DeadLettered()
		},
	}, true
}

// newTelemetry builds the stack's instrumentation from Config.Telemetry; nil without one.
func newTelemetry(cfg *telemetry.Config) (*otelstep.Instrumentation, error) {
	if cfg == nil {
		return nil, nil
	}
	in, err := otelstep.New(otelstep.Config(*cfg))
	if err != nil {
		return nil, fmt.Errorf("router: telemetry: %w", err)
	}
	return in, nil
}

// Consuming reports whether the stack consumes: Run has started its handlers and the
// stack has not stopped.
func (s *Stack) Consuming() bool {
	return s.router.IsRunning() && !s.router.IsClosed()
}

// PausedHandlers returns, sorted, the handlers whose breaker has paused consuming. A
// handler paused by MaxAbandoned abandoned attempts still running shows in readiness
// (otelsetup.Operate), named as stuck.
func (s *Stack) PausedHandlers() []string {
	var out []string
	for name, paused := range s.parts.Paused() {
		if paused {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// ConsumedQueues returns the queues the stack's handlers consume, each once: plain and
// subscribed queues, and each partition of a partitioned one. Their dead-letter queues
// and archives are derived from these names (topology.DLQ, topology.Archive).
func (s *Stack) ConsumedQueues() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.plan.Consumed()
}

// journalState returns the idempotency journal's figures, as the
// sluice.idempotency.journal.* metrics report them, and false when the stack has no
// idempotency step. Streams declared again are counted when the broker reports them
// (RabbitMQ's does).
func (s *Stack) journalState() (otelstep.JournalState, bool) {
	if s.guard == nil {
		return otelstep.JournalState{}, false
	}
	j := s.guard.Stats().Journal
	st := otelstep.JournalState{
		Restoring: j.Restoring, Restored: j.Restored, RestoreDuration: j.RestoreDuration,
		Appended: j.Appended, Failures: j.Failures, Skipped: j.Skipped, Lag: j.Lag, Unconfirmed: j.Unconfirmed,
	}
	if r, ok := s.broker.(broker.JournalRecreator); ok {
		st.Recreated = r.JournalsRecreated()
	}
	return st, true
}
