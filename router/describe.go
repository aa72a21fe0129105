package router

import (
	"fmt"
	"maps"
	"slices"

	"github.com/sluice-go/sluice/internal/describe"
	"github.com/sluice-go/sluice/policy"
)

// Describe returns what the stack does with each handler's failures, from the settings in
// force (package policy). It can be called at any time, before Run, while running or after
// Close.
//
// What the stack does not record of a handler's options is left out or inferred: the
// breaker's trip thresholds are left out (breaker.Registry keeps its Config to itself,
// said in Notes); the dependency a WithBreaker option names is inferred from the
// registry's breakers (see policy.BreakerDescription.Dependency); whether a handler gave
// WithIdempotencyKey is known for journaled steps only.
func (s *Stack) Describe() policy.Description {
	s.mu.Lock()
	in := describe.Inputs{
		Names: slices.Collect(maps.Keys(s.names)), Topics: maps.Clone(s.topics), Native: maps.Clone(s.native),
		Pausing: map[string]bool{}, Retry: s.retry.Config(), Judge: describe.Judge(s.retry), Stats: s.retry.Stats(), Breakers: s.breakers,
		HandlerTimeout: s.cfg.HandlerTimeout, AbandonGrace: s.cfg.AbandonGrace, MaxAbandoned: s.cfg.MaxAbandoned, Settle: maps.Clone(s.settle),
		Compensations: maps.Clone(s.compensations),
	}
	for handler := range s.parts.Paused() {
		in.Pausing[handler] = true
	}
	for _, sl := range s.slots {
		in.Journals = append(in.Journals, describe.Journal{Queue: sl.Queue(), WithKey: sl.WithKey()})
	}
	s.mu.Unlock()
	if o := in.Retry.Overload; o != nil {
		in.BudgetLeft = o.BudgetLeft
	}
	if s.guard != nil {
		in.Idempotency = fmt.Sprintf("%T", s.guard)
	}
	return describe.Build(in)
}

// consumes records that Watermill handler name consumes queue (Describe reads it); s.mu is
// held.
func (s *Stack) consumes(name, queue string) {
	if s.topics == nil {
		s.topics = map[string]string{}
	}
	s.topics[name] = queue
}
