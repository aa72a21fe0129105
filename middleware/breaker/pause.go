package breaker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/sluice-go/sluice/internal/breakerhook"
	"github.com/sluice-go/sluice/internal/markers"
	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/trace"
)

// rejecter handles a call the breaker did not let through; verdict is gobreaker's
// ErrOpenState or ErrTooManyRequests.
type rejecter func(ctx context.Context, msg *message.Message, verdict error) ([]*message.Message, error)

// Only the router pauses a handler while its breaker is open, so what pausing needs of a
// Breaker is reached through breakerhook rather than learned by every user.
func init() {
	breakerhook.Of = func(b any) breakerhook.Breaker { return hooked{b.(*Breaker)} }
}

// hooked is a Breaker as breakerhook.Breaker.
type hooked struct{ b *Breaker }

func (h hooked) Watch(f func(from, to int)) (stop func()) {
	return h.b.watch(func(from, to State) { f(int(from), int(to)) })
}

func (h hooked) OpenRemaining() time.Duration { return h.b.openLeft() }
func (h hooked) OpenTimeout() time.Duration   { return h.b.cfg.OpenTimeout }
func (h hooked) Probes() int                  { return h.b.cfg.HalfOpenProbes }

func (h hooked) ReturningMiddleware(onReturn func(state int)) message.HandlerMiddleware {
	var f func(State)
	if onReturn != nil {
		f = func(s State) { onReturn(int(s)) }
	}
	return h.b.returningMiddleware(f)
}

// watchers are the functions watch registered, called on every announced state change.
type watchers struct {
	mu   sync.Mutex
	next int
	fns  map[int]func(from, to State)
}

func (w *watchers) add(f func(from, to State)) func() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fns == nil {
		w.fns = make(map[int]func(from, to State))
	}
	id := w.next
	w.next++
	w.fns[id] = f
	return func() {
		w.mu.Lock()
		delete(w.fns, id)
		w.mu.Unlock()
	}
}

func (w *watchers) notify(_ string, from, to State) {
	w.mu.Lock()
	fns := make([]func(from, to State), 0, len(w.fns))
	for _, f := range w.fns {
		fns = append(fns, f)
	}
	w.mu.Unlock()
	for _, f := range fns {
		f(from, to)
	}
}

// watch is breakerhook.Breaker's Watch.
func (b *Breaker) watch(f func(from, to State)) (stop func()) { return b.watchers.add(f) }

// openLeft is breakerhook.Breaker's OpenRemaining.
func (b *Breaker) openLeft() time.Duration {
	if b.cb.State() != gobreaker.StateOpen {
		return 0
	}
	return b.openRemaining(time.Now())
}

// returningMiddleware is breakerhook.Breaker's ReturningMiddleware.
func (b *Breaker) returningMiddleware(onReturn func(State)) message.HandlerMiddleware {
	reject := func(ctx context.Context, msg *message.Message, verdict error) ([]*message.Message, error) {
		state := StateOpen
		if verdict == gobreaker.ErrTooManyRequests {
			state = StateHalfOpen
		}
		if onReturn != nil {
			onReturn(state)
		}
		reason := fmt.Errorf("circuit breaker %q is %s; message %s returned to its queue: %w", b.name, state, msg.UUID, ErrOpen)
		trace.SpanFromContext(ctx).AddEvent("breaker.returned", trace.WithAttributes(
			attrName.String(b.name),
			attrState.String(state.String()),
		))
		b.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "circuit breaker rejected call; message returned to its queue",
			slog.String("breaker", b.name),
			slog.String("state", state.String()),
			slog.String("message_uuid", msg.UUID),
		)
		return nil, markers.ReturnUnprocessed(reason)
	}
	b.pausing.Store(true)
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			return b.handle(h, msg, reject)
		}
	}
}
