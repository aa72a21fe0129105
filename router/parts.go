package router

import "slices"

// part is what a handler's options or the stack's configuration add to the stack — a
// breaker's pause controller, a rebalancer, a metric registration, a listener — held until
// Close. The stack composes them through these functions and knows no feature's type;
// each field may be nil.
type part struct {
	// handler is the handler the part belongs to; empty for the stack's own.
	handler string
	// close releases what the part holds (timers, registrations, listeners).
	close func()
	// paused reports whether the handler's breaker has paused it (PausedHandlers).
	paused func() bool
	// held lists the partitions the handler consumes here (HeldPartitions).
	held func() []int
}

// addPart adds p, under s.mu.
func (s *Stack) addPart(p part) {
	s.mu.Lock()
	s.parts = append(s.parts, p)
	s.mu.Unlock()
}

// closeParts releases every part, the last added first, once.
func (s *Stack) closeParts() {
	s.mu.Lock()
	parts := s.parts
	s.parts = nil
	s.mu.Unlock()
	for _, p := range slices.Backward(parts) {
		if p.close != nil {
			p.close()
		}
	}
}

// pausedHandlers says, for each handler that pauses while its breaker is open, whether it
// is paused now.
func (s *Stack) pausedHandlers() map[string]bool {
	s.mu.Lock()
	parts := slices.Clone(s.parts)
	s.mu.Unlock()
	out := map[string]bool{}
	for _, p := range parts {
		if p.paused != nil {
			out[p.handler] = p.paused()
		}
	}
	return out
}

// HeldPartitions returns the partitions of the rebalanced handler name (WithRebalancing)
// that this instance consumes now, sorted; nil for another handler.
func (s *Stack) HeldPartitions(name string) []int {
	s.mu.Lock()
	parts := slices.Clone(s.parts)
	s.mu.Unlock()
	for _, p := range parts {
		if p.handler == name && p.held != nil {
			return p.held()
		}
	}
	return nil
}
