// Package parts holds what a handler's options or a stack's configuration add to the
// stack — a breaker's pause controller, a rebalancer, a metric registration, a listener —
// until the stack closes. The stack composes them through a Part's functions and knows no
// feature's type.
package parts

import (
	"slices"
	"sync"
)

// Part is one thing the stack holds; each field may be nil.
type Part struct {
	// Handler is the handler the part belongs to; empty for the stack's own.
	Handler string
	// Close releases what the part holds (timers, registrations, listeners).
	Close func()
	// Paused reports whether the handler's breaker has paused it.
	Paused func() bool
	// Held lists the partitions the handler consumes here.
	Held func() []int
}

// List is the parts of a stack; its zero value is empty and ready.
type List struct {
	mu    sync.Mutex
	parts []Part
}

// Add adds p.
func (l *List) Add(p Part) {
	l.mu.Lock()
	l.parts = append(l.parts, p)
	l.mu.Unlock()
}

func (l *List) all() []Part {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.parts)
}

// Close releases every part, the last added first, once.
func (l *List) Close() {
	l.mu.Lock()
	parts := l.parts
	l.parts = nil
	l.mu.Unlock()
	for _, p := range slices.Backward(parts) {
		if p.Close != nil {
			p.Close()
		}
	}
}

// Paused says, for each handler that pauses while its breaker is open, whether it is
// paused now.
func (l *List) Paused() map[string]bool {
	out := map[string]bool{}
	for _, p := range l.all() {
		if p.Paused != nil {
			out[p.Handler] = p.Paused()
		}
	}
	return out
}

// Held returns the partitions handler consumes here, sorted; nil for a handler that is
// not rebalanced.
func (l *List) Held(handler string) []int {
	for _, p := range l.all() {
		if p.Handler == handler && p.Held != nil {
			return p.Held()
		}
	}
	return nil
}
