package router_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry"
)

func TestHandleBatch_Registration(t *testing.T) {
	nop := func(context.Context, []*message.Message) []error { return nil }
	tests := []struct {
		name    string
		handle  func(s *router.Stack) error
		wantErr error
	}{
		{name: "batch", handle: func(s *router.Stack) error {
			return s.HandleBatch("h", "q", nop, router.WithBatch(10, time.Millisecond))
		}},
		{name: "without WithBatch", handle: func(s *router.Stack) error { return s.HandleBatch("h", "q", nop) }},
		{name: "negative size", wantErr: router.ErrInvalidOption, handle: func(s *router.Stack) error {
			return s.HandleBatch("h", "q", nop, router.WithBatch(-1, 0))
		}},
		{name: "negative wait", wantErr: router.ErrInvalidOption, handle: func(s *router.Stack) error {
			return s.HandleBatch("h", "q", nop, router.WithBatch(5, -time.Second))
		}},
		{name: "WithBatch on Handle", wantErr: router.ErrInvalidOption, handle: func(s *router.Stack) error {
			return s.Handle("h", "q", func(*message.Message) error { return nil }, router.WithBatch(5, 0))
		}},
		{name: "idempotency key without the step", wantErr: router.ErrInvalidOption, handle: func(s *router.Stack) error {
			return s.HandleBatch("h", "q", nop, router.WithIdempotencyKey(func(*message.Message) (string, error) { return "", nil }))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := router.New(newTestBroker(t), router.Config{Logger: silentLogger})
			require.NoError(t, err)
			err = tt.handle(s)
			if tt.wantErr == nil {
				assert.NoError(t, err)
				return
			}
			assert.ErrorIs(t, err, tt.wantErr)
		})
	}
}

// Fewer messages than the batch size are handled together once the wait is over; a
// handler returning a wrong number of results fails every message of its batch
// (retryable: retried, then dead-lettered).
func TestHandleBatch_WaitAndWrongResultCount(t *testing.T) {
	b := newTestBroker(t)
	s, err := router.New(b, router.Config{Logger: silentLogger, Retry: fastRetries(1)})
	require.NoError(t, err)
	var mu sync.Mutex
	var sizes []int
	require.NoError(t, s.HandleBatch("ok", "small", func(_ context.Context, msgs []*message.Message) []error {
		mu.Lock()
		sizes = append(sizes, len(msgs))
		mu.Unlock()
		return nil
	}, router.WithBatch(50, 300*time.Millisecond)))
	require.NoError(t, s.HandleBatch("short", "bad", func(_ context.Context, msgs []*message.Message) []error {
		return make([]error, len(msgs)+1)
	}, router.WithBatch(2, time.Millisecond)))
	serve(t, s)

	for i := range 3 {
		publish(t, b, "small", fmt.Sprintf("s-%d", i))
	}
	publish(t, b, "bad", "b-1")
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(sizes) > 0
	}, 10*time.Second, 5*time.Millisecond)
	mu.Lock()
	assert.Equal(t, []int{3}, sizes, "the three messages are one batch, called after the wait")
	mu.Unlock()

	dlq := topology.DLQ("bad")
	require.Eventually(t, func() bool { return b.mem.Len(dlq) == 1 }, 10*time.Second, 5*time.Millisecond)
	dead := b.mem.Peek(dlq)[0]
	assert.Contains(t, dead.Metadata.Get(sluice.HeaderErrorMessage), "wrong number of results")
	assert.Equal(t, "1", dead.Metadata.Get(sluice.HeaderRetryCount), "retried once, as a retryable failure")
}

// Each message's outputs are published (confirmed) before it is acked, and only the
// outputs of the messages that succeeded.
func TestHandleBatchWithOutput_PerMessageOutputs(t *testing.T) {
	b := newTestBroker(t)
	s, err := router.New(b, router.Config{Logger: silentLogger, Retry: fastRetries(0)})
	require.NoError(t, err)
	require.NoError(t, s.HandleBatchWithOutput("settle", "payments", "ledger", func(_ context.Context, msgs []*message.Message) []router.BatchResult {
		res := make([]router.BatchResult, len(msgs))
		for i, m := range msgs {
			if m.UUID == "m-bad" {
				res[i].Err = sluice.Permanent(fmt.Errorf("unknown account in %s", m.UUID))
				continue
			}
			res[i].Out = []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("entry of "+m.UUID))}
		}
		return res
	}, router.WithBatch(3, 50*time.Millisecond)))
	serve(t, s)

	for _, id := range []string{"m-1", "m-bad", "m-2"} {
		publish(t, b, "payments", id)
	}
	require.Eventually(t, func() bool {
		return b.mem.Len("ledger") == 2 && b.mem.Len(topology.DLQ("payments")) == 1
	}, 10*time.Second, 5*time.Millisecond)
	var entries []string
	for _, m := range b.mem.Peek("ledger") {
		entries = append(entries, string(m.Payload))
	}
	assert.ElementsMatch(t, []string{"entry of m-1", "entry of m-2"}, entries)
	assert.Equal(t, "m-bad", b.mem.Peek(topology.DLQ("payments"))[0].UUID)
}

// Every message has its own consumer span, in its own trace; the batch call has one span
// linked to each of them.
func TestHandleBatch_SpanPerMessageLinkedToBatchSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	in := &telemetry.Config{TracerProvider: tp, Propagator: propagation.TraceContext{}, MessagingSystem: "memory"}
	b := newTestBroker(t)
	s, err := router.New(b, router.Config{Logger: silentLogger, Telemetry: in})
	require.NoError(t, err)
	require.NoError(t, s.HandleBatch("bulk", "orders", func(context.Context, []*message.Message) []error { return nil },
		router.WithBatch(4, 2*time.Second)))
	serve(t, s)

	for i := range 4 {
		publish(t, b, "orders", fmt.Sprintf("o-%d", i))
	}
	var batchSpan sdktrace.ReadOnlySpan
	consumers := map[trace.SpanID]trace.TraceID{}
	require.Eventually(t, func() bool {
		batchSpan, consumers = nil, map[trace.SpanID]trace.TraceID{}
		for _, sp := range rec.Ended() {
			switch sp.Name() {
			case "process batch orders":
				batchSpan = sp
			case "process orders":
				consumers[sp.SpanContext().SpanID()] = sp.SpanContext().TraceID()
			}
		}
		return batchSpan != nil && len(consumers) == 4
	}, 10*time.Second, 5*time.Millisecond)

	traces := map[trace.TraceID]bool{}
	for _, tid := range consumers {
		traces[tid] = true
	}
	assert.Len(t, traces, 4, "each message keeps a trace of its own")
	require.Len(t, batchSpan.Links(), 4)
	for _, l := range batchSpan.Links() {
		tid, ok := consumers[l.SpanContext.SpanID()]
		assert.True(t, ok, "the batch span links span %s, not a message's consumer span", l.SpanContext.SpanID())
		assert.Equal(t, tid, l.SpanContext.TraceID())
	}
	assert.Equal(t, trace.SpanKindConsumer, batchSpan.SpanKind())
}
