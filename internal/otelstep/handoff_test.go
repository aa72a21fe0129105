package otelstep_test

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/otelnames"
	"github.com/sluice-go/sluice/internal/otelstep"
	"github.com/sluice-go/sluice/internal/topology"
)

// republishDelayer stands for the broker's delay infrastructure: it sends the message
// straight back to the queue, marshalling only what a network broker would (payload and
// headers, no context).
type republishDelayer struct {
	pub message.Publisher
	mu  sync.Mutex
	ctx []context.Context
}

func (d *republishDelayer) Delay(ctx context.Context, queue string, _ time.Duration, msg *message.Message) error {
	d.mu.Lock()
	d.ctx = append(d.ctx, ctx)
	d.mu.Unlock()
	return d.pub.Publish(queue, msg.Copy())
}

func TestWrapDelayer_OneTracePerMessage(t *testing.T) {
	e := newEnv(t)
	queue := uniqueQueue("retry")
	var delayer otelstep.Delayer
	ps, results := e.runRouter(t, queue, func(msg *message.Message) ([]*message.Message, error) {
		count := sluice.RetryCount(msg.Metadata)
		if count >= 2 {
			return nil, nil
		}
		// What the retry step does: a copy with the count incremented goes to the broker
		// with a delay, and the attempt is acked once the broker confirmed it.
		retry := msg.Copy()
		retry.Metadata.Set(sluice.HeaderRetryCount, strconv.Itoa(count+1))
		if err := delayer.Delay(msg.Context(), queue, 250*time.Millisecond, retry); err != nil {
			return nil, err
		}
		reportTo(e.in, msg.Context(), testReport{Outcome: disposition.Retry, Delay: 250 * time.Millisecond,
			Attempt: count + 1, Err: errors.New("gateway timeout")})
		return nil, nil
	}, routerOpts{})
	inner := &republishDelayer{pub: ps}
	delayer = e.in.WrapDelayer(inner)

	ctx, caller := e.rootSpan("caller")
	msg := message.NewMessage("pay-1", []byte("{}"))
	msg.SetContext(ctx)
	require.NoError(t, e.in.WrapPublisher(ps).Publish(queue, msg))
	caller.End()
	for range 3 {
		require.NoError(t, next(t, results).err)
	}

	// The delayer republishes at once, so an attempt's span may end after the next one's:
	// order by attempt, not by end.
	byAttempt := func(spans []sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
		slices.SortFunc(spans, func(a, b sdktrace.ReadOnlySpan) int {
			return cmp.Compare(attrs(a)[otelnames.AttrAttempt].AsInt64(), attrs(b)[otelnames.AttrAttempt].AsInt64())
		})
		return spans
	}
	processes := byAttempt(e.endedAll("process " + queue))
	delays := byAttempt(e.endedAll("send sluice.delay"))
	require.Len(t, processes, 3, spanTree(e.spans.Ended()))
	require.Len(t, delays, 2, spanTree(e.spans.Ended()))
	send := e.ended(t, "send "+queue)

	// caller -> send -> process#1 -> delay#1 -> process#2 -> delay#2 -> process#3
	chain := []trace.SpanContext{caller.SpanContext(), send.SpanContext(),
		processes[0].SpanContext(), delays[0].SpanContext(),
		processes[1].SpanContext(), delays[1].SpanContext(), processes[2].SpanContext()}
	parents := []trace.SpanContext{send.Parent(), processes[0].Parent(), delays[0].Parent(),
		processes[1].Parent(), delays[1].Parent(), processes[2].Parent()}
	for i, parent := range parents {
		assert.Equal(t, chain[i].SpanID(), parent.SpanID(), "link %d of the chain\n%s", i, spanTree(e.spans.Ended()))
		assert.Equal(t, caller.SpanContext().TraceID(), chain[i+1].TraceID(), "one trace for every attempt")
	}

	for i, p := range processes {
		a := attrs(p)
		assert.Equal(t, int64(i+1), a[otelnames.AttrAttempt].AsInt64())
		if i < 2 {
			assert.Equal(t, "retry", a[otelnames.AttrOutcome].AsString())
			assert.Equal(t, int64(250), a[otelnames.AttrRetryDelayMS].AsInt64())
			assert.Equal(t, codes.Error, p.Status().Code)
		} else {
			assert.Equal(t, "ack", a[otelnames.AttrOutcome].AsString())
			assert.Equal(t, codes.Unset, p.Status().Code)
		}
	}
	for i, d := range delays {
		a := attrs(d)
		assert.Equal(t, trace.SpanKindProducer, d.SpanKind())
		assert.Equal(t, topology.DelayDestination, a[semconv.MessagingDestinationNameKey].AsString())
		assert.Equal(t, "send", a[semconv.MessagingOperationTypeKey].AsString())
		assert.Equal(t, queue, a[otelnames.AttrQueue].AsString())
		assert.Equal(t, int64(250), a[otelnames.AttrRetryDelayMS].AsInt64())
		assert.Equal(t, int64(i+2), a[otelnames.AttrAttempt].AsInt64(), "the attempt the delayed copy is delivered as")
		assert.Equal(t, "pay-1", a[semconv.MessagingMessageIDKey].AsString())
	}

	inner.mu.Lock()
	defer inner.mu.Unlock()
	require.Len(t, inner.ctx, 2)
	assert.Equal(t, delays[0].SpanContext(), trace.SpanContextFromContext(inner.ctx[0]),
		"the broker runs inside the hand-off span")
}

// failingDelayer is a broker that could not confirm the delayed copy.
type failingDelayer struct{ err error }

func (d failingDelayer) Delay(context.Context, string, time.Duration, *message.Message) error {
	return d.err
}

func TestWrapDelayer_Parent(t *testing.T) {
	tests := []struct {
		name       string
		ctxSpan    bool
		msgCtxSpan bool
		header     bool
		wantParent string // "ctx", "msg", "header" or "" for a root
	}{
		{name: "ctx span wins", ctxSpan: true, msgCtxSpan: true, header: true, wantParent: "ctx"},
		{name: "message context when ctx has none", msgCtxSpan: true, header: true, wantParent: "msg"},
		{name: "headers when no context has a span", header: true, wantParent: "header"},
		{name: "nothing starts a trace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			ctxOf := func(has bool, name string) (context.Context, trace.SpanContext) {
				if !has {
					return context.Background(), trace.SpanContext{}
				}
				ctx, span := e.rootSpan(name)
				span.End()
				return ctx, span.SpanContext()
			}
			ctx, ctxSC := ctxOf(tt.ctxSpan, "ctx")
			msgCtx, msgSC := ctxOf(tt.msgCtxSpan, "msg")
			_, headerSC := ctxOf(tt.header, "header")
			msg := message.NewMessage("id", nil)
			msg.SetContext(msgCtx)
			if tt.header {
				msg.Metadata.Set(headers.TraceParent, traceparent(headerSC))
			}

			require.NoError(t, e.in.WrapDelayer(failingDelayer{}).Delay(ctx, "q", time.Second, msg))

			d := e.ended(t, "send sluice.delay")
			want := map[string]trace.SpanContext{"ctx": ctxSC, "msg": msgSC, "header": headerSC}[tt.wantParent]
			assert.Equal(t, want.SpanID(), d.Parent().SpanID())
			assert.Equal(t, traceparent(d.SpanContext()), msg.Metadata.Get(headers.TraceParent))
		})
	}
}

func TestWrapDelayer_Failure(t *testing.T) {
	e := newEnv(t)
	errConfirm := errors.New("publish not confirmed")
	err := e.in.WrapDelayer(failingDelayer{err: errConfirm}).Delay(context.Background(), "q", time.Second, message.NewMessage("id", nil))

	require.ErrorIs(t, err, errConfirm)
	d := e.ended(t, "send sluice.delay")
	assert.Equal(t, codes.Error, d.Status().Code)
	assert.Equal(t, errConfirm.Error(), d.Status().Description)
}

// recordingDeadLetterer stands for the broker's dead-letter publish.
type recordingDeadLetterer struct {
	err    error
	queue  string
	header string
}

func (d *recordingDeadLetterer) DeadLetter(_ context.Context, queue string, msg *message.Message) error {
	d.queue, d.header = queue, msg.Metadata.Get(headers.TraceParent)
	return d.err
}

func TestWrapDeadLetterer(t *testing.T) {
	errConfirm := errors.New("dlq publish nacked")
	tests := []struct {
		name      string
		err       error
		wantCode  codes.Code
		wantEvent bool
	}{
		{name: "confirmed", wantCode: codes.Unset},
		{name: "not confirmed", err: errConfirm, wantCode: codes.Error, wantEvent: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			inner := &recordingDeadLetterer{err: tt.err}
			ctx, consumer := e.rootSpan("process orders")
			msg := message.NewMessage("id", []byte("abc"))
			msg.Metadata.Set(sluice.HeaderRetryCount, "4")
			msg.Metadata.Set(sluice.HeaderLastError, "insufficient_funds")

			err := e.in.WrapDeadLetterer(inner).DeadLetter(ctx, "orders", msg)
			consumer.End()

			require.ErrorIs(t, err, tt.err)
			d := e.ended(t, "send orders.dlq")
			assert.Equal(t, trace.SpanKindProducer, d.SpanKind())
			assert.Equal(t, consumer.SpanContext().SpanID(), d.Parent().SpanID())
			assert.Equal(t, tt.wantCode, d.Status().Code)
			assert.Equal(t, tt.wantEvent, len(d.Events()) == 1)
			assert.Equal(t, "orders", inner.queue)
			assert.Equal(t, traceparent(d.SpanContext()), inner.header, "headers injected before the broker publishes")

			a := attrs(d)
			assert.Equal(t, "orders.dlq", a[semconv.MessagingDestinationNameKey].AsString())
			assert.Equal(t, "orders", a[otelnames.AttrQueue].AsString())
			assert.Equal(t, int64(5), a[otelnames.AttrAttempt].AsInt64())
			assert.Equal(t, "insufficient_funds", a[otelnames.AttrLastError].AsString())
			assert.Equal(t, int64(3), a[semconv.MessagingMessageBodySizeKey].AsInt64())
		})
	}
}
