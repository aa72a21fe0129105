package idempotency_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/markers"
	"github.com/sluice-go/sluice/internal/otelnames"
	"github.com/sluice-go/sluice/internal/testkit/steptest"
	"github.com/sluice-go/sluice/middleware/idempotency"
)

// paymentKey is the payment example's key function: the payment_id in the JSON body.
func paymentKey(msg *message.Message) (string, error) {
	var p struct {
		PaymentID string `json:"payment_id"`
	}
	if err := json.Unmarshal(msg.Payload, &p); err != nil {
		return "", fmt.Errorf("decode payment: %w", err)
	}
	if p.PaymentID == "" {
		return "", errors.New("payment has no payment_id")
	}
	return p.PaymentID, nil
}

func paymentMessage(id, paymentID string) *message.Message {
	return message.NewMessage(id, fmt.Appendf(nil, `{"payment_id":%q,"amount":100}`, paymentID))
}

func newGuard(t *testing.T, cfg idempotency.Config) *idempotency.Guard {
	t.Helper()
	g, err := idempotency.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, g.Close()) })
	return g
}

// traced puts a recording span into msg's context, as the tracing step does.
func traced(t *testing.T, msg *message.Message) (*tracetest.SpanRecorder, func()) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(context.Background(), "consume")
	msg.SetContext(ctx)
	return rec, func() { span.End() }
}

func eventAttrs(t *testing.T, rec *tracetest.SpanRecorder, name string) map[attribute.Key]attribute.Value {
	t.Helper()
	spans := rec.Ended()
	require.Len(t, spans, 1)
	for _, ev := range spans[0].Events() {
		if ev.Name == name {
			attrs := map[attribute.Key]attribute.Value{}
			for _, kv := range ev.Attributes {
				attrs[kv.Key] = kv.Value
			}
			return attrs
		}
	}
	t.Fatalf("span has no event %q: %+v", name, spans[0].Events())
	return nil
}

func TestMiddleware_DuplicateOfDoneKeyIsAcked(t *testing.T) {
	tests := []struct {
		name          string
		keyFunc       func(*message.Message) (string, error)
		first, second *message.Message
		wantKey       string
		wantSource    string
	}{
		{name: "idempotency-key metadata", first: newMessage("id-1", "pay-1"), second: newMessage("id-2", "pay-1"),
			wantKey: "pay-1", wantSource: "metadata"},
		{name: "key function", keyFunc: paymentKey, first: paymentMessage("id-1", "pay-1"), second: paymentMessage("id-2", "pay-1"),
			wantKey: "pay-1", wantSource: "key_func"},
		{name: "message id", first: newMessage("id-1", ""), second: newMessage("id-1", ""),
			wantKey: "id-1", wantSource: "message_id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			type dup struct {
				msg *message.Message
				key string
			}
			var dups []dup
			g := newGuard(t, idempotency.Config{
				KeyFunc:     tt.keyFunc,
				OnDuplicate: func(msg *message.Message, key string) { dups = append(dups, dup{msg, key}) },
			})
			calls := 0
			output := message.NewMessage("out-1", nil)
			observed := &steptest.Observer{}
			h := g.NewMiddleware(nil, observed)(func(*message.Message) ([]*message.Message, error) {
				calls++
				return []*message.Message{output}, nil
			})

			out, err := h(tt.first)
			require.NoError(t, err)
			assert.Equal(t, []*message.Message{output}, out, "outputs pass through")
			assert.Zero(t, g.Stats().Completed, "with outputs the router still has to publish, the key waits for the ack")
			require.True(t, tt.first.Ack())
			require.Eventually(t, func() bool { return g.Stats().Completed == 1 }, 5*time.Second, time.Millisecond)

			tt.second.Metadata.Set(sluice.HeaderRetryCount, "2")
			rec, end := traced(t, tt.second)
			out, err = h(tt.second)
			end()
			require.NoError(t, err, "a duplicate is acknowledged")
			assert.Nil(t, out, "a duplicate publishes nothing")
			assert.Equal(t, 1, calls, "handler runs once")
			assert.Equal(t, uint64(1), g.Stats().Hits)
			assert.Equal(t, []dup{{tt.second, tt.wantKey}}, dups)

			got, ok := observed.Last()
			require.True(t, ok, "outcome observed")
			assert.Equal(t, steptest.Report{Outcome: disposition.Duplicate, Attempt: 3}, got)

			attrs := eventAttrs(t, rec, otelnames.EventIdempotencyDuplicate)
			assert.Equal(t, tt.wantKey, attrs["idempotency.key"].AsString())
			assert.Equal(t, tt.wantSource, attrs["idempotency.key_source"].AsString())
		})
	}
}

func TestMiddleware_KeySources(t *testing.T) {
	tests := []struct {
		name           string
		keyFunc        func(*message.Message) (string, error) // Config.KeyFunc
		handlerKeyFunc func(*message.Message) (string, error) // the router's per-handler key
		first, second  *message.Message
		wantDuplicate  bool
	}{
		{name: "same metadata key, different ids", first: newMessage("a", "k"), second: newMessage("b", "k"), wantDuplicate: true},
		{name: "metadata key wins over the id", first: newMessage("a", "k1"), second: newMessage("a", "k2")},
		{name: "metadata key wins over the key function", keyFunc: paymentKey,
			first: withKey(paymentMessage("a", "pay-1"), "k"), second: paymentMessage("b", "k"), wantDuplicate: true},
		{name: "same key function key, different ids", keyFunc: paymentKey,
			first: paymentMessage("a", "pay-1"), second: paymentMessage("b", "pay-1"), wantDuplicate: true},
		{name: "different key function keys, same id", keyFunc: paymentKey,
			first: paymentMessage("a", "pay-1"), second: paymentMessage("a", "pay-2")},
		{name: "empty key function key falls back to the id", keyFunc: func(*message.Message) (string, error) { return "", nil },
			first: newMessage("a", ""), second: newMessage("a", ""), wantDuplicate: true},
		{name: "a business key never matches a message id", first: newMessage("x", "a"), second: newMessage("a", "")},
		{name: "handler key function", handlerKeyFunc: paymentKey,
			first: paymentMessage("a", "pay-1"), second: paymentMessage("b", "pay-1"), wantDuplicate: true},
		{name: "handler key function replaces Config.KeyFunc", keyFunc: func(*message.Message) (string, error) { return "same", nil },
			handlerKeyFunc: paymentKey, first: paymentMessage("a", "pay-1"), second: paymentMessage("b", "pay-2")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGuard(t, idempotency.Config{KeyFunc: tt.keyFunc})
			calls := 0
			h := g.NewMiddleware(tt.handlerKeyFunc)(func(*message.Message) ([]*message.Message, error) { calls++; return nil, nil })
			for _, msg := range []*message.Message{tt.first, tt.second} {
				_, err := h(msg)
				require.NoError(t, err)
			}
			wantCalls := 2
			if tt.wantDuplicate {
				wantCalls = 1
			}
			assert.Equal(t, wantCalls, calls)
		})
	}
}

func withKey(msg *message.Message, key string) *message.Message {
	msg.Metadata.Set(sluice.HeaderIdempotencyKey, key)
	return msg
}

func TestMiddleware_FailedAttemptDoesNotMarkKey(t *testing.T) {
	tests := []struct {
		name string
		fail func() ([]*message.Message, error)
	}{
		{name: "retryable error", fail: func() ([]*message.Message, error) { return nil, errors.New("gateway timeout") }},
		{name: "permanent error", fail: func() ([]*message.Message, error) { return nil, sluice.Permanent(errors.New("bad input")) }},
		{name: "deferral from below", fail: func() ([]*message.Message, error) { return nil, sluice.Defer(time.Second, errors.New("breaker open")) }},
		{name: "panic", fail: func() ([]*message.Message, error) { panic("handler bug") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGuard(t, idempotency.Config{})
			calls := 0
			h := g.Middleware(func(*message.Message) ([]*message.Message, error) {
				calls++
				if calls == 1 {
					return tt.fail()
				}
				return nil, nil
			})
			func() {
				defer func() { _ = recover() }()
				_, err := h(newMessage("attempt-1", "pay-1"))
				assert.Error(t, err)
			}()
			_, err := h(newMessage("attempt-2", "pay-1"))
			require.NoError(t, err)
			assert.Equal(t, 2, calls, "the retry runs")
			_, err = h(newMessage("attempt-3", "pay-1"))
			require.NoError(t, err)
			assert.Equal(t, 2, calls, "then the key is done")
			st := g.Stats()
			assert.Equal(t, uint64(1), st.Released)
			assert.Equal(t, uint64(1), st.Completed)
			assert.Equal(t, uint64(1), st.Hits)
		})
	}
}

func TestMiddleware_InFlightDuplicateIsDeferred(t *testing.T) {
	tests := []struct {
		name      string
		deferral  time.Duration
		advance   time.Duration // clock time spent by the first attempt before the duplicate
		wantAfter time.Duration
	}{
		{name: "default deferral", wantAfter: idempotency.DefaultInFlightDeferral},
		{name: "configured deferral", deferral: 5 * time.Second, wantAfter: 5 * time.Second},
		{name: "rest of the lease when shorter", advance: testLease - 300*time.Millisecond, wantAfter: 300 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newClock()
			g := newGuard(t, idempotency.Config{Lease: testLease, InFlightDeferral: tt.deferral, Now: clock.Now})
			var calls atomic.Int32
			started, unblock := make(chan struct{}), make(chan struct{})
			h := g.Middleware(func(*message.Message) ([]*message.Message, error) {
				if calls.Add(1) == 1 {
					close(started)
					<-unblock
				}
				return nil, nil
			})
			firstErr := make(chan error, 1)
			go func() {
				_, err := h(newMessage("first", "pay-1"))
				firstErr <- err
			}()
			<-started
			clock.Advance(tt.advance)

			dup := newMessage("second", "pay-1")
			rec, end := traced(t, dup)
			out, err := h(dup)
			end()
			assert.Nil(t, out)
			var de *markers.Defer
			require.ErrorAs(t, err, &de)
			assert.Equal(t, tt.wantAfter, de.After)
			assert.ErrorIs(t, err, idempotency.ErrInFlight)
			assert.Equal(t, sluice.ClassDefer, sluice.ClassOf(err))
			assert.Equal(t, int32(1), calls.Load(), "the duplicate did not run")
			attrs := eventAttrs(t, rec, otelnames.EventIdempotencyInFlight)
			assert.Equal(t, tt.wantAfter.Milliseconds(), attrs["idempotency.defer_ms"].AsInt64())

			close(unblock)
			require.NoError(t, <-firstErr)
			_, err = h(newMessage("third", "pay-1"))
			require.NoError(t, err, "after completion it is a duplicate")
			assert.Equal(t, int32(1), calls.Load())
			assert.Equal(t, uint64(1), g.Stats().InFlightHits)
			assert.Equal(t, uint64(1), g.Stats().Hits)
		})
	}
}

func TestMiddleware_KeyFuncErrorIsPermanent(t *testing.T) {
	errNoPayment := errors.New("payment has no payment_id")
	keyFunc := func(msg *message.Message) (string, error) {
		if string(msg.Payload) == "{}" {
			return "", errNoPayment
		}
		return "pay-1", nil
	}
	tests := []struct {
		name      string
		msg       *message.Message
		wantErr   bool
		wantCalls int
	}{
		{name: "key function fails", msg: newMessage("m-1", ""), wantErr: true},
		{name: "metadata key means the key function is not asked", msg: newMessage("m-1", "pay-1"), wantCalls: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGuard(t, idempotency.Config{KeyFunc: keyFunc})
			calls := 0
			h := g.Middleware(func(*message.Message) ([]*message.Message, error) { calls++; return nil, nil })
			_, err := h(tt.msg)
			assert.Equal(t, tt.wantCalls, calls)
			if !tt.wantErr {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Equal(t, sluice.ClassPermanent, sluice.ClassOf(err), "bad input goes to the DLQ: %v", err)
			assert.ErrorIs(t, err, idempotency.ErrKey)
			assert.ErrorIs(t, err, errNoPayment)
			assert.ErrorContains(t, err, "m-1")
			assert.Equal(t, uint64(1), g.Stats().KeyErrors)
			assert.Zero(t, g.Stats().Keys, "nothing held")
		})
	}
}

func TestMiddleware_MessageWithoutKeyRunsUnguarded(t *testing.T) {
	g := newGuard(t, idempotency.Config{})
	calls := 0
	h := g.Middleware(func(*message.Message) ([]*message.Message, error) { calls++; return nil, nil })
	for range 2 {
		_, err := h(newMessage("", ""))
		require.NoError(t, err)
	}
	assert.Equal(t, 2, calls)
	assert.Equal(t, uint64(2), g.Stats().NoKey)
	assert.Zero(t, g.Stats().Keys)
}

func TestMiddleware_ConcurrentDuplicatesRunOnce(t *testing.T) {
	// 200 keys, 5 copies each (different message ids), 32 workers; every 7th key's first
	// attempt fails. A deferred or failed message is tried again, as the broker would.
	const (
		keys    = 200
		copies  = 5
		workers = 32
	)
	g := newGuard(t, idempotency.Config{})
	var effects, attempts [keys]atomic.Int32
	h := g.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		var k int
		_, _ = fmt.Sscanf(msg.Metadata.Get(sluice.HeaderIdempotencyKey), "pay-%d", &k)
		if attempts[k].Add(1) == 1 && k%7 == 0 {
			return nil, errors.New("gateway timeout")
		}
		effects[k].Add(1)
		return nil, nil
	})
	queue := make(chan *message.Message, keys*copies)
	for c := range copies {
		for k := range keys {
			queue <- newMessage(fmt.Sprintf("m-%d-%d", k, c), fmt.Sprint("pay-", k))
		}
	}
	close(queue)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for msg := range queue {
				for {
					if _, err := h(msg); err == nil {
						break
					}
				}
			}
		})
	}
	wg.Wait()
	for k := range keys {
		assert.Equal(t, int32(1), effects[k].Load(), "side effects of pay-%d", k)
	}
	st := g.Stats()
	assert.Equal(t, uint64(keys), st.Completed)
	assert.Equal(t, uint64(keys*(copies-1)), st.Hits)
}

func TestMiddleware_KeysAreScopedByHandler(t *testing.T) {
	// Two handlers consume copies of the same events; each must process every key once.
	g := newGuard(t, idempotency.Config{})
	pubsub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddMiddleware(g.Middleware)
	var effects sync.Map // handler name -> *atomic.Int32
	for _, name := range []string{"ledger", "notifier"} {
		n := new(atomic.Int32)
		effects.Store(name, n)
		router.AddConsumerHandler(name, "payments", pubsub, func(*message.Message) error {
			n.Add(1)
			return nil
		})
	}
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(context.Background()) }()
	t.Cleanup(func() {
		assert.NoError(t, router.Close())
		assert.NoError(t, <-runErr)
		assert.NoError(t, pubsub.Close())
	})
	<-router.Running()

	require.NoError(t, pubsub.Publish("payments", newMessage("m-1", "pay-1"), newMessage("m-2", "pay-1")))
	require.Eventually(t, func() bool { return g.Stats().Hits == 2 }, 5*time.Second, 5*time.Millisecond)
	for _, name := range []string{"ledger", "notifier"} {
		n, _ := effects.Load(name)
		assert.Equal(t, int32(1), n.(*atomic.Int32).Load(), name)
	}
}

func TestGuard_CloseLeavesNoGoroutines(t *testing.T) {
	defer goleak.VerifyNone(t, watermillCleanup)
	g, err := idempotency.New(idempotency.Config{SnapshotPath: filepath.Join(t.TempDir(), "keys.snap")})
	require.NoError(t, err)
	h := g.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() { _, _ = h(newMessage(fmt.Sprint("m-", i), fmt.Sprint("pay-", i%10))) })
	}
	wg.Wait()
	require.NoError(t, g.Close())
}

// A handler's outputs that the router publishes after the step returns: the key is done
// only when the router acks; a nack (the output publish failed) or Close releases it, so
// the redelivery runs the handler again instead of being acked as a duplicate.
func TestMiddleware_KeyWithOutputsWaitsForTheRouter(t *testing.T) {
	tests := []struct {
		name      string
		settle    func(g *idempotency.Guard, msg *message.Message)
		wantCalls int
	}{
		{name: "ack marks the key done", settle: func(_ *idempotency.Guard, m *message.Message) { m.Ack() }, wantCalls: 1},
		{name: "nack releases the key", settle: func(_ *idempotency.Guard, m *message.Message) { m.Nack() }, wantCalls: 2},
		{name: "close releases the key", settle: func(g *idempotency.Guard, _ *message.Message) { require.NoError(t, g.Close()) }, wantCalls: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, watermillCleanup)
			g, err := idempotency.New(idempotency.Config{})
			require.NoError(t, err)
			defer func() { require.NoError(t, g.Close()) }()
			calls := 0
			h := g.Middleware(func(*message.Message) ([]*message.Message, error) {
				calls++
				return []*message.Message{message.NewMessage("out", nil)}, nil
			})
			first := newMessage("m-1", "pay-1")
			_, err = h(first)
			require.NoError(t, err)

			_, err = h(newMessage("m-2", "pay-1"))
			require.ErrorIs(t, err, idempotency.ErrInFlight, "until the router settles, the key is in flight")

			tt.settle(g, first)
			require.Eventually(t, func() bool {
				st := g.Stats()
				return st.Completed+st.Released == 1
			}, 5*time.Second, time.Millisecond)
			_, err = h(newMessage("m-3", "pay-1"))
			require.NoError(t, err)
			assert.Equal(t, tt.wantCalls, calls)
		})
	}
}
