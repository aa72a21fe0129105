package router_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// silentLogger keeps the stack's expected failures out of the test output.
var silentLogger = slog.New(slog.DiscardHandler)

var errOutputDown = errors.New("output exchange unavailable")

// fastRetries is a policy whose delays keep a test short; no jitter, so they are exact.
func fastRetries(maxRetries int) retry.Config {
	return retry.Config{MaxRetries: maxRetries, InitialDelay: 5 * time.Millisecond, MaxDelay: 20 * time.Millisecond, Jitter: retry.NoJitter}
}

// testBroker is the embedded broker with two changes a test controls: the first
// failOutputs handler-output publishes fail, and Delay refuses a cancelled context, as a
// confirmed publish to RabbitMQ does (the embedded broker ignores the context).
type testBroker struct {
	router.Broker
	mem         *memory.Broker
	failOutputs atomic.Int32
	// delayCtxErrs records, per Delay call, the error of its context at the call.
	mu           sync.Mutex
	delayCtxErrs []error
}

func newTestBroker(t *testing.T) *testBroker {
	t.Helper()
	mem := memory.New(memory.Config{Logger: silentLogger})
	t.Cleanup(func() { _ = mem.Close() })
	return &testBroker{Broker: mem, mem: mem}
}

// PublishConfirmed is the stack's output publish: it fails while failOutputs is positive.
func (b *testBroker) PublishConfirmed(ctx context.Context, queue string, msgs ...*message.Message) error {
	if b.failOutputs.Add(-1) >= 0 {
		return fmt.Errorf("publish to %q: %w", queue, errOutputDown)
	}
	return b.Broker.PublishConfirmed(ctx, queue, msgs...)
}

func (b *testBroker) Delay(ctx context.Context, queue string, d time.Duration, msg *message.Message) error {
	err := ctx.Err()
	b.mu.Lock()
	b.delayCtxErrs = append(b.delayCtxErrs, err)
	b.mu.Unlock()
	if err != nil {
		return fmt.Errorf("delay to %q: %w", queue, err)
	}
	return b.Broker.Delay(ctx, queue, d, msg)
}

func (b *testBroker) delayContextErrors() []error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]error(nil), b.delayCtxErrs...)
}

// delivery is what the handler saw on one call.
type delivery struct {
	retryCount  string
	deferCount  string
	lastError   string
	hasDeadline bool
	deadlineIn  time.Duration // from the call's start
}

// recorder records the handler's calls.
type recorder struct {
	mu    sync.Mutex
	calls []delivery
}

// record notes msg and returns the number of this call, from 1.
func (r *recorder) record(msg *message.Message) int {
	d := delivery{
		retryCount: msg.Metadata.Get(sluice.HeaderRetryCount),
		deferCount: msg.Metadata.Get(headers.DeferCount),
		lastError:  msg.Metadata.Get(sluice.HeaderLastErrorMessage),
	}
	if dl, ok := msg.Context().Deadline(); ok {
		d.hasDeadline, d.deadlineIn = true, time.Until(dl)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, d)
	return len(r.calls)
}

func (r *recorder) all() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.calls...)
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

func retryCounts(ds []delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.retryCount
	}
	return out
}

// serve runs s until the test ends.
func serve(t *testing.T, s *router.Stack) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-s.Running():
	case err := <-done:
		t.Fatalf("stack stopped at start: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("stack did not start")
	}
	t.Cleanup(func() {
		assert.NoError(t, s.Close())
		cancel()
		<-done
	})
}

func publish(t *testing.T, b *testBroker, queue, id string) {
	t.Helper()
	require.NoError(t, b.mem.Publish(queue, message.NewMessage(id, []byte(`{"id":"`+id+`"}`))))
}

func TestNew(t *testing.T) {
	tests := []struct {
		name    string
		broker  router.Broker
		cfg     router.Config
		wantIs  error
		wantMsg string
	}{
		{name: "no broker", cfg: router.Config{}, wantIs: router.ErrNoBroker},
		{name: "invalid retry policy", broker: memory.New(memory.Config{Logger: silentLogger}), cfg: router.Config{Retry: retry.Config{Multiplier: 0.5}}, wantMsg: "Multiplier 0.5"},
		{name: "defaults", broker: memory.New(memory.Config{Logger: silentLogger})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.broker != nil {
				t.Cleanup(func() { _ = tt.broker.Close() })
			}
			tt.cfg.Logger = silentLogger
			s, err := router.New(tt.broker, tt.cfg)
			switch {
			case tt.wantIs != nil:
				require.ErrorIs(t, err, tt.wantIs)
				assert.Nil(t, s)
			case tt.wantMsg != "":
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantMsg)
				assert.Nil(t, s)
			default:
				require.NoError(t, err)
				assert.Equal(t, 5, s.Retry().Config().MaxRetries, "the retry step's own defaults apply")
			}
		})
	}
}

func TestHandle_Registration(t *testing.T) {
	noop := func(*message.Message) error { return nil }
	noopOut := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	tests := []struct {
		name     string
		register func(s *router.Stack) error // the second registration, after "work" on "q"
		wantIs   error
	}{
		{"another name", func(s *router.Stack) error { return s.Handle("other", "q2", noop) }, nil},
		{"duplicate name", func(s *router.Stack) error { return s.Handle("work", "q2", noop) }, router.ErrDuplicateHandler},
		{"duplicate name with output", func(s *router.Stack) error { return s.HandleWithOutput("work", "q2", "out", noopOut) }, router.ErrDuplicateHandler},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newTestBroker(t)
			s, err := router.New(b, router.Config{Logger: silentLogger})
			require.NoError(t, err)
			require.NoError(t, s.Handle("work", "q", noop))
			err = tt.register(s)
			if tt.wantIs == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tt.wantIs)
			assert.Contains(t, err.Error(), `"work"`, "the error names the handler")
		})
	}
}

func TestHandle_AfterRun(t *testing.T) {
	b := newTestBroker(t)
	s, err := router.New(b, router.Config{Logger: silentLogger})
	require.NoError(t, err)
	require.NoError(t, s.Handle("work", "q", func(*message.Message) error { return nil }))
	serve(t, s)

	assert.ErrorIs(t, s.Handle("late", "q2", func(*message.Message) error { return nil }), router.ErrRunning)
	assert.ErrorIs(t, s.HandleWithOutput("late-out", "q3", "out", func(*message.Message) ([]*message.Message, error) { return nil, nil }), router.ErrRunning)
}

// (a) The handler's panic is recovered inside the retry and poison steps: it is retried like
// any failure and, once the retries are used up, dead-lettered with its stack. Were the
// panic recovered only outside them, the message would be nacked and redelivered forever.
func TestOrder_HandlerPanicIsRetriedThenDeadLettered(t *testing.T) {
	const maxRetries = 2
	b := newTestBroker(t)
	s, err := router.New(b, router.Config{Logger: silentLogger, Retry: fastRetries(maxRetries)})
	require.NoError(t, err)
	var rec recorder
	require.NoError(t, s.Handle("charge", "payments", func(msg *message.Message) error {
		rec.record(msg)
		return explodingCharge()
	}))
	serve(t, s)

	publish(t, b, "payments", "m-panic")
	dlq := topology.DLQ("payments")
	require.Eventually(t, func() bool { return b.mem.Len(dlq) == 1 }, 10*time.Second, 5*time.Millisecond, "the panicking message was not dead-lettered")

	assert.Equal(t, []string{"", "1", "2"}, retryCounts(rec.all()), "first attempt and %d retries", maxRetries)
	dead := b.mem.Peek(dlq)[0]
	assert.Equal(t, "m-panic", dead.UUID)
	assert.Equal(t, "panic", dead.Metadata.Get(sluice.HeaderErrorType))
	assert.Contains(t, dead.Metadata.Get(sluice.HeaderErrorStack), "router_test.explodingCharge", "the record's stack is the handler's")
	assert.Equal(t, "charge", dead.Metadata.Get(headers.Handler))
	assert.Equal(t, "2", dead.Metadata.Get(sluice.HeaderRetryCount))
	var types []string
	for _, e := range failure.History(dead.Metadata) {
		types = append(types, e.Type)
	}
	assert.Equal(t, []string{"panic", "panic", "panic"}, types)
	assert.Zero(t, b.mem.Len("payments"))
	assert.Equal(t, maxRetries+1, rec.count(), "no delivery after the dead letter")
}

func explodingCharge() error {
	var gateway map[string]func() error
	return gateway["visa"]() // nil func: panics
}

// (b) Handler outputs are published inside the idempotency step: a failed output publish is
// an ordinary failure, retried, and the key is not marked done, so the retry runs the
// handler again. Once it succeeded, a duplicate is not handled again.
func TestOrder_FailedOutputPublishIsRetriedNotMarkedDone(t *testing.T) {
	b := newTestBroker(t)
	b.failOutputs.Store(1)
	duplicates := make(chan string, 1)
	guard, err := idempotency.New(idempotency.Config{OnDuplicate: func(msg *message.Message, _ string) { duplicates <- msg.UUID }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = guard.Close() })
	s, err := router.New(b, router.Config{Logger: silentLogger, Retry: fastRetries(3), Guard: guard})
	require.NoError(t, err)
	var rec recorder
	require.NoError(t, s.HandleWithOutput("settle", "payments", "ledger", func(msg *message.Message) ([]*message.Message, error) {
		n := rec.record(msg)
		return []*message.Message{message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "entry of %s, call %d", msg.UUID, n))}, nil
	}))
	serve(t, s)

	publish(t, b, "payments", "m-out")
	require.Eventually(t, func() bool { return b.mem.Len("ledger") == 1 }, 10*time.Second, 5*time.Millisecond, "the output was never published")

	calls := rec.all()
	require.Len(t, calls, 2, "the retry ran the handler again")
	assert.Equal(t, []string{"", "1"}, retryCounts(calls))
	assert.Contains(t, calls[1].lastError, errOutputDown.Error(), "the retry was caused by the output publish")
	assert.Equal(t, "entry of m-out, call 2", string(b.mem.Peek("ledger")[0].Payload), "only the confirmed publish's output exists")
	assert.Zero(t, b.mem.Len(topology.DLQ("payments")))

	// The successful attempt did mark the key done: the idempotency step is in the stack.
	publish(t, b, "payments", "m-out")
	select {
	case id := <-duplicates:
		assert.Equal(t, "m-out", id)
	case <-time.After(10 * time.Second):
		t.Fatal("the redelivered message was not recognized as a duplicate")
	}
	assert.Equal(t, 2, rec.count(), "a duplicate must not run the handler")
	assert.Equal(t, 1, b.mem.Len("ledger"))
}

// (c) The handler's context carries HandlerTimeout's deadline, and the retry hand-off after
// the timeout fired runs with the message's own context again, so it is not cancelled.
func TestOrder_TimeoutContextIsRestoredForTheHandoff(t *testing.T) {
	const timeout = 50 * time.Millisecond
	b := newTestBroker(t)
	s, err := router.New(b, router.Config{Logger: silentLogger, Retry: fastRetries(3), HandlerTimeout: timeout})
	require.NoError(t, err)
	var rec recorder
	require.NoError(t, s.Handle("slow", "payments", func(msg *message.Message) error {
		if rec.record(msg) > 1 {
			return nil
		}
		select {
		case <-msg.Context().Done(): // the gateway hangs until the timeout fires
			return fmt.Errorf("gateway call: %w", msg.Context().Err())
		case <-time.After(5 * time.Second):
			return errors.New("HandlerTimeout never cancelled the handler's context")
		}
	}))
	serve(t, s)

	publish(t, b, "payments", "m-slow")
	require.Eventually(t, func() bool { return rec.count() == 2 }, 10*time.Second, 5*time.Millisecond, "the timed-out attempt was not retried")

	calls := rec.all()
	for i, c := range calls {
		require.True(t, c.hasDeadline, "call %d: the handler's context has no deadline", i+1)
		assert.LessOrEqual(t, c.deadlineIn, timeout, "call %d: deadline beyond HandlerTimeout", i+1)
		assert.Positive(t, c.deadlineIn, "call %d: deadline already passed at the start", i+1)
	}
	assert.Equal(t, "1", calls[1].retryCount)
	assert.Contains(t, calls[1].lastError, context.DeadlineExceeded.Error())
	assert.Equal(t, []error{nil}, b.delayContextErrors(), "the hand-off ran with a cancelled context")
	assert.Zero(t, b.mem.Len(topology.DLQ("payments")))
}

// (d) A Defer from the handler goes back to the broker without using an attempt: with one
// retry allowed, a failure followed by two deferrals still succeeds on the fourth call.
func TestOrder_DeferDoesNotUseAnAttempt(t *testing.T) {
	b := newTestBroker(t)
	s, err := router.New(b, router.Config{Logger: silentLogger, Retry: fastRetries(1)})
	require.NoError(t, err)
	var rec recorder
	done := make(chan struct{})
	require.NoError(t, s.Handle("reserve", "stock", func(msg *message.Message) error {
		switch rec.record(msg) {
		case 1:
			return errors.New("warehouse timeout")
		case 2, 3:
			return sluice.Defer(5*time.Millisecond, errors.New("sku locked"))
		default:
			close(done)
			return nil
		}
	}))
	serve(t, s)

	publish(t, b, "stock", "m-defer")
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the message never succeeded; deliveries: %+v, dead letters: %d", rec.all(), b.mem.Len(topology.DLQ("stock")))
	}
	calls := rec.all()
	assert.Equal(t, []string{"", "1", "1", "1"}, retryCounts(calls), "x-retry-count must not change on a deferral")
	var defers []string
	for _, c := range calls {
		defers = append(defers, c.deferCount)
	}
	assert.Equal(t, []string{"", "", "1", "2"}, defers)
	assert.Zero(t, b.mem.Len(topology.DLQ("stock")))
}
