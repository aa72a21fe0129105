package test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/demo/paymentsim"
	"github.com/sluice-go/sluice/internal/stackview"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// The scale-to-zero set-up, as deploy/keda runs it: a scaler polls the queue's length every
// pollEvery (KEDA's pollingInterval; a passive queue.declare, as KEDA's RabbitMQ scaler
// does over AMQP) and starts an instance when it is above zero; the instance runs until it
// has been idle for stopWhenIdle (PAYMENTS_STOP_WHEN_IDLE) and exits.
const (
	pollEvery    = time.Second
	stopWhenIdle = 500 * time.Millisecond
	// retryDelay is every retry's delay but a rate limit's (paymentsim.RateLimitRetryAfter):
	// longer than an instance takes to go idle and exit, so each retry is due while none runs.
	retryDelay = 5 * time.Second
)

// zeroScaler is a KEDA-like scaler of in-process payment service instances. Each instance
// is what `payments serve` with PAYMENTS_STOP_WHEN_IDLE builds: its own connection, its
// own idempotency store restored from the journal, its own stack; they share the simulated
// gateway, the remote system that says whether a payment was charged twice.
type zeroScaler struct {
	r             *testenv.Rabbit
	queue, output string
	gateway       *example_payment.Gateway

	mu        sync.Mutex
	running   bool
	instances []*instanceRun
	// attempts are the handler's calls per message id: when, and in which instance.
	attempts map[string][]attemptAt
	// due is when each message id's retry was due: its hand-off's confirm plus its delay.
	due  map[string]time.Time
	errs []error
}

// instanceRun is one instance's life.
type instanceRun struct {
	started, consuming, exited time.Time
	restoredKeys               int64
	restore                    time.Duration
}

type attemptAt struct {
	at       time.Time
	instance int
}

// instance runs one instance until it stops by itself; ctx bounds it in case it never does.
func (z *zeroScaler) instance(ctx context.Context, idx int) {
	run := &instanceRun{started: time.Now()}
	z.mu.Lock()
	z.instances = append(z.instances, run)
	z.mu.Unlock()
	fail := func(err error) {
		z.mu.Lock()
		z.errs = append(z.errs, fmt.Errorf("instance %d: %w", idx, err))
		z.mu.Unlock()
	}
	defer func() {
		z.mu.Lock()
		run.exited, z.running = time.Now(), false
		z.mu.Unlock()
	}()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{z.r.URL}, Logger: testLogger()})
	if err != nil {
		fail(err)
		return
	}
	defer func() { _ = b.Close() }()
	guard, err := idempotency.New(idempotency.Config{Logger: testLogger()})
	if err != nil {
		fail(err)
		return
	}
	defer func() { _ = guard.Close() }() // before the broker's, as cmd/payments closes them
	s, err := router.New(b, router.Config{
		Guard:       guard,
		Logger:      testLogger(),
		Concurrency: 4,
		Retry: retry.Config{MaxRetries: 3, InitialDelay: retryDelay, MaxDelay: retryDelay, Jitter: retry.NoJitter,
			OnRetry: func(e retry.Event) {
				z.mu.Lock()
				z.due[e.MessageID] = time.Now().Add(e.Delay)
				z.mu.Unlock()
			}},
		StopWhenIdle: stopWhenIdle,
	})
	if err != nil {
		fail(err)
		return
	}
	h := example_payment.NewHandler(z.gateway)
	err = s.HandleWithOutput("payments", z.queue, z.output, func(m *message.Message) ([]*message.Message, error) {
		z.mu.Lock()
		z.attempts[m.UUID] = append(z.attempts[m.UUID], attemptAt{at: time.Now(), instance: idx})
		z.mu.Unlock()
		return h.Handle(m)
	}, router.WithIdempotencyKey(example_payment.KeyFunc))
	if err != nil {
		fail(err)
		return
	}
	// The journal's figures, as otelsetup.Operate reads them for its metrics.
	v, _ := stackview.Of(s)
	// Started up: consuming, and the journal restored (messages wait for the restore).
	up := make(chan struct{})
	go func() {
		defer close(up)
		select {
		case <-s.Running():
		case <-ctx.Done():
			return
		}
		for ctx.Err() == nil {
			if st, _ := v.Journal(); st.Restoring == 0 {
				z.mu.Lock()
				run.consuming = time.Now()
				z.mu.Unlock()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	runCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err = s.Run(runCtx)
	<-up
	if st, ok := v.Journal(); ok {
		z.mu.Lock()
		run.restoredKeys, run.restore = st.Restored, st.RestoreDuration
		z.mu.Unlock()
	}
	switch {
	case err != nil:
		fail(fmt.Errorf("run: %w", err))
	case runCtx.Err() != nil:
		fail(fmt.Errorf("did not stop when idle: %w", runCtx.Err()))
	}
}

// scale polls the queue's length every pollEvery and starts an instance when it is above
// zero and none runs (one replica at most, as a ScaledObject with maxReplicaCount 1), until
// ctx ends; it returns once the last instance has exited.
func (z *zeroScaler) scale(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		z.mu.Lock()
		running := z.running
		z.mu.Unlock()
		if running || z.r.Count(z.queue) <= 0 {
			continue
		}
		z.mu.Lock()
		z.running = true
		idx := len(z.instances)
		z.mu.Unlock()
		wg.Go(func() { z.instance(ctx, idx) })
	}
}

// idle reports whether no instance runs and the queue is empty.
func (z *zeroScaler) idle() bool {
	z.mu.Lock()
	running := z.running
	z.mu.Unlock()
	return !running && z.r.Count(z.queue) == 0
}

// Issue 54, point 5: the payment service scaled to zero and back on the queue's length, with
// retries due while no instance runs and duplicates arriving for payments an earlier
// instance charged. Nothing is lost (every payment charged or dead-lettered, every success
// event in the output queue), nothing is charged twice (each instance restores the
// idempotency journal before it handles a message), and each retry is handled within its
// delay plus the polling interval plus the start-up time of the instance that handled it.
func TestScaleToZero_PaymentsOnRabbitMQ(t *testing.T) {
	r := testenv.NewRabbit(t)
	z := &zeroScaler{
		r:        r,
		queue:    testenv.Name("zero.payments.requested"),
		output:   testenv.Name("zero.payments.succeeded"),
		gateway:  &example_payment.Gateway{},
		attempts: map[string][]attemptAt{},
		due:      map[string]time.Time{},
	}
	r.DeleteQueues(z.queue, topology.DLQ(z.queue), z.output, topology.DLQ(z.output), topology.IdempotencyJournal(z.queue))
	declareOnly(t, r, z.queue, z.output)

	run := fmt.Sprintf("%d", time.Now().UnixNano()%1e9)
	type request struct{ id, source string }
	var requests []request
	for i := range 6 {
		requests = append(requests, request{fmt.Sprintf("pay_%s_visa_%d", run, i), "tok_visa"})
	}
	for i := range 3 {
		requests = append(requests, request{fmt.Sprintf("pay_%s_flaky_%d", run, i), paymentsim.FlakyToken(1)})
	}
	for i := range 2 {
		requests = append(requests, request{fmt.Sprintf("pay_%s_rate_%d", run, i), paymentsim.TokenRateLimited})
	}
	declined := fmt.Sprintf("pay_%s_declined", run)
	requests = append(requests, request{declined, paymentsim.TokenInsufficientFunds})
	publish := func(prefix string) {
		for _, req := range requests {
			r.Publish(z.queue, amqp091.Publishing{MessageId: prefix + req.id, ContentType: "application/json",
				DeliveryMode: amqp091.Persistent, Body: paymentBody(req.id, req.source)})
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	scaled := make(chan struct{})
	go func() { defer close(scaled); z.scale(ctx) }()
	defer func() { cancel(); <-scaled }()

	charges := len(requests) - 1
	publish("req-")
	require.Eventually(t, func() bool {
		return z.gateway.TotalCharges() >= charges && r.Count(topology.DLQ(z.queue)) >= 1 && z.idle()
	},
		90*time.Second, 50*time.Millisecond, "every request charged or dead-lettered, the service back at zero")
	// The same requests again, from a client that timed out: a new instance takes them,
	// and only its restored journal knows they were charged.
	phase2 := time.Now()
	publish("dup-")
	require.Eventually(t, func() bool {
		z.mu.Lock()
		var later bool
		for _, in := range z.instances {
			later = later || (in.started.After(phase2) && !in.exited.IsZero())
		}
		z.mu.Unlock()
		return later && z.idle()
	}, 90*time.Second, 50*time.Millisecond, "the duplicates taken, the service back at zero")
	cancel()
	<-scaled

	z.mu.Lock()
	defer z.mu.Unlock()
	require.Empty(t, z.errs, "instances")
	t.Run("nothing lost", func(t *testing.T) {
		assert.Equal(t, charges, r.Count(z.output), "success events")
		assert.Equal(t, 2, r.Count(topology.DLQ(z.queue)), "dead letters: the declined request and its duplicate")
		assert.Equal(t, 0, r.Count(z.queue), "left in the queue")
		for _, req := range requests {
			if req.id != declined {
				assert.Equal(t, 1, z.gateway.ChargeCount(req.id), "charges of %s", req.id)
			}
		}
	})
	t.Run("nothing charged twice", func(t *testing.T) {
		assert.Equal(t, charges, z.gateway.TotalCharges())
		for _, req := range requests {
			if req.id != declined {
				assert.Empty(t, z.attempts["dup-"+req.id], "the duplicate of %s reached the gateway", req.id)
			}
		}
		last := z.instances[len(z.instances)-1]
		assert.GreaterOrEqual(t, last.restoredKeys, int64(charges), "keys the last instance restored from the journal")
	})
	for i, in := range z.instances {
		require.False(t, in.consuming.IsZero(), "instance %d started up", i)
	}
	var lateness []time.Duration
	t.Run("every retry within its delay, the polling interval and the start-up time", func(t *testing.T) {
		fromZero := 0
		for id, due := range z.due {
			got := z.attempts[id]
			require.Len(t, got, 2, "attempts of %s", id)
			late := got[1].at.Sub(due)
			lateness = append(lateness, late)
			by := z.instances[got[1].instance]
			assert.GreaterOrEqual(t, late, -50*time.Millisecond, "%s retried before its delay", id)
			assert.LessOrEqual(t, late, pollEvery+by.consuming.Sub(by.started)+time.Second,
				"%s retried %s after it was due (start-up of its instance: %s)", id, late, by.consuming.Sub(by.started))
			if got[0].instance != got[1].instance && z.instances[got[0].instance].exited.Before(due) {
				fromZero++
			}
		}
		assert.Len(t, z.due, 5, "retries: 3 flaky, 2 rate-limited")
		assert.Positive(t, fromZero, "retries due while no instance ran")
	})
	slices.Sort(lateness)
	var starts []string
	for _, in := range z.instances {
		starts = append(starts, fmt.Sprintf("%s (restore %s, %d keys)", in.consuming.Sub(in.started).Round(time.Millisecond),
			in.restore.Round(time.Millisecond), in.restoredKeys))
	}
	t.Logf("scale to zero: %d instance starts; retry lateness (handled after due) %v; start-up per start (connect to consuming, journal restored) %v",
		len(z.instances), lateness, starts)
}

// declareOnly declares the payment service's queues with a stack that never runs, so that
// requests can be published before any instance starts.
func declareOnly(t *testing.T, r *testenv.Rabbit, queue, output string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{r.URL}, Logger: testLogger()})
	require.NoError(t, err)
	defer func() { _ = b.Close() }()
	s, err := router.New(b, router.Config{Logger: testLogger()})
	require.NoError(t, err)
	require.NoError(t, s.HandleWithOutput("payments", queue, output, func(*message.Message) ([]*message.Message, error) { return nil, nil }))
	require.NoError(t, s.Declare(ctx))
	require.NoError(t, s.Close())
}

// Issue 54, point 6: a retry waiting out its delay in the broker is not work in flight, on
// each broker: Run with StopWhenIdle returns while it waits (the queue reads empty), the
// retry comes back into the queue on time, and the next run handles it. On RabbitMQ the
// retry waits in the delay cascade (classic queues) or is held back by a quorum queue's
// native delayed retry (4.3); on the embedded broker it is a timer in this process, lost if
// the process exits.
func TestStopWhenIdle_RetriesWaitInTheBroker(t *testing.T) {
	const delay = 2 * time.Second
	for _, tc := range []struct {
		name string
		env  func(t *testing.T) *env
		opts []router.HandlerOption
	}{
		{name: "RabbitMQ, delay cascade", env: func(t *testing.T) *env { return rabbitEnv(t) }},
		{name: "RabbitMQ 4.3, native delayed retry", env: func(t *testing.T) *env {
			testenv.Require43(t)
			return quorumEnv(t)
		}, opts: []router.HandlerOption{router.WithNativeRetry(delay, delay)}},
		{name: "embedded broker", env: func(t *testing.T) *env { return memoryEnv(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.env(t)
			queue := e.newQueue(t, "test.idle.retry")
			var attempts atomic.Int64
			// run runs a stack until it stops by itself and returns how long it ran; publish,
			// when set, is sent once the queues are declared.
			run := func(publish *message.Message) time.Duration {
				t.Helper()
				s, err := router.New(e.broker, router.Config{
					Logger:       testLogger(),
					StopWhenIdle: 300 * time.Millisecond,
					Retry:        retry.Config{MaxRetries: 3, InitialDelay: delay, MaxDelay: delay, Jitter: retry.NoJitter},
				})
				require.NoError(t, err)
				require.NoError(t, s.Handle("work", queue, func(*message.Message) error {
					if attempts.Add(1) == 1 {
						return errors.New("gateway timeout")
					}
					return nil
				}, tc.opts...))
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				require.NoError(t, s.Declare(ctx))
				if publish != nil {
					e.publish(t, queue, publish)
				}
				start := time.Now()
				require.NoError(t, s.Run(ctx))
				require.NoError(t, ctx.Err(), "Run returned only because its context ended")
				return time.Since(start)
			}
			first := time.Now()
			took := run(message.NewMessage("m-1", []byte(`{}`)))
			assert.Less(t, took, delay, "the first run waited for the retry's delay")
			assert.EqualValues(t, 1, attempts.Load(), "attempts in the first run")
			assert.Equal(t, 0, ready(t, e, queue), "the waiting retry counted in the queue's length")

			require.Eventually(t, func() bool { return ready(t, e, queue) == 1 }, 30*time.Second, 20*time.Millisecond,
				"the retry came back into the queue")
			assert.GreaterOrEqual(t, time.Since(first), delay, "the retry came back before its delay")
			run(nil)
			assert.EqualValues(t, 2, attempts.Load(), "attempts after the second run")
			assert.Equal(t, 0, ready(t, e, queue), "left in the queue")
			assert.Empty(t, e.dlq(t, queue), "dead letters")
		})
	}
}

// ready is queue's length as the broker's depth reader gives it, and as KEDA's scaler
// reads it: ready messages, not a retry still waiting out its delay.
func ready(t *testing.T, e *env, queue string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := e.broker.QueueDepth(ctx, queue)
	require.NoError(t, err, "depth of %s", queue)
	return int(d.Ready)
}

// PAYMENTS_STOP_WHEN_IDLE makes `payments serve` a job: it handles what the queue holds,
// exits 0 once the queue has been empty that long, and leaves nothing behind it.
func TestPaymentsServeExitsWhenIdle(t *testing.T) {
	r := testenv.NewRabbit(t)
	queue, output := testenv.Name("idle.payments.requested"), testenv.Name("idle.payments.succeeded")
	r.DeleteQueues(queue, topology.DLQ(queue), output, topology.DLQ(output), topology.IdempotencyJournal(queue))
	declareOnly(t, r, queue, output)
	run := fmt.Sprintf("%d", time.Now().UnixNano()%1e9)
	for i := range 5 {
		id := fmt.Sprintf("pay_%s_%d", run, i)
		r.Publish(queue, amqp091.Publishing{MessageId: "req-" + id, ContentType: "application/json",
			DeliveryMode: amqp091.Persistent, Body: paymentBody(id, "tok_visa")})
	}
	testenv.Binary(t, "./cmd/payments") // built before the clock starts
	start := time.Now()
	svc := startPayments(t, append(fastPaymentsEnv(r.URL, queue, output), "PAYMENTS_STOP_WHEN_IDLE=500ms"))
	select {
	case err := <-svc.exited:
		require.NoError(t, err, "payments serve exits 0 when idle")
	case <-time.After(60 * time.Second):
		t.Fatal("payments serve did not exit once idle")
	}
	t.Logf("payments serve (race build) started, handled 5 payments and exited 500ms idle after them in %s", time.Since(start).Round(time.Millisecond))
	assert.Equal(t, 5, r.Count(output), "success events")
	assert.Equal(t, 0, r.Count(queue), "left in the queue")
	assert.Contains(t, svc.logs.String(), "nothing was in flight", "the service says why it stopped")
	svc.exited <- nil // for the cleanup, which waits for the exit
}
