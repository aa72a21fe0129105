package otelstep

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/headers"
)

// A native delayed retry (RabbitMQ 4.3, router.WithNativeRetry) rejects the message back
// to its queue, which redelivers it unchanged: no header can carry the hand-off's span
// context to the next attempt, as the cascade's copy does. The instance that rejected a
// message remembers the span of the rejection until the message comes back, so the next
// attempt it consumes is that span's child; an attempt another instance consumes, or one
// that comes back after heldBackMax other rejections, starts from the message's own
// traceparent, as a redelivery always did.
const (
	// heldBackMax bounds the rejections remembered: about 200 B each.
	heldBackMax = 10_000
	// heldBackGrace is how long after its delay a rejection is remembered: a redelivery
	// later than that is taken as not this rejection's.
	heldBackGrace = time.Minute
)

// clientKind is the settle span's kind, built once.
var clientKind = trace.WithSpanKind(trace.SpanKindClient)

// heldBackKey names the attempt a rejection hands the message to.
type heldBackKey struct {
	queue, id string
	attempt   int
}

type heldBackEntry struct {
	sc       trace.SpanContext
	deadline time.Time
}

// heldBackSpans is the table of rejections waiting for their message; its zero value is
// empty and ready. Nothing runs in the background: expired entries go when a new one is
// added.
type heldBackSpans struct {
	n     atomic.Int64 // len(m), read without the lock on every redelivery
	mu    sync.Mutex
	m     map[heldBackKey]heldBackEntry
	order []heldBackKey // insertion order; a key whose entry was taken is skipped
}

// put remembers sc as the span that handed the message to attempt k.
func (h *heldBackSpans) put(k heldBackKey, sc trace.SpanContext, delay time.Duration, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = make(map[heldBackKey]heldBackEntry)
	}
	// The oldest entries go first: taken, expired, or past the bound. order holds every
	// key of m and the taken keys not yet reached, so it is bounded too.
	for len(h.order) > 0 {
		front := h.order[0]
		e, live := h.m[front]
		if live && now.Before(e.deadline) && len(h.m) < heldBackMax && len(h.order) < 2*heldBackMax {
			break
		}
		if live {
			delete(h.m, front)
		}
		h.order[0] = heldBackKey{}
		h.order = h.order[1:]
	}
	if _, ok := h.m[k]; !ok {
		h.order = append(h.order, k)
	}
	h.m[k] = heldBackEntry{sc: sc, deadline: now.Add(delay + heldBackGrace)}
	h.n.Store(int64(len(h.m)))
}

// take returns and forgets the span that handed the message to attempt k.
func (h *heldBackSpans) take(k heldBackKey, now time.Time) (trace.SpanContext, bool) {
	if h.n.Load() == 0 {
		return trace.SpanContext{}, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.m[k]
	if !ok {
		return trace.SpanContext{}, false
	}
	delete(h.m, k)
	h.n.Store(int64(len(h.m)))
	return e.sc, now.Before(e.deadline)
}

// heldBackParent is the parent of msg's attempt on queue when this instance rejected the
// message into its queue's native delayed retry and remembered the rejection's span, else
// parent unchanged. Only a redelivery is looked up: a first delivery is not a retry.
func (in *Instrumentation) heldBackParent(parent context.Context, queue string, msg *message.Message) context.Context {
	if in.held.n.Load() == 0 || msg.UUID == "" || msg.Metadata.Get(headers.Redelivered) != "true" {
		return parent
	}
	retries, _ := headers.NativeRetries(msg.Metadata)
	sc, ok := in.held.take(heldBackKey{queue: queue, id: msg.UUID, attempt: retries + 1}, time.Now())
	if !ok {
		return parent
	}
	return trace.ContextWithRemoteSpanContext(parent, sc)
}

// heldBack draws the rejection of o's message into its queue's native delayed retry: a
// settle span "reject <queue>", a child of the attempt's consumer span in ctx, carrying
// the delay the queue holds the message back for. It is remembered, so that the next
// attempt this instance consumes is its child (see heldBackParent).
func (in *Instrumentation) heldBack(ctx context.Context, msg *message.Message, o disposition.Outcome) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return // no tracer provider and no trace context: nothing to hang the span on
	}
	delay := o.Disposition.Delay
	attrs := appendHandOffAttrs(in.appendMessageAttrs(make([]attribute.KeyValue, 0, 10), semconv.MessagingOperationTypeSettle, "reject", o.Queue, msg),
		o.Queue, delay, o.Attempt+1)
	_, span := in.cur().tracer.Start(ctx, spanName("reject", o.Queue), clientKind, trace.WithAttributes(attrs...))
	span.End()
	// An unsampled span is remembered too, so the next attempt follows its decision; a
	// no-op tracer's span is the parent's context, nothing a header would not give.
	if sc := span.SpanContext(); sc.IsValid() && sc.SpanID() != trace.SpanContextFromContext(ctx).SpanID() && o.MessageID != "" {
		in.held.put(heldBackKey{queue: o.Queue, id: o.MessageID, attempt: o.Attempt + 1}, sc, delay, time.Now())
	}
}
