package attempt

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/sluice-go/sluice"
)

// NewLog returns an Observer that logs each abandoned attempt (warn) and each late return
// (info) to logger, at most logLines a second: a stuck dependency abandons many at once.
func NewLog(logger *slog.Logger) Observer { return &abandonLog{logger: logger} }

const logLines = 10

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
	if l.used >= logLines {
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

func (l *abandonLog) Abandoned(ctx context.Context, a *Abandoned, running int) {
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
