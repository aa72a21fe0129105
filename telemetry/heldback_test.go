package telemetry_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	noopmetric "go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/otelnames"
	"github.com/sluice-go/sluice/telemetry"
)

// heldBackDelay is the native schedule of these tests: the n-th retry held back n × 200ms.
func heldBackDelay(attempt int) time.Duration { return time.Duration(attempt) * 200 * time.Millisecond }

// delivery is a message as RabbitMQ hands a quorum queue's message over: a redelivery
// carries amqp-redelivered and the queue's x-delivery-count, and the headers it first had.
func delivery(id string, redeliveries int, traceparent string) *message.Message {
	m := message.NewMessage(id, []byte(`{"amount":100}`))
	if redeliveries > 0 {
		m.Metadata.Set("amqp-redelivered", "true")
		m.Metadata.Set("x-delivery-count", strconv.Itoa(redeliveries))
	}
	if traceparent != "" {
		m.Metadata.Set("traceparent", traceparent)
	}
	return m
}

// A native delayed retry rejects the message back to its queue, which redelivers it with
// the headers it first had: the rejection is drawn as a settle span "reject <queue>" under
// the attempt that failed, and the next attempt this instance consumes is its child, so
// the message's attempts are one chain, even when its producer sent no trace context.
func TestHeldBack_NextAttemptIsTheRejectionsChild(t *testing.T) {
	e := newEnv(t)
	queue := uniqueQueue("native")
	// Attempts 1 and 2 fail and are held back by the queue; attempt 3 succeeds.
	ps, results := e.runRouter(t, queue, func(msg *message.Message) ([]*message.Message, error) {
		n, _ := strconv.Atoi(msg.Metadata.Get("x-delivery-count"))
		attempt := n + 1
		if attempt > 2 {
			return nil, nil
		}
		err := errors.New("gateway: 503")
		e.in.Observe(msg.Context(), disposition.Outcome{
			Disposition: disposition.Disposition{Kind: disposition.Retry, Delay: heldBackDelay(attempt), Reason: err, HeldBack: true},
			Attempt:     attempt, Queue: queue, MessageID: msg.UUID,
		})
		return nil, err
	}, routerOpts{})

	for n := range 3 {
		require.NoError(t, ps.Publish(queue, delivery("pay-1", n, "")))
		next(t, results)
	}

	attempts := e.endedAll("process " + queue)
	rejects := e.endedAll("reject " + queue)
	require.Len(t, attempts, 3)
	require.Len(t, rejects, 2, "one rejection per held-back retry")
	traceID := attempts[0].SpanContext().TraceID()
	assert.False(t, attempts[0].Parent().IsValid(), "the first attempt starts the trace: the producer sent none")
	for i, r := range rejects {
		a := attrs(r)
		assert.Equal(t, trace.SpanKindClient, r.SpanKind(), "rejection %d: a settlement is a client span", i+1)
		assert.Equal(t, attempts[i].SpanContext().SpanID(), r.Parent().SpanID(), "rejection %d: child of attempt %d", i+1, i+1)
		assert.Equal(t, traceID, r.SpanContext().TraceID())
		assert.Equal(t, semconv.MessagingOperationTypeSettle.Value, a[semconv.MessagingOperationTypeKey])
		assert.Equal(t, "reject", a[semconv.MessagingOperationNameKey].AsString())
		assert.Equal(t, queue, a[semconv.MessagingDestinationNameKey].AsString())
		assert.Equal(t, "pay-1", a[semconv.MessagingMessageIDKey].AsString())
		assert.Equal(t, heldBackDelay(i+1).Milliseconds(), a[otelnames.AttrRetryDelayMS].AsInt64(), "rejection %d: the queue's delay", i+1)
		assert.Equal(t, int64(i+2), a[otelnames.AttrAttempt].AsInt64(), "rejection %d: hands the message to attempt %d", i+1, i+2)

		next := attempts[i+1]
		assert.Equal(t, r.SpanContext().SpanID(), next.Parent().SpanID(), "attempt %d: child of rejection %d", i+2, i+1)
		assert.True(t, next.Parent().IsRemote(), "attempt %d: its parent is another attempt's, as a header's would be", i+2)
		assert.Equal(t, traceID, next.SpanContext().TraceID(), "attempt %d: the message's trace", i+2)
	}
}

// Only the attempt a rejection handed the message to continues from it; every other
// delivery keeps the parent its headers give, as before native retries were drawn.
func TestHeldBack_OnlyTheNextRedeliveryIsLinked(t *testing.T) {
	rootTP := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	cases := []struct {
		name string
		// then is delivered after the message was rejected on its first attempt.
		then     *message.Message
		onQueue  string // "" for the queue that rejected it
		wantLink bool
	}{
		{name: "the next redelivery", then: delivery("pay-1", 1, rootTP), wantLink: true},
		{name: "a first delivery of the same id", then: delivery("pay-1", 0, rootTP)},
		{name: "a redelivery after a lost connection also counted", then: delivery("pay-1", 2, rootTP)},
		{name: "another message", then: delivery("pay-2", 1, rootTP)},
		{name: "the same id on another queue", then: delivery("pay-1", 1, rootTP), onQueue: "other"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			queue := uniqueQueue("native")
			handler := func(msg *message.Message) ([]*message.Message, error) {
				if msg.Metadata.Get("amqp-redelivered") == "" && msg.Metadata.Get("first") != "" {
					e.in.Observe(msg.Context(), disposition.Outcome{
						Disposition: disposition.Disposition{Kind: disposition.Retry, Delay: heldBackDelay(1), Reason: errors.New("gateway: 503"), HeldBack: true},
						Attempt:     1, Queue: queue, MessageID: msg.UUID,
					})
				}
				return nil, nil
			}
			ps, results := e.runRouter(t, queue, handler, routerOpts{})
			first := delivery("pay-1", 0, rootTP)
			first.Metadata.Set("first", "1")
			require.NoError(t, ps.Publish(queue, first))
			next(t, results)
			other := queue
			if tc.onQueue != "" {
				// A second handler, on another queue, under the same instrumentation.
				other = uniqueQueue(tc.onQueue)
				ps, results = e.runRouter(t, other, handler, routerOpts{})
			}
			require.NoError(t, ps.Publish(other, tc.then))
			next(t, results)

			reject := e.ended(t, "reject "+queue)
			later := e.endedAll("process " + other)
			require.NotEmpty(t, later)
			got := later[len(later)-1]
			if tc.wantLink {
				assert.Equal(t, reject.SpanContext().SpanID(), got.Parent().SpanID(), "child of the rejection")
			} else {
				assert.Equal(t, "b7ad6b7169203331", got.Parent().SpanID().String(), "child of the producer's span, from its traceparent")
			}
		})
	}
}

// firstRootDropped drops the first trace it is asked to start and samples every later one,
// as a ratio sampler may: a retry that started a trace of its own would be sampled apart
// from its message's first attempt.
type firstRootDropped struct{ asked atomic.Int32 }

func (s *firstRootDropped) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if s.asked.Add(1) == 1 {
		return sdktrace.SamplingResult{Decision: sdktrace.Drop, Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
	}
	return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample, Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
}

func (s *firstRootDropped) Description() string { return "firstRootDropped" }

// A message's attempts follow its first attempt's sampling decision: an unsampled
// rejection is remembered too, so no later attempt starts a partial trace of its own.
func TestHeldBack_AttemptsFollowTheFirstSamplingDecision(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(&firstRootDropped{})), sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	in, err := telemetry.New(telemetry.WithTracerProvider(tp), telemetry.WithMeterProvider(noopmetric.NewMeterProvider()))
	require.NoError(t, err)
	e := &env{in: in, spans: spans, tp: tp}
	queue := uniqueQueue("native")
	ps, results := e.runRouter(t, queue, func(msg *message.Message) ([]*message.Message, error) {
		n, _ := strconv.Atoi(msg.Metadata.Get("x-delivery-count"))
		if n < 2 {
			e.in.Observe(msg.Context(), disposition.Outcome{
				Disposition: disposition.Disposition{Kind: disposition.Retry, Delay: heldBackDelay(n + 1), Reason: errors.New("gateway: 503"), HeldBack: true},
				Attempt:     n + 1, Queue: queue, MessageID: msg.UUID,
			})
		}
		return nil, nil
	}, routerOpts{})
	for n := range 3 {
		require.NoError(t, ps.Publish(queue, delivery("pay-1", n, "")))
		next(t, results)
	}
	assert.Empty(t, spanNames(spans.Ended()), "the first attempt was not sampled, so none of its retries is")

	// A message of its own is sampled (the sampler drops only the first trace).
	require.NoError(t, ps.Publish(queue, delivery("pay-2", 0, "")))
	next(t, results)
	assert.Len(t, e.endedAll("process "+queue), 1)
}
