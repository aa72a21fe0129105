package router

import (
	"context"
	"fmt"
	"log/slog"
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
// MaxAbandoned and tells the stack's pauses (readiness); s.mu is held.
func (s *Stack) trackAbandoned(handler string, sub broker.Subscriber) {
	var mu sync.Mutex
	paused := false
	s.attempts.Tracker(handler, s.cfg.MaxAbandoned, func(b attempt.Bound) {
		mu.Lock()
		defer mu.Unlock()
		who := "handler " + handler
		if b.Stuck {
			paused = true
			sub.Pause()
			s.pauses.Pause(who, fmt.Sprintf("stuck since %s: %d abandoned attempts still running (MaxAbandoned %d)",
				b.Since.UTC().Format(time.RFC3339), b.Running, b.Max))
			s.logger.Error("handler paused: too many abandoned attempts still running; restart the instance if they never return",
				"handler", handler, "running", b.Running, "max_abandoned", b.Max, "since", b.Since)
			return
		}
		paused = false
		sub.Resume(0)
		s.pauses.Resume(who)
		s.logger.Info("handler resumed: abandoned attempts returned", "handler", handler, "running", b.Running, "stuck_for", time.Since(b.Since))
	})
	s.parts = append(s.parts, part{handler: handler, paused: func() bool {
		mu.Lock()
		defer mu.Unlock()
		return paused
	}})
}

// abandonObserver logs each abandoned attempt and each late return, at most
// abandonLogLines a second (a stuck dependency abandons many at once).
func (s *Stack) abandonObserver() attempt.Observer {
	return &abandonLog{logger: s.logger}
}

const abandonLogLines = 10

type abandonLog struct {
	logger *slog.Logger

	mu      sync.Mutex
	window  time.Time
	used    int
	dropped int
}

func (l *abandonLog) allow() (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	var summary int
	if now.Sub(l.window) >= time.Second {
		l.window, l.used = now, 0
		summary, l.dropped = l.dropped, 0
	}
	if l.used >= abandonLogLines {
		l.dropped++
		return false, summary
	}
	l.used++
	return true, summary
}

func (l *abandonLog) write(ctx context.Context, level slog.Level, msg string, attrs ...slog.Attr) {
	ok, summary := l.allow()
	if summary > 0 {
		l.logger.LogAttrs(ctx, slog.LevelWarn, "abandoned-attempt log lines dropped by the rate limit", slog.Int("dropped", summary))
	}
	if ok {
		l.logger.LogAttrs(ctx, level, msg, attrs...)
	}
}

func (l *abandonLog) Abandoned(ctx context.Context, a *attempt.Abandoned, running int) {
	msg := "attempt abandoned past the handler timeout; it may still be running"
	if a.Shutdown {
		msg = "attempt abandoned at close; its message goes back to the queue"
	}
	l.write(ctx, slog.LevelWarn, msg, slog.String("handler", a.Handler), slog.Duration("ran", a.Ran),
		slog.Duration("handler_timeout", a.Timeout), slog.Int("abandoned_running", running), slog.String("stack", firstFrame(a.Stack)))
}

func (l *abandonLog) Returned(ctx context.Context, handler string, ran time.Duration, err error, running int) {
	l.write(ctx, slog.LevelInfo, "abandoned attempt returned", slog.String("handler", handler), slog.Duration("ran", ran),
		slog.String("error", sluice.ErrorMessage(err)), slog.Int("abandoned_running", running))
}

// firstFrame is the innermost frame of a stack, for a log line (the record keeps it all).
func firstFrame(stack string) string {
	if i := strings.Index(stack, "\n"); i >= 0 {
		return stack[:i]
	}
	return stack
}
