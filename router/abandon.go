package router

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/attempt"
)

// armCut starts the wait of Close (or of Run's ended context): once CloseTimeout has run
// out, every attempt still running is abandoned and its message given back.
func (s *Stack) armCut() {
	s.cutOnce.Do(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.cutTimer = time.AfterFunc(s.cfg.CloseTimeout, func() { close(s.cut) })
	})
}

// stopCut stops the wait's timer once nothing is left to wait for.
func (s *Stack) stopCut() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cutTimer != nil {
		s.cutTimer.Stop()
	}
}

// stillRunning names the handlers whose abandoned attempts still run, or returns nil.
func (s *Stack) stillRunning() error {
	var names []string
	for _, t := range s.attempts.Trackers() {
		if b := t.Snapshot(); b.Running > 0 {
			names = append(names, fmt.Sprintf("%s (%d abandoned attempt(s))", b.Handler, b.Running))
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	return fmt.Errorf("router: handlers still running after CloseTimeout %s: %s: %w", s.cfg.CloseTimeout, strings.Join(names, ", "), sluice.ErrHandlerTimeout)
}

// trackAbandoned gives handler a tracker of its abandoned attempts that pauses sub at
// MaxAbandoned and tells the stack's pauses (readiness; PausedHandlers stays the
// breaker's); s.mu is held.
func (s *Stack) trackAbandoned(handler string, sub broker.Subscriber) {
	var mu sync.Mutex
	s.attempts.Tracker(handler, s.cfg.MaxAbandoned, func(b attempt.Bound) {
		mu.Lock()
		defer mu.Unlock()
		who := "handler " + handler
		if b.Stuck {
			sub.Pause()
			s.pauses.Pause(who, fmt.Sprintf("stuck since %s: %d abandoned attempts still running (MaxAbandoned %d)",
				b.Since.UTC().Format(time.RFC3339), b.Running, b.Max))
			s.logger.Error("handler paused: too many abandoned attempts still running; restart the instance if they never return",
				"handler", handler, "running", b.Running, "max_abandoned", b.Max, "since", b.Since)
			return
		}
		sub.Resume(0)
		s.pauses.Resume(who)
		s.logger.Info("handler resumed: abandoned attempts returned", "handler", handler, "running", b.Running, "stuck_for", time.Since(b.Since))
	})
}
