package memory

import (
	"context"
	"sync"
)

// gate is a subscription's switch between consuming, paused and probing (a limited number
// of workers). Each change closes the channel of the previous state, waking the workers.
type gate struct {
	mu      sync.Mutex
	paused  bool
	limit   int
	changed chan struct{}
}

type gateState struct {
	paused  bool
	limit   int
	changed <-chan struct{}
}

// admits reports whether worker (counting from 0) may take a message in st.
func (st gateState) admits(worker int) bool {
	return !st.paused && (st.limit == 0 || worker < st.limit)
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
	limit = max(limit, 0)
	if g.paused == paused && g.limit == limit {
		return
	}
	g.paused, g.limit = paused, limit
	close(g.changed)
	g.changed = make(chan struct{})
}

// Pause stops the subscription's workers from taking messages: a message waiting for a
// handler goes back to the head of its queue, messages with a handler finish as usual.
func (s *subscriber) Pause() { s.gate.set(true, 0) }

// Resume lets the workers take messages again; a positive limit lets only that many of
// them work until Resume is called with another limit, zero lets all of them.
func (s *subscriber) Resume(limit int) { s.gate.set(false, limit) }

// Paused reports whether Pause was called after the last Resume.
func (s *subscriber) Paused() bool { return s.gate.state().paused }

// QueueDepth returns the number of messages ready in queue (Len without the scheduled
// ones), the backlog the retry step's adaptive policy reads.
func (b *Broker) QueueDepth(_ context.Context, queue string) (int, error) {
	q := b.queue(queue)
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.ready), nil
}
