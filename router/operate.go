package router

import (
	"slices"
)

// What operations wiring (telemetry/otelsetup.Operate) reads of a stack: whether it
// consumes, which handlers a breaker paused, and the queues whose depth an operator
// watches.

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
