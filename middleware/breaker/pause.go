package breaker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/sluice-go/sluice/internal/markers"
	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/trace"
)

// rejecter handles a call the breaker did not let through; verdict is gobreaker's
// ErrOpenState or ErrTooManyRequests.
type rejecter func(ctx context.Context, msg *message.Message, verdict error) ([]*message.Message, error)

// watchers are the functions Watch registered, called on every announced state change.
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

// Watch registers f to be called on each state change of the breaker, in order, after the
// change was logged and passed to Config.OnStateChange, under the same rules as that hook
// (outside the breaker's lock, on the goroutine that observed the change, so quick). The
// returned function unregisters f.
func (b *Breaker) Watch(f func(from, to State)) (stop func()) { return b.watchers.add(f) }

// OpenRemaining is how long the breaker stays open before it lets its probes through:
// zero when it is not open (or its OpenTimeout has passed and nobody looked at it yet).
func (b *Breaker) OpenRemaining() time.Duration {
	if b.cb.State() != gobreaker.StateOpen {
		return 0
	}
	return b.openRemaining(time.Now())
}

// OpenTimeout is how long the breaker stays open before it lets probes through.
func (b *Breaker) OpenTimeout() time.Duration { return b.cfg.OpenTimeout }

// Probes is the number of calls the breaker lets through when half-open.
func (b *Breaker) Probes() int { return b.cfg.HalfOpenProbes }

// ReturningMiddleware guards h like Middleware, except that a call the breaker rejects is
// neither deferred nor handed to Config.Fallback: onReturn is called with the breaker's
// state (so its caller can stop consuming) and the message goes back to its queue
// unacked, as an unprocessed GiveBack disposition (disposition.ReturnUnprocessedError) wrapping ErrOpen, without using an attempt. It is the
// breaker step of a handler that pauses while its breaker is open.
func (b *Breaker) ReturningMiddleware(onReturn func(State)) message.HandlerMiddleware {
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
