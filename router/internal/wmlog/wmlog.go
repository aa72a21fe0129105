// Package wmlog adapts the stack's slog.Logger to Watermill's router, checking the level
// before the adapter builds a record's fields.
package wmlog

import (
	"context"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill"
)

// levelCheckedLogger is Watermill's slog adapter with a level check first: the adapter
// builds its fields before slog drops a disabled record, and the router logs at Trace and
// Debug level for every message (about six allocations each, on the hot path).
type levelCheckedLogger struct {
	watermill.LoggerAdapter
	logger *slog.Logger
}

// New returns Watermill's slog adapter over l with a level check first.
func New(l *slog.Logger) watermill.LoggerAdapter {
	return levelCheckedLogger{LoggerAdapter: watermill.NewSlogLogger(l), logger: l}
}

func (l levelCheckedLogger) Debug(msg string, fields watermill.LogFields) {
	if l.logger.Enabled(context.Background(), slog.LevelDebug) {
		l.LoggerAdapter.Debug(msg, fields)
	}
}

func (l levelCheckedLogger) Trace(msg string, fields watermill.LogFields) {
	if l.logger.Enabled(context.Background(), watermill.LevelTrace) {
		l.LoggerAdapter.Trace(msg, fields)
	}
}

func (l levelCheckedLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return levelCheckedLogger{LoggerAdapter: l.LoggerAdapter.With(fields), logger: l.logger}
}
