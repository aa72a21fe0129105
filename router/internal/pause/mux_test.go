package pause_test

import (
	"context"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"

	"github.com/sluice-go/sluice/router/internal/pause"
)

// fakeSub records what the Mux asked of the subscriber it switches.
type fakeSub struct {
	mu     sync.Mutex
	paused bool
	limit  int
}

func (s *fakeSub) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	return nil, nil
}
func (s *fakeSub) Close() error { return nil }
func (s *fakeSub) Pause()       { s.mu.Lock(); s.paused = true; s.mu.Unlock() }
func (s *fakeSub) Resume(limit int) {
	s.mu.Lock()
	s.paused, s.limit = false, limit
	s.mu.Unlock()
}
func (s *fakeSub) Paused() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.paused }

// TestMux: a handler paused by its breaker and by its abandoned attempts consumes again
// only once both let go (before the Mux, whichever cause resumed last won), and resumes
// with the smallest probing limit asked.
func TestMux(t *testing.T) {
	type step struct {
		cause  string
		pause  bool
		limit  int  // for a resume
		paused bool // the subscriber's state after the step
		want   int  // the subscriber's limit after the step, when not paused
	}
	cases := map[string][]step{
		"the breaker closes while attempts are stuck": {
			{cause: "breaker", pause: true, paused: true},
			{cause: "abandoned", pause: true, paused: true},
			{cause: "breaker", paused: true},
			{cause: "abandoned", paused: false},
		},
		"the stuck attempts return while the breaker is open": {
			{cause: "abandoned", pause: true, paused: true},
			{cause: "breaker", pause: true, paused: true},
			{cause: "abandoned", paused: true},
			{cause: "breaker", limit: 2, want: 2},
			{cause: "breaker", want: 0},
		},
		"a half-open breaker's probes while nothing else pauses": {
			{cause: "breaker", pause: true, paused: true},
			{cause: "breaker", limit: 3, want: 3},
			{cause: "abandoned", want: 3},
		},
	}
	for name, steps := range cases {
		t.Run(name, func(t *testing.T) {
			sub := &fakeSub{}
			m := pause.NewMux(sub)
			assert.Same(t, sub, m.Subscriber())
			for i, st := range steps {
				v := m.View(st.cause)
				if st.pause {
					v.Pause()
				} else {
					v.Resume(st.limit)
				}
				assert.Equal(t, st.pause, v.Paused(), "step %d: the view reports its own cause", i)
				assert.Equal(t, st.paused, sub.Paused(), "step %d: the subscriber paused", i)
				if !st.paused {
					assert.Equal(t, st.want, sub.limit, "step %d: the resume limit", i)
				}
			}
		})
	}
}
