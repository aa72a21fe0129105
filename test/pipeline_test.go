package test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// pipelineRetry retries fast, so that a message that keeps failing reaches its DLQ in a
// fraction of a second.
func pipelineRetry(maxRetries int) retry.Config {
	return retry.Config{MaxRetries: maxRetries, InitialDelay: 20 * time.Millisecond, MaxDelay: 40 * time.Millisecond, Jitter: retry.NoJitter}
}

// runPlainRouter runs a Watermill router of the test's own, built by build, until the test
// ends.
func runPlainRouter(t *testing.T, build func(r *message.Router)) *message.Router {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	build(r)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select {
	case <-r.Running():
	case err := <-done:
		t.Fatalf("router stopped at start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("router did not start")
	}
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() {
			assert.NoError(t, r.Close())
			<-done
		})
	})
	return r
}

func newGuardT(t *testing.T) *idempotency.Guard {
	t.Helper()
	g, err := idempotency.New(idempotency.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close() })
	return g
}

func declare(t *testing.T, e *env, queues ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, q := range queues {
		require.NoError(t, e.broker.DeclareQueue(ctx, q))
	}
}

// An output publish that fails (the output queue does not exist, so RabbitMQ returns the
// mandatory message) must never let the key be marked done: the message is retried and
// then dead-lettered, not acked as a duplicate on its redelivery. Before, the idempotency
// step used in a plain router (r.AddMiddleware(g.Middleware(nil))) marked the key done
// before the router published, and the redelivery was acked as a duplicate: input, output
// and DLQ all ended empty.
func TestPipeline_UnroutableOutputIsRetriedNeverLost(t *testing.T) {
	const maxRetries = 2
	output := func(calls *atomic.Int64) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			calls.Add(1)
			return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("receipt"))}, nil
		}
	}
	tests := []struct {
		name string
		run  func(t *testing.T, e *env, q, outQ string, g *idempotency.Guard, calls *atomic.Int64)
	}{
		{name: "stack", run: func(t *testing.T, e *env, q, outQ string, g *idempotency.Guard, calls *atomic.Int64) {
			start(t, e, router.Config{Retry: pipelineRetry(maxRetries), Guard: g}, func(s *router.Stack) {
				require.NoError(t, s.HandleWithOutput("receipts", q, outQ, output(calls)))
			})
			// Run declared the output queue: take it away so the output is unroutable.
			ch, err := e.rabbit.Conn.Channel()
			require.NoError(t, err)
			_, err = ch.QueueDelete(outQ, false, false, false)
			require.NoError(t, err)
			require.NoError(t, ch.Close())
		}},
		{name: "plain router with router.Middlewares", run: func(t *testing.T, e *env, q, outQ string, g *idempotency.Guard, calls *atomic.Int64) {
			declare(t, e, q)
			mws, closeSteps, err := router.Middlewares(e.broker, router.Config{Logger: testLogger(), Retry: pipelineRetry(maxRetries), Guard: g})
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, closeSteps()) })
			runPlainRouter(t, func(r *message.Router) {
				r.AddMiddleware(mws...)
				r.AddHandler("receipts", q, e.broker.Subscriber(broker.SubscribeOptions{Concurrency: 1, Prefetch: 1}), outQ, e.amqp.Publisher(), output(calls))
			})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := rabbitEnv(t)
			q, outQ := e.newQueue(t, "unroutable"), testenv.Name("unroutable-out")
			e.rabbit.DeleteQueues(outQ)
			g := newGuardT(t)
			var calls atomic.Int64
			tt.run(t, e, q, outQ, g, &calls)

			e.publish(t, q, message.NewMessage(watermill.NewUUID(), []byte(`{"payment_id":"p-1"}`)))
			require.Eventually(t, func() bool { return e.count(t, topology.DLQ(q)) == 1 }, 30*time.Second, 20*time.Millisecond,
				"the message whose output could not be published is dead-lettered")
			dead := e.dlq(t, q)
			require.Len(t, dead, 1)
			assert.Contains(t, dead[0].Metadata.Get(sluice.HeaderErrorMessage), "unroutable")
			assert.Equal(t, int64(1+maxRetries), calls.Load(), "every attempt ran the handler: none was acked as a duplicate")
			assert.Zero(t, g.Stats().Hits, "no duplicate hit")
			assert.Equal(t, 0, e.count(t, q))
		})
	}
}

// The exact scenario: the idempotency step alone in a plain router, the router
// publishing the handler's output (to a queue that does not exist). The failed publish
// makes the router nack; the key must be released so that the redelivery runs the handler
// again, and the message stays in its queue, not acked as a duplicate.
func TestPipeline_IdempotencyAloneInPlainRouterKeepsTheMessage(t *testing.T) {
	e := rabbitEnv(t)
	q, outQ := e.newQueue(t, "idem-plain"), testenv.Name("idem-plain-out")
	declare(t, e, q)
	g := newGuardT(t)
	var calls atomic.Int64
	r := runPlainRouter(t, func(r *message.Router) {
		r.AddMiddleware(g.Middleware)
		r.AddHandler("receipts", q, e.broker.Subscriber(broker.SubscribeOptions{Concurrency: 1, Prefetch: 1}), outQ, e.amqp.Publisher(),
			func(msg *message.Message) ([]*message.Message, error) {
				calls.Add(1)
				return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("receipt"))}, nil
			})
	})
	e.publish(t, q, message.NewMessage(watermill.NewUUID(), []byte("order")))
	require.Eventually(t, func() bool { return calls.Load() >= 3 }, 30*time.Second, 20*time.Millisecond,
		"each redelivery runs the handler again")
	assert.Zero(t, g.Stats().Hits, "a redelivery after a failed output publish is not a duplicate")
	require.NoError(t, r.Close())
	require.Eventually(t, func() bool { return e.count(t, q) == 1 }, 30*time.Second, 50*time.Millisecond,
		"the message is back in its queue, not lost")
}

// Watermill's middleware composes with sluice's steps wherever it is added. A handler
// deadline (Watermill's Timeout around the steps, or inside them as Config.Middleware) is
// a retryable failure, and a Permanent error returned after the deadline is dead-lettered.
// Before, the retry step took the expired context for a shutdown: the message was nacked
// and redelivered again and again, never dead-lettered, with a false "consumer shutting
// down".
func TestPipeline_WatermillTimeoutIsAHandlerFailure(t *testing.T) {
	const maxRetries = 2
	const deadline = 100 * time.Millisecond
	refused := errors.New("refused after the deadline")
	waitForDeadline := func(calls *atomic.Int64, result func(ctx context.Context) error) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			calls.Add(1)
			select {
			case <-msg.Context().Done():
			case <-time.After(10 * time.Second):
				return nil, errors.New("no deadline reached the handler")
			}
			return nil, result(msg.Context())
		}
	}
	permanent := func(context.Context) error { return sluice.Permanent(refused) }
	ctxErr := func(ctx context.Context) error { return ctx.Err() }
	tests := []struct {
		name      string
		around    bool // Watermill's Timeout around sluice's steps (plain router); else inside (stack)
		result    func(ctx context.Context) error
		wantCalls int64
		wantError string
	}{
		{name: "Timeout around the steps, permanent error", around: true, result: permanent, wantCalls: 1, wantError: refused.Error()},
		{name: "Timeout around the steps, deadline exceeded", around: true, result: ctxErr, wantCalls: 1 + maxRetries, wantError: context.DeadlineExceeded.Error()},
		{name: "Timeout inside the steps, permanent error", result: permanent, wantCalls: 1, wantError: refused.Error()},
		{name: "Timeout inside the steps, deadline exceeded", result: ctxErr, wantCalls: 1 + maxRetries, wantError: context.DeadlineExceeded.Error()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := rabbitEnv(t)
			q := e.newQueue(t, "wm-timeout")
			var calls atomic.Int64
			h := waitForDeadline(&calls, tt.result)
			if tt.around {
				declare(t, e, q)
				mws, closeSteps, err := router.Middlewares(e.broker, router.Config{Logger: testLogger(), Retry: pipelineRetry(maxRetries)})
				require.NoError(t, err)
				t.Cleanup(func() { assert.NoError(t, closeSteps()) })
				runPlainRouter(t, func(r *message.Router) {
					r.AddMiddleware(wmiddleware.Timeout(deadline))
					r.AddMiddleware(mws...)
					r.AddNoPublisherHandler("h", q, e.broker.Subscriber(broker.SubscribeOptions{Concurrency: 1, Prefetch: 1}), func(m *message.Message) error {
						_, err := h(m)
						return err
					})
				})
			} else {
				start(t, e, router.Config{Retry: pipelineRetry(maxRetries), Middleware: []message.HandlerMiddleware{wmiddleware.Timeout(deadline)}},
					func(s *router.Stack) {
						require.NoError(t, s.Handle("h", q, func(m *message.Message) error {
							_, err := h(m)
							return err
						}))
					})
			}
			e.publish(t, q, message.NewMessage(watermill.NewUUID(), []byte("slow")))
			require.Eventually(t, func() bool { return e.count(t, topology.DLQ(q)) == 1 }, 30*time.Second, 20*time.Millisecond, "dead-lettered")
			dead := e.dlq(t, q)
			require.Len(t, dead, 1)
			assert.Contains(t, dead[0].Metadata.Get(sluice.HeaderErrorMessage), tt.wantError)
			assert.NotContains(t, dead[0].Metadata.Get(sluice.HeaderErrorMessage), "shutting down")
			assert.Equal(t, tt.wantCalls, calls.Load(), "no nack loop: one call per attempt")
		})
	}
}

// Recoverer, CorrelationID and Throttle, inside sluice's steps (Config.Middleware) and
// around them (a plain router's own middleware before router.Middlewares).
func TestPipeline_WatermillMiddlewareComposes(t *testing.T) {
	const maxRetries = 1
	type setup struct {
		user   []message.HandlerMiddleware
		around bool
	}
	tests := []struct {
		name  string
		setup setup
		// handler's behaviour and what to check
		handler func(calls *atomic.Int64) message.HandlerFunc
		check   func(t *testing.T, e *env, q, outQ string, calls *atomic.Int64)
	}{
		{
			name:  "Recoverer inside: a panic is retried and dead-lettered",
			setup: setup{user: []message.HandlerMiddleware{wmiddleware.Recoverer}},
			handler: func(calls *atomic.Int64) message.HandlerFunc {
				return func(*message.Message) ([]*message.Message, error) { calls.Add(1); panic("boom") }
			},
			check: func(t *testing.T, e *env, q, _ string, calls *atomic.Int64) {
				require.Eventually(t, func() bool { return e.count(t, topology.DLQ(q)) == 3 }, 30*time.Second, 20*time.Millisecond)
				assert.Equal(t, int64(3*(1+maxRetries)), calls.Load())
			},
		},
		{
			name:  "Recoverer around: a panic is retried and dead-lettered",
			setup: setup{user: []message.HandlerMiddleware{wmiddleware.Recoverer}, around: true},
			handler: func(calls *atomic.Int64) message.HandlerFunc {
				return func(*message.Message) ([]*message.Message, error) { calls.Add(1); panic("boom") }
			},
			check: func(t *testing.T, e *env, q, _ string, calls *atomic.Int64) {
				require.Eventually(t, func() bool { return e.count(t, topology.DLQ(q)) == 3 }, 30*time.Second, 20*time.Millisecond)
				assert.Equal(t, int64(3*(1+maxRetries)), calls.Load())
			},
		},
		{
			name:    "CorrelationID inside: outputs carry the input's correlation id",
			setup:   setup{user: []message.HandlerMiddleware{wmiddleware.CorrelationID}},
			handler: receiptHandler,
			check:   checkCorrelated,
		},
		{
			name:    "CorrelationID around, plain router: outputs published by sluice's step are unchanged",
			setup:   setup{user: []message.HandlerMiddleware{wmiddleware.CorrelationID}, around: true},
			handler: receiptHandler,
			check: func(t *testing.T, e *env, _, outQ string, calls *atomic.Int64) {
				require.Eventually(t, func() bool { return e.count(t, outQ) == 3 }, 30*time.Second, 20*time.Millisecond)
				assert.Equal(t, int64(3), calls.Load())
			},
		},
		{
			name:    "Throttle inside: calls are spaced",
			setup:   setup{user: []message.HandlerMiddleware{wmiddleware.NewThrottle(20, time.Second).Middleware}},
			handler: receiptHandler,
			check:   checkThrottled,
		},
		{
			name:    "Throttle around: calls are spaced",
			setup:   setup{user: []message.HandlerMiddleware{wmiddleware.NewThrottle(20, time.Second).Middleware}, around: true},
			handler: receiptHandler,
			check:   checkThrottled,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			throttleTimes = &calls{}
			e := rabbitEnv(t)
			q, outQ := e.newQueue(t, "wm-compose"), testenv.Name("wm-compose-out")
			e.rabbit.DeleteQueues(outQ)
			var calls atomic.Int64
			h := tt.handler(&calls)
			if tt.setup.around {
				declare(t, e, q, outQ)
				mws, closeSteps, err := router.Middlewares(e.broker, router.Config{Logger: testLogger(), Retry: pipelineRetry(maxRetries)})
				require.NoError(t, err)
				t.Cleanup(func() { assert.NoError(t, closeSteps()) })
				runPlainRouter(t, func(r *message.Router) {
					r.AddMiddleware(tt.setup.user...)
					r.AddMiddleware(mws...)
					r.AddHandler("h", q, e.broker.Subscriber(broker.SubscribeOptions{Concurrency: 1, Prefetch: 1}), outQ, e.amqp.Publisher(), h)
				})
			} else {
				start(t, e, router.Config{Retry: pipelineRetry(maxRetries), Middleware: tt.setup.user}, func(s *router.Stack) {
					require.NoError(t, s.HandleWithOutput("h", q, outQ, h))
				})
			}
			for i := range 3 {
				m := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "order-%d", i))
				wmiddleware.SetCorrelationID(fmt.Sprintf("corr-%d", i), m)
				e.publish(t, q, m)
			}
			tt.check(t, e, q, outQ, &calls)
		})
	}
}

// receiptHandler records its call times through calls and returns one output.
func receiptHandler(calls *atomic.Int64) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		calls.Add(1)
		throttleTimes.add(msg)
		return []*message.Message{message.NewMessage(watermill.NewUUID(), append([]byte("receipt-"), msg.Payload...))}, nil
	}
}

// throttleTimes records the handler's call times of the throttle cases (one runs at a time).
var throttleTimes = &calls{}

func checkCorrelated(t *testing.T, e *env, _, outQ string, _ *atomic.Int64) {
	require.Eventually(t, func() bool { return e.count(t, outQ) == 3 }, 30*time.Second, 20*time.Millisecond)
	seen := map[string]string{}
	for range 3 {
		d, ok := e.rabbit.Get(outQ)
		require.True(t, ok)
		seen[string(d.Body)] = fmt.Sprint(d.Headers[wmiddleware.CorrelationIDMetadataKey])
	}
	assert.Equal(t, map[string]string{"receipt-order-0": "corr-0", "receipt-order-1": "corr-1", "receipt-order-2": "corr-2"}, seen)
}

func checkThrottled(t *testing.T, e *env, _, outQ string, _ *atomic.Int64) {
	require.Eventually(t, func() bool { return e.count(t, outQ) == 3 }, 30*time.Second, 20*time.Millisecond)
	gaps := throttleTimes.gaps()
	require.Len(t, gaps, 2)
	// 20 a second is one per 50ms. The throttle's ticker keeps one tick while no message
	// waits, so two calls may come close together, never three.
	assert.GreaterOrEqual(t, gaps[0]+gaps[1], 45*time.Millisecond, "calls %v apart", gaps)
}

// watermill-amqp's own subscriber consumes a queue sluice declared, behind sluice's retry
// and dead-letter steps in a plain router: retried messages come back carrying x-death,
// which watermill-amqp's default marshaler cannot read (it nacked them in a loop, 9,173
// times in 5s); with amqp.WatermillConfig each message is delivered once per attempt, the
// failing one ends in the DLQ and the other succeeds on its retry.
func TestPipeline_WatermillAMQPSubscriber(t *testing.T) {
	const maxRetries = 3
	e := rabbitEnv(t)
	q := e.newQueue(t, "wamqp")
	declare(t, e, q)

	t.Run("the default marshaler is refused", func(t *testing.T) {
		_, err := amqp.NewWatermillSubscriber(wamqp.NewDurableQueueConfig(e.rabbit.URL), watermill.NopLogger{})
		assert.ErrorContains(t, err, "must use sluice's marshaler")
		assert.ErrorContains(t, err, "Config.Marshaler = amqp.Marshaler{}")
	})

	sub, err := amqp.NewWatermillSubscriber(amqp.WatermillConfig(e.rabbit.URL), watermill.NopLogger{})
	require.NoError(t, err)
	mws, closeSteps, err := router.Middlewares(e.broker, router.Config{Logger: testLogger(), Retry: pipelineRetry(maxRetries)})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, closeSteps()) })
	var mu sync.Mutex
	deliveries := map[string]int{}
	runPlainRouter(t, func(r *message.Router) {
		r.AddMiddleware(mws...)
		r.AddNoPublisherHandler("h", q, sub, func(msg *message.Message) error {
			mu.Lock()
			deliveries[string(msg.Payload)]++
			n := deliveries[string(msg.Payload)]
			mu.Unlock()
			if string(msg.Payload) == "bad" || n == 1 {
				return errors.New("gateway down")
			}
			return nil
		})
	})
	e.publish(t, q, message.NewMessage(watermill.NewUUID(), []byte("bad")))
	e.publish(t, q, message.NewMessage(watermill.NewUUID(), []byte("good")))
	require.Eventually(t, func() bool { return e.count(t, topology.DLQ(q)) == 1 }, 30*time.Second, 20*time.Millisecond)
	// A nack loop would keep counting.
	assert.Never(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return deliveries["bad"] > 1+maxRetries || deliveries["good"] > 2
	}, 300*time.Millisecond, 10*time.Millisecond)
	mu.Lock()
	got := map[string]int{"bad": deliveries["bad"], "good": deliveries["good"]}
	mu.Unlock()
	assert.Equal(t, map[string]int{"bad": 1 + maxRetries, "good": 2}, got, "one delivery per attempt, no nack loop")
	dead := e.dlq(t, q)
	require.Len(t, dead, 1)
	assert.Equal(t, "bad", string(dead[0].Payload))
	assert.Equal(t, 0, e.count(t, q))
}

// Publishing to a handler's queue before Run: refused with an error naming the missing
// queue and what to do, and accepted once Stack.Declare declared it.
func TestPipeline_PublishBeforeRun(t *testing.T) {
	e := rabbitEnv(t)
	q := e.newQueue(t, "before-run")
	s, err := router.New(e.broker, router.Config{Logger: testLogger()})
	require.NoError(t, err)
	var handled atomic.Int64
	require.NoError(t, s.Handle("h", q, func(*message.Message) error { handled.Add(1); return nil }))

	err = broker.QueuePublisher(e.broker).Publish(q, message.NewMessage(watermill.NewUUID(), []byte("early")))
	require.ErrorIs(t, err, amqp.ErrUnroutable)
	assert.ErrorContains(t, err, fmt.Sprintf("no queue %q", q))
	assert.ErrorContains(t, err, "Stack.Declare")

	declareCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, s.Declare(declareCtx))
	require.NoError(t, broker.QueuePublisher(e.broker).Publish(q, message.NewMessage(watermill.NewUUID(), []byte("early"))))

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { _ = s.Close(); stop(); <-done })
	require.Eventually(t, func() bool { return handled.Load() == 1 }, 30*time.Second, 20*time.Millisecond, "the early message is handled once Run starts")
}
