package amqp

import (
	"errors"
	"sync"
)

// gate is a subscription's switch between consuming, paused and probing (consuming with
// a small limit). Each change closes the channel of the previous state, which is how the
// running consumer learns that it must stop and start again with the new settings.
type gate struct {
	mu      sync.Mutex
	paused  bool
	limit   int
	changed chan struct{}
}

// gateState is one snapshot of a gate.
type gateState struct {
	paused bool
	// limit caps the deliveries outstanding (prefetch and handlers) while probing; zero
	// means the subscription's own settings.
	limit int
	// changed is closed when the gate leaves this state.
	changed <-chan struct{}
}

func (g *gate) state() gateState {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.changed == nil {
		g.changed = make(chan struct{})
	}
	return gateState{paused: g.paused, limit: g.limit, changed: g.changed}
}

func (g *gate) set(paused bool, limit int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.changed == nil {
		g.changed = make(chan struct{})
	}
	if g.paused == paused && g.limit == limit {
		return
	}
	g.paused, g.limit = paused, max(limit, 0)
	close(g.changed)
	g.changed = make(chan struct{})
}

// Pause stops taking deliveries: the consumer is cancelled, deliveries prefetched but not
// yet handed to a handler go back to the queue with basic.nack and requeue (the return a
// shutdown makes, which a quorum queue's delivery limit does not count as a failure), and
// messages with a handler finish and are settled as usual. On a classic queue a returned
// message takes back its place, so the queue keeps its order. Pause does not wait.
func (s *Subscriber) Pause() { s.gate.set(true, 0) }

// Resume takes deliveries again. A positive limit caps the deliveries outstanding at once
// (prefetch and handlers both) until Resume is called with another limit; zero restores
// the subscription's own Concurrency and Prefetch. Resume does not wait.
func (s *Subscriber) Resume(limit int) { s.gate.set(false, limit) }

// Paused reports whether Pause was called after the last Resume.
func (s *Subscriber) Paused() bool { return s.gate.state().paused }

// optsFor returns the settings a consumer uses in st.
func (o SubscribeOptions) optsFor(st gateState) SubscribeOptions {
	if st.limit > 0 {
		o.Concurrency = min(o.Concurrency, st.limit)
		o.Prefetch = st.limit
	}
	return o
}

func closedChan(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// errGateChanged ends a consumer that stopped for Pause or Resume.
var errGateChanged = errors.New("consumer restarted for pause or resume")
