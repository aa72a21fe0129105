package test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/jaeger"
	"github.com/sluice-go/sluice/internal/markers"
	"github.com/sluice-go/sluice/internal/testkit/steptest"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/policy"
	"github.com/sluice-go/sluice/router"
)

// The native schedule of these tests: the n-th retry held back 200 ms × n, at most 1 s.
const (
	nativeMin = 200 * time.Millisecond
	nativeMax = time.Second
	// nativeSlack is what a redelivery may come before its delay on the clock of this
	// process: the broker's timer and the two hops are not measured from the same instant.
	nativeSlack = 20 * time.Millisecond
)

// attemptLog records each message's attempts with their times.
type attemptLog struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func (l *attemptLog) add(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.at == nil {
		l.at = map[string][]time.Time{}
	}
	l.at[id] = append(l.at[id], time.Now())
	return len(l.at[id])
}

func (l *attemptLog) times(id string) []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Time(nil), l.at[id]...)
}

// RabbitMQ 4.3's delayed retry carries a handler's plain retries (router.WithNativeRetry):
// a failed attempt is rejected, the quorum queue holds it back min × its delivery count,
// and nothing goes through the delay cascade; what the queue cannot carry still does.
func TestNativeRetryOn43(t *testing.T) {
	testenv.Require43(t)
	e := quorumEnv(t)
	queue := e.newQueue(t, "test.native43")
	var (
		log      attemptLog
		cascadeM sync.Mutex
		cascade  = map[string]int{} // hand-offs through the cascade, per message
	)
	viaCascade := steptest.DelayerFunc(func(ctx context.Context, q string, d time.Duration, m *message.Message) error {
		cascadeM.Lock()
		cascade[m.UUID]++
		cascadeM.Unlock()
		return e.amqp.Delay(ctx, q, d, m)
	})
	outcomes := &steptest.Observer{}
	succeeded := make(chan string, 8)
	stack := start(t, e, router.Config{Retry: retry.Config{MaxRetries: 3, Delayer: viaCascade, Observer: outcomes}}, func(s *router.Stack) {
		require.NoError(t, s.Handle("payments", queue, func(m *message.Message) error {
			n := log.add(m.UUID)
			switch {
			case m.UUID == "flaky" && n <= 2:
				return errors.New("gateway: 503")
			case m.UUID == "broken":
				return errors.New("gateway: 503")
			case m.UUID == "declined":
				return sluice.Permanent(errors.New("insufficient balance"))
			case m.UUID == "limited" && n == 1:
				return sluice.RetryAfter(300*time.Millisecond, errors.New("gateway: 429"))
			}
			succeeded <- m.UUID
			return nil
		}, router.WithNativeRetry(nativeMin, nativeMax)))
	})
	for _, id := range []string{"flaky", "broken", "declined", "limited"} {
		e.publish(t, queue, message.NewMessage(id, []byte(`{"amount":100}`)))
	}
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case id := <-succeeded:
			got[id] = true
		case <-time.After(30 * time.Second):
			t.Fatalf("handled so far: %v", got)
		}
	}
	require.Eventually(t, func() bool { return e.count(t, topology.DLQ(queue)) == 2 }, 30*time.Second, 20*time.Millisecond,
		"broken and declined dead-lettered")

	// flaky: two retries, each held back by the queue min × its delivery count.
	flaky := log.times("flaky")
	require.Len(t, flaky, 3)
	for i := 1; i < len(flaky); i++ {
		assert.GreaterOrEqual(t, flaky[i].Sub(flaky[i-1]), time.Duration(i)*nativeMin-nativeSlack, "retry %d held back min × %d", i, i)
	}
	// broken: MaxRetries 3 retries, then the DLQ with the count and the last error.
	broken := log.times("broken")
	require.Len(t, broken, 4, "the first attempt and 3 retries")
	for i := 1; i < len(broken); i++ {
		assert.GreaterOrEqual(t, broken[i].Sub(broken[i-1]), min(time.Duration(i)*nativeMin, nativeMax)-nativeSlack)
	}
	assert.Len(t, log.times("declined"), 1, "a permanent failure is not retried")
	assert.Len(t, log.times("limited"), 2)

	cascadeM.Lock()
	assert.Equal(t, map[string]int{"limited": 1}, cascade, "only the Retry-After wait went through the cascade")
	cascadeM.Unlock()

	dead := map[string]*message.Message{}
	for _, m := range e.dlq(t, queue) {
		dead[m.UUID] = m
	}
	require.Contains(t, dead, "broken")
	assert.Equal(t, "3", dead["broken"].Metadata.Get(sluice.HeaderRetryCount), "the record counts the queue's retries")
	assert.Equal(t, "retries exhausted after 3 retries: gateway: 503", dead["broken"].Metadata.Get(sluice.HeaderErrorMessage))
	require.Contains(t, dead, "declined")
	assert.Equal(t, "0", dead["declined"].Metadata.Get(sluice.HeaderRetryCount))

	// Observers see each native retry as the retry it is, with the queue's delay.
	var retries []time.Duration
	for _, o := range outcomes.All() {
		if o.MessageID == "broken" && o.Disposition.Kind == disposition.Retry {
			retries = append(retries, o.Disposition.Delay)
		}
	}
	assert.Equal(t, []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 600 * time.Millisecond}, retries)

	// The policy an operator reads (GET /debug/sluice/policy) is the queue's schedule.
	desc := stack.Describe()
	require.Len(t, desc.Handlers, 1)
	pol := desc.Handlers[0].Retry
	require.NotNil(t, pol.Native)
	assert.Equal(t, policy.NativeRetryPolicy{Min: policy.Duration(nativeMin), Max: policy.Duration(nativeMax)}, *pol.Native)
	var schedule []time.Duration
	for _, r := range pol.Schedule {
		schedule = append(schedule, time.Duration(r.Delay))
	}
	assert.Equal(t, []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 600 * time.Millisecond}, schedule)
	assert.Contains(t, desc.Markdown(), "held back by the queue (native delayed retry)")

	// The schedule lives in the queue's arguments: declaring it with another one is refused
	// with the argument named.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	err := e.amqp.DeclareNativeRetryQueue(ctx, queue, broker.NativeRetry{Min: 100 * time.Millisecond, Max: nativeMax, MaxRetries: 3})
	var ineq *amqp.InequivalentError
	require.ErrorAs(t, err, &ineq)
	assert.Equal(t, "x-delayed-retry-min", ineq.Argument)
	t.Logf("RabbitMQ %s: flaky retried after %v and %v; broken after %v; cascade hand-offs %v",
		testenv.Version(), flaky[1].Sub(flaky[0]).Round(time.Millisecond), flaky[2].Sub(flaky[1]).Round(time.Millisecond),
		gaps(broken), cascade)
}

func gaps(ts []time.Time) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(ts); i++ {
		out = append(out, ts[i].Sub(ts[i-1]).Round(time.Millisecond))
	}
	return out
}

// WithNativeRetry is refused, with what is missing named, wherever the broker or the
// handler's other options cannot carry it; nothing is declared half-way.
func TestNativeRetryRefused(t *testing.T) {
	noop := func(*message.Message) error { return nil }
	t.Run("the embedded broker has none", func(t *testing.T) {
		e := memoryEnv(t)
		s, err := router.New(e.broker, router.Config{Logger: testLogger()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		err = s.Handle("payments", "payments", noop, router.WithNativeRetry(nativeMin, nativeMax))
		require.ErrorIs(t, err, router.ErrInvalidOption)
		assert.Contains(t, err.Error(), "memory broker has no native delayed retry")
	})
	t.Run("options it cannot be combined with, and an invalid schedule", func(t *testing.T) {
		e := quorumEnv(t)
		s, err := router.New(e.broker, router.Config{Logger: testLogger()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		err = s.Handle("a", "a", noop, router.WithNativeRetry(nativeMin, nativeMax), router.WithPartitions(4))
		require.ErrorIs(t, err, router.ErrInvalidOption)
		err = s.Handle("b", "b", noop, router.WithNativeRetry(nativeMax, nativeMin))
		require.ErrorIs(t, err, router.ErrInvalidOption)
		require.ErrorIs(t, err, broker.ErrNativeRetry)
		assert.Contains(t, err.Error(), "Max 200ms is below Min 1s")
	})
	refusedAtRun := func(t *testing.T, e *env, cfg router.Config, want string) {
		t.Helper()
		queue := e.newQueue(t, "test.native.refused")
		cfg.Logger = testLogger()
		// Close must not wait for handlers that never started: a CloseTimeout it would
		// wait out shows as a test that never ends.
		cfg.CloseTimeout = time.Hour
		s, err := router.New(e.broker, cfg)
		require.NoError(t, err)
		require.NoError(t, s.Handle("payments", queue, noop, router.WithNativeRetry(nativeMin, nativeMax)))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = s.Run(ctx)
		require.ErrorIs(t, err, broker.ErrNativeRetry)
		assert.Contains(t, err.Error(), want)
		assert.Equal(t, -1, e.rabbit.Count(queue), "the queue was not declared")
		closed := make(chan error, 1)
		go func() { closed <- s.Close() }()
		select {
		case err := <-closed:
			require.NoError(t, err)
		case <-time.After(time.Minute):
			t.Fatal("Close after a failed Run waited for handlers that never started")
		}
	}
	t.Run("classic queues", func(t *testing.T) {
		refusedAtRun(t, rabbitEnv(t), router.Config{}, "it needs quorum queues (Config.QueueType is classic)")
	})
	t.Run("retries reaching the delivery limit", func(t *testing.T) {
		refusedAtRun(t, quorumEnv(t), router.Config{Retry: retry.Config{MaxRetries: 20}}, "MaxRetries 20 must be below Config.DeliveryLimit 20")
	})
	if !testenv.Is43() {
		t.Run("a RabbitMQ older than 4.3", func(t *testing.T) {
			refusedAtRun(t, quorumEnv(t), router.Config{}, "it needs RabbitMQ 4.3 or later, the node is \"3.10")
		})
	}
}

// A message given back unprocessed (a basic.nack: the breaker's pause, a stopping consumer)
// is not a failed delivery: a queue with native delayed retry hands it out again at once,
// and it uses no attempt.
func TestNativeRetryOn43_UnprocessedReturnsAreNotHeldBack(t *testing.T) {
	testenv.Require43(t)
	e := quorumEnv(t)
	queue := e.newQueue(t, "test.native43.unprocessed")
	const hold = 3 * time.Second // what a rejection would wait
	var log attemptLog
	outcomes := &steptest.Observer{}
	done := make(chan struct{})
	start(t, e, router.Config{Retry: retry.Config{MaxRetries: 3, Observer: outcomes}}, func(s *router.Stack) {
		require.NoError(t, s.Handle("payments", queue, func(m *message.Message) error {
			if log.add(m.UUID) <= 2 {
				return markers.ReturnUnprocessed(errors.New("gateway breaker open: handler paused"))
			}
			close(done)
			return nil
		}, router.WithNativeRetry(hold, hold)))
	})
	e.publish(t, queue, message.NewMessage("paused", []byte(`{"amount":100}`)))
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("not handled; attempts %d", len(log.times("paused")))
	}
	ts := log.times("paused")
	require.Len(t, ts, 3)
	assert.Less(t, ts[2].Sub(ts[0]), hold, "two unprocessed returns came back before one rejection would have")
	for _, o := range outcomes.All() {
		assert.NotEqual(t, disposition.Retry, o.Disposition.Kind, "no attempt used")
	}
	t.Logf("RabbitMQ %s: returned unprocessed twice, back after %v", testenv.Version(), gaps(ts))
}

// A native retry is rejected back to its queue and comes back with the headers it first
// had, so no header carries its hand-off: the instance that rejected it remembers the
// rejection's span, and Jaeger shows the message's attempts as one chain, each retry's
// "reject <queue>" settle span with the queue's delay between the attempt that failed and
// the next, even for a message whose producer sent no trace context.
func TestNativeRetryOn43_AttemptsAreOneTraceInJaeger(t *testing.T) {
	testenv.Require43(t)
	e := quorumEnv(t)
	ts := newTracingStack(t, false)
	queue := e.newQueue(t, "test.native43.traced")
	var log attemptLog
	start(t, e, router.Config{Telemetry: ts.tel, Retry: retry.Config{MaxRetries: 3}}, func(s *router.Stack) {
		require.NoError(t, s.Handle("payments", queue, func(m *message.Message) error {
			if n := log.add(m.UUID); n <= 2 {
				return fmt.Errorf("gateway: 503 on attempt %d", n)
			}
			return nil
		}, router.WithNativeRetry(nativeMin, nativeMax)))
	})
	// Published without a traceparent: the first attempt starts the trace.
	msg := message.NewMessage("native-"+testenv.Name("m"), []byte(`{"amount":100}`))
	e.publish(t, queue, msg)

	reject := "reject " + queue
	tr := ts.awaitTrace(t, msg.UUID, func(spans []jaeger.Span) bool {
		return countNamed(spans, "process "+queue) == 3 && countNamed(spans, reject) == 2
	})
	attempts := byAttempt(tr.Named("process " + queue))
	rejects := tr.Named(reject) // in start order
	require.Len(t, attempts, 3)
	require.Len(t, rejects, 2)
	assert.Equal(t, []jaeger.Span{attempts[0]}, tr.Roots(), "one root: the first attempt")
	assert.Empty(t, tr.Named("send sluice.delay"), "nothing crossed the delay cascade")
	for i, a := range attempts {
		assert.Equal(t, int64(i+1), a.Tags["sluice.attempt"], "attempt %d: sluice.attempt", i+1)
		if i == 0 {
			continue
		}
		r := rejects[i-1]
		assert.Equal(t, "client", r.Kind(), "rejection %d: a settlement", i)
		assert.Equal(t, attempts[i-1].SpanID, r.ParentSpanID, "rejection %d: child of attempt %d", i, i)
		assert.Equal(t, int64(i)*nativeMin.Milliseconds(), r.Tags["sluice.retry.delay_ms"], "rejection %d: the queue's delay", i)
		assert.Equal(t, "settle", r.TagString("messaging.operation.type"))
		assert.Equal(t, r.SpanID, a.ParentSpanID, "attempt %d: child of rejection %d", i+1, i)
		assert.Equal(t, "retry", attempts[i-1].TagString("sluice.outcome"))
		assert.GreaterOrEqual(t, a.StartTime.Sub(r.StartTime.Add(r.Duration)), time.Duration(i)*nativeMin-nativeSlack,
			"attempt %d starts after the queue held the message back", i+1)
	}
	assert.Equal(t, "ack", attempts[2].TagString("sluice.outcome"))

	stdout, stderr, code := traceCLI(t, ts, "--service", ts.service, msg.UUID)
	require.Equal(t, 0, code, "sluice trace: stderr:\n%s\nstdout:\n%s", stderr, stdout)
	t.Logf("sluice trace %s:\n%s", msg.UUID, stdout)
	assert.Contains(t, stdout, "Outcome: ✓ ack after 3 attempts (2 retries)")
	assert.Equal(t, 2, strings.Count(stdout, "held back by "+queue), "a wait row per native retry:\n%s", stdout)
	assert.Contains(t, stdout, "native retry · delay 200ms")
	assert.Contains(t, stdout, "native retry · delay 400ms")
	assert.Len(t, attemptLines(stdout), 3)
}
