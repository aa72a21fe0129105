package telemetry

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/attempt"
	"github.com/sluice-go/sluice/internal/otelnames"
)

// The outcome labels of the metrics, spans and logs (disposition.Kind's names).
var (
	outcomeAck        = disposition.Ack.String()
	outcomeRetry      = disposition.Retry.String()
	outcomeDeadLetter = disposition.DeadLetter.String()
	outcomeDiscard    = disposition.Discard.String()
	outcomeDuplicate  = disposition.Duplicate.String()
	outcomeDeferred   = disposition.Defer.String()
	outcomeNack       = disposition.GiveBack.String()
)

// attemptReport is what the Instrumentation learned about one attempt.
type attemptReport struct {
	Outcome string
	Delay   time.Duration
	Attempt int
	Err     error
}

// Observe is the Instrumentation as a disposition.Observer: router gives it to the retry
// step (which calls it once per attempt, after the attempt's hand-off) and to the
// idempotency step (for a duplicate). The observation is recorded with the attempt's span
// and metrics when Middleware, outside, finishes the attempt; an observation for a context
// Middleware did not start is ignored, but for the retry outcome metrics, recorded at once.
func (in *Instrumentation) Observe(ctx context.Context, o disposition.Outcome) {
	in.observeRetry(ctx, o)
	if o.ErrorType == attempt.ErrorType {
		in.abandoned.Add(ctx, 1, metric.WithAttributes(otelnames.MetricAttrQueue.String(o.Queue), otelnames.MetricAttrHandler.String(o.Handler)))
	}
	a, ok := ctx.Value(attemptKey{}).(*attemptState)
	if !ok {
		return
	}
	if o.Disposition.HeldBack {
		in.heldBack(ctx, a.msg, o)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	// The core's Ack follows the idempotency step's Duplicate of the same attempt: the
	// duplicate is the more exact account.
	if a.ok && o.Disposition.Kind == disposition.Ack {
		return
	}
	a.r = attemptReport{Outcome: o.Disposition.Kind.String(), Delay: o.Disposition.Delay, Attempt: o.Attempt, Err: o.Disposition.Reason}
	a.ok = true
}

// attemptState is the observation of the attempt Middleware runs, private to the
// Instrumentation: ctx's value under attemptKey, found by Observe.
type attemptState struct {
	mu  sync.Mutex
	r   attemptReport
	ok  bool
	msg *message.Message // the attempt's message, for the attributes of a rejection's span
}

func (a *attemptState) get() (attemptReport, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.r, a.ok
}

type attemptKey struct{}

// attemptContext is ctx with the attempt's state inside it: one allocation for both.
type attemptContext struct {
	context.Context
	a attemptState
}

func (c *attemptContext) Value(key any) any {
	if _, ok := key.(attemptKey); ok {
		return &c.a
	}
	return c.Context.Value(key)
}

func newAttemptContext(ctx context.Context, msg *message.Message) (context.Context, *attemptState) {
	c := &attemptContext{Context: ctx, a: attemptState{msg: msg}}
	return c, &c.a
}
