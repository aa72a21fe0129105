// Package pausegate is a subscription's switch between consuming, paused and probing
// (consuming with a small limit), shared by both brokers' subscribers. Each change closes the
// channel of the previous state, which is how a running consumer or worker learns that it
// must stop and start again with the new settings.
package pausegate

import "sync"

// Gate is the switch. Its zero value is consuming with no limit.
type Gate struct {
	mu      sync.Mutex
	paused  bool
	limit   int
	changed chan struct{}
}

// State is one snapshot of a Gate.
type State struct {
	// Paused is true between Set(true, …) and the next Set(false, …).
	Paused bool
	// Limit caps the deliveries outstanding (prefetch and handlers) while probing; zero
	// means the subscription's own settings.
	Limit int
	// Changed is closed when the gate leaves this state.
	Changed <-chan struct{}
}

// Admits reports whether worker (counting from 0) may take a message in st.
func (st State) Admits(worker int) bool {
	return !st.Paused && (st.Limit == 0 || worker < st.Limit)
}

// State returns the gate's current state.
func (g *Gate) State() State {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.changed == nil {
		g.changed = make(chan struct{})
	}
	return State{Paused: g.paused, Limit: g.limit, Changed: g.changed}
}

// Set moves the gate to paused with limit (a negative limit is 0), closing the previous
// state's Changed; setting the state the gate is in does nothing.
func (g *Gate) Set(paused bool, limit int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.changed == nil {
		g.changed = make(chan struct{})
	}
	limit = max(limit, 0)
	if g.paused == paused && g.limit == limit {
		return
	}
	g.paused, g.limit = paused, limit
	close(g.changed)
	g.changed = make(chan struct{})
}
