package router

import (
	"slices"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/telemetry"
)

// What operations wiring (telemetry/otelsetup.Operate) reads of a stack: whether it
// consumes, which handlers a breaker paused, and the queues whose depth an operator
// watches, and the idempotency journal's figures.

// Consuming reports whether the stack consumes: Run has started its handlers and the
// stack has not stopped.
func (s *Stack) Consuming() bool {
	return s.router.IsRunning() && !s.router.IsClosed()
}

// PausedHandlers returns, sorted, the handlers whose breaker has paused consuming.
func (s *Stack) PausedHandlers() []string {
	var out []string
	for name, paused := range s.pausedHandlers() {
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

// Broker returns the broker the stack consumes from and hands off to.
func (s *Stack) Broker() Broker { return s.broker }

// journalStats is an idempotency step that reports its journal (package idempotency's Guard).
type journalStats interface {
	Stats() idempotency.Stats
}

// JournalState returns the idempotency journal's figures, as telemetry.RegisterJournal
// reports them, and false when the stack's idempotency step keeps none (no
// Config.Idempotency, or one that is not package idempotency's Guard). Streams declared
// again are counted when the broker reports them (RabbitMQ's does).
func (s *Stack) JournalState() (telemetry.JournalState, bool) {
	g, ok := s.cfg.Idempotency.(journalStats)
	if !ok {
		return telemetry.JournalState{}, false
	}
	j := g.Stats().Journal
	st := telemetry.JournalState{
		Restoring: j.Restoring, Restored: j.Restored, RestoreDuration: j.RestoreDuration,
		Appended: j.Appended, Failures: j.Failures, Skipped: j.Skipped, Lag: j.Lag, Unconfirmed: j.Unconfirmed,
	}
	if r, ok := s.broker.(broker.JournalRecreator); ok {
		st.Recreated = r.JournalsRecreated()
	}
	return st, true
}
