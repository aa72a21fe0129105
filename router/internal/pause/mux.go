package pause

import (
	"sync"

	"github.com/sluice-go/sluice/broker"
)

// Mux lets several causes pause one subscriber (an open breaker, too many abandoned
// attempts still running): the subscriber consumes only while none holds it paused, with
// the smallest probing limit any of them asks for. Each cause gets a View, which it pauses
// and resumes as if it owned the subscriber.
type Mux struct {
	sub broker.Subscriber

	mu     sync.Mutex
	states map[string]muxState
}

type muxState struct {
	paused bool
	limit  int
}

// NewMux returns a Mux over sub.
func NewMux(sub broker.Subscriber) *Mux { return &Mux{sub: sub, states: map[string]muxState{}} }

// Subscriber is the subscriber the Mux switches, for the router to consume from.
func (m *Mux) Subscriber() broker.Subscriber { return m.sub }

// View returns the subscriber as cause sees it.
func (m *Mux) View(cause string) broker.Subscriber {
	return view{Subscriber: m.sub, m: m, cause: cause}
}

func (m *Mux) set(cause string, st muxState) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.states[cause] = st
	paused, limit := false, 0
	for _, s := range m.states {
		if s.paused {
			paused = true
		}
		if s.limit > 0 && (limit == 0 || s.limit < limit) {
			limit = s.limit
		}
	}
	if paused {
		m.sub.Pause()
		return
	}
	m.sub.Resume(limit)
}

func (m *Mux) paused(cause string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.states[cause].paused
}

// view is one cause's side of a Mux.
type view struct {
	broker.Subscriber
	m     *Mux
	cause string
}

func (v view) Pause()           { v.m.set(v.cause, muxState{paused: true}) }
func (v view) Resume(limit int) { v.m.set(v.cause, muxState{limit: max(limit, 0)}) }
func (v view) Paused() bool     { return v.m.paused(v.cause) }
