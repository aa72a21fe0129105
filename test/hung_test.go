package test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/health"
	"github.com/sluice-go/sluice/internal/stackview"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// Issue 52: handlers that block without looking at their context. The stack stops waiting
// for such an attempt at HandlerTimeout plus AbandonGrace: it is a failed attempt, retried
// and dead-lettered like any other, the handler's slot goes on consuming, and Close keeps
// its CloseTimeout.

// stuckFrame is the function a hung handler blocks in; the dead letter's stack names it,
// and goleak lets its goroutines (the user's hung code) outlive Close.
const stuckFrame = "github.com/sluice-go/sluice/test.blockIgnoringContext"

// blockIgnoringContext blocks until release is closed, as a call without a deadline, a lock
// or a driver that ignores cancellation would.
func blockIgnoringContext(release <-chan struct{}) { <-release }

// hungPolicy is the issue's: HandlerTimeout 1s (and the default 1s grace), MaxRetries 2,
// short backoffs so that the test does not wait for them.
func hungPolicy() router.Config {
	return router.Config{
		Logger:         testLogger(),
		HandlerTimeout: time.Second,
		CloseTimeout:   5 * time.Second,
		Concurrency:    4,
		Retry:          retry.Config{MaxRetries: 2, InitialDelay: 100 * time.Millisecond, MaxDelay: 200 * time.Millisecond, Jitter: retry.NoJitter},
	}
}

// TestHung_DeadLetteredAmongGoodOnes: 1 and 4 (the handler's concurrency) messages whose
// handler hangs among 100 good ones. All 100 are handled, every hung one reaches Q.dlq after
// its retries with the stuck stack in its record, Close returns within CloseTimeout naming
// the handler, and no goroutine of sluice's own outlives it.
func TestHung_DeadLetteredAmongGoodOnes(t *testing.T) {
	for _, hung := range []int{1, 4} {
		t.Run(fmt.Sprintf("%d hung", hung), func(t *testing.T) {
			e := rabbitEnv(t)
			queue := e.newQueue(t, "test.hung")
			ignore := goleak.IgnoreCurrent()
			release := make(chan struct{})
			var releaseOnce sync.Once
			t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
			var good, hungCalls atomic.Int64
			cfg := hungPolicy()
			s, err := router.New(e.broker, cfg)
			require.NoError(t, err)
			require.NoError(t, s.Handle("payments", queue, func(m *message.Message) error {
				if string(m.Payload) == "hang" {
					hungCalls.Add(1)
					blockIgnoringContext(release)
					return nil
				}
				good.Add(1)
				return nil
			}))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ran := make(chan error, 1)
			go func() { ran <- s.Run(ctx) }()
			<-s.Running()

			begin := time.Now()
			for i := range hung {
				e.publish(t, queue, message.NewMessage(fmt.Sprintf("hung-%d", i), []byte("hang")))
			}
			for i := range 100 {
				e.publish(t, queue, message.NewMessage(fmt.Sprintf("good-%d", i), []byte("ok")))
			}
			var dead []*message.Message
			require.Eventually(t, func() bool {
				dead = append(dead, e.dlq(t, queue)...)
				return good.Load() == 100 && len(dead) == hung
			}, 60*time.Second, 50*time.Millisecond, "good handled %d of 100, dead-lettered %d of %d", good.Load(), len(dead), hung)
			t.Logf("%d hung among 100 good: hang to the last dead letter %s (HandlerTimeout 1s + grace 1s, 2 retries)", hung, time.Since(begin).Round(10*time.Millisecond))
			assert.EqualValues(t, 3*hung, hungCalls.Load(), "every hung message: its attempt and 2 retries, each abandoned")
			for _, m := range dead {
				assert.Equal(t, "sluice.handler_timeout", m.Metadata.Get(sluice.HeaderErrorType))
				assert.Equal(t, "retries_exhausted", m.Metadata.Get("x-dead-letter-reason"))
				assert.Contains(t, m.Metadata.Get(sluice.HeaderErrorMessage), "did not return and may still be running")
				assert.Contains(t, m.Metadata.Get(sluice.HeaderErrorStack), "blockIgnoringContext", "the record says where it was stuck")
				assert.Equal(t, "2", m.Metadata.Get(sluice.HeaderRetryCount))
			}
			assert.Zero(t, e.count(t, queue), "nothing left unacked")

			cancel()
			closing := time.Now()
			require.NoError(t, <-ran)
			err = s.Close()
			took := time.Since(closing)
			t.Logf("Run and Close returned in %s (CloseTimeout 5s) with %d abandoned goroutine(s) still running", took.Round(10*time.Millisecond), 3*hung)
			assert.Less(t, took, cfg.CloseTimeout, "Close keeps its CloseTimeout")
			require.ErrorIs(t, err, sluice.ErrHandlerTimeout)
			assert.Contains(t, err.Error(), "payments (")
			// The user's hung goroutines are the only ones left once the broker is closed
			// too: they run the handler and nothing of sluice's; everything else ended.
			require.NoError(t, e.amqp.Close())
			goleak.VerifyNone(t, ignore, goleak.IgnoreAnyFunction(stuckFrame))
			releaseOnce.Do(func() { close(release) })
		})
	}
}

// TestHung_CloseWhileHung: Close with every handler slot hung (HandlerTimeout 30s,
// CloseTimeout 2s) returns at CloseTimeout, names the handler, and gives the hung messages
// back to their queue unacked, with no attempt used; no goroutine of sluice's outlives it.
func TestHung_CloseWhileHung(t *testing.T) {
	e := rabbitEnv(t)
	queue := e.newQueue(t, "test.hung.close")
	ignore := goleak.IgnoreCurrent()
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	var hung atomic.Int64
	cfg := hungPolicy()
	cfg.HandlerTimeout, cfg.CloseTimeout = 30*time.Second, 2*time.Second
	s, err := router.New(e.broker, cfg)
	require.NoError(t, err)
	require.NoError(t, s.Handle("payments", queue, func(m *message.Message) error {
		hung.Add(1)
		blockIgnoringContext(release)
		return nil
	}))
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	<-s.Running()
	for i := range 4 {
		e.publish(t, queue, message.NewMessage(fmt.Sprintf("hung-%d", i), []byte("hang")))
	}
	require.Eventually(t, func() bool { return hung.Load() == 4 }, 20*time.Second, 10*time.Millisecond)

	begin := time.Now()
	cancel()
	require.NoError(t, <-ran)
	t.Logf("Run returned after %s", time.Since(begin))
	err = s.Close()
	took := time.Since(begin)
	t.Logf("Close with 4 attempts hung in flight returned in %s (CloseTimeout 2s)", took.Round(10*time.Millisecond))
	assert.GreaterOrEqual(t, took, cfg.CloseTimeout-100*time.Millisecond, "it waited for the attempts")
	assert.Less(t, took, cfg.CloseTimeout+2*time.Second, "then stopped waiting")
	require.ErrorIs(t, err, sluice.ErrHandlerTimeout)
	assert.Contains(t, err.Error(), "payments (4 abandoned attempt(s))")
	require.Eventually(t, func() bool { return e.count(t, queue) == 4 }, 10*time.Second, 20*time.Millisecond, "the hung messages are back in their queue")
	for range 4 {
		d, ok := e.rabbit.Get(queue)
		require.True(t, ok)
		assert.Nil(t, d.Headers[sluice.HeaderRetryCount], "given back without using an attempt")
	}
	require.NoError(t, e.amqp.Close())
	goleak.VerifyNone(t, ignore, goleak.IgnoreAnyFunction(stuckFrame))
}

// TestHung_LateReturn: a hung attempt that returns late, with success and with failure,
// behind the idempotency step with its journal. No retry runs the handler beside it
// (its retry copies fail as "still running"), a late success publishes its output once and
// its retry copy is acked as a duplicate, a late failure releases the key so the retry runs
// the handler: the payment is charged once and its event published once.
func TestHung_LateReturn(t *testing.T) {
	for _, tt := range []struct {
		name string
		late error
	}{
		{name: "success", late: nil},
		{name: "failure", late: errors.New("gateway refused")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := rabbitEnv(t)
			queue := e.newQueue(t, "test.hung.late")
			output := e.newQueue(t, "test.hung.late.out")
			guard, err := idempotency.New(idempotency.Config{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = guard.Close() })
			release := make(chan struct{})
			var releaseOnce sync.Once
			t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
			var calls, charges atomic.Int64
			cfg := hungPolicy()
			cfg.Guard = guard
			cfg.Retry = retry.Config{MaxRetries: 5, InitialDelay: 500 * time.Millisecond, MaxDelay: 500 * time.Millisecond, Jitter: retry.NoJitter}
			start(t, e, cfg, func(s *router.Stack) {
				require.NoError(t, s.HandleWithOutput("payments", queue, output, func(m *message.Message) ([]*message.Message, error) {
					if calls.Add(1) == 1 {
						blockIgnoringContext(release)
						if tt.late != nil {
							return nil, tt.late
						}
					}
					charges.Add(1)
					return []*message.Message{message.NewMessage("charged-"+m.UUID, []byte("charged"))}, nil
				}))
			})
			e.publish(t, queue, message.NewMessage("pay-late", []byte("charge")))
			// Abandoned at ~2s; its retry copies at ~2.5s and ~3.5s find the key held.
			time.Sleep(4 * time.Second)
			assert.EqualValues(t, 1, calls.Load(), "no retry ran the handler beside the abandoned attempt")
			releaseOnce.Do(func() { close(release) })
			require.Eventually(t, func() bool { return e.count(t, output) == 1 && charges.Load() == 1 }, 30*time.Second, 50*time.Millisecond)
			// Every retry copy still in the delay has come back by now.
			require.Eventually(t, func() bool { return e.count(t, queue) == 0 }, 30*time.Second, 50*time.Millisecond)
			time.Sleep(time.Second)
			assert.EqualValues(t, 1, charges.Load(), "charged once")
			assert.Equal(t, 1, e.count(t, output), "one output event")
			assert.Empty(t, e.dlq(t, queue), "nothing dead-lettered")
		})
	}
}

// TestHung_BoundPausesAndReadyzNamesTheHandler: at MaxAbandoned abandoned attempts still
// running, the handler stops taking messages and /readyz answers 503 naming it and since
// when; once they return it consumes again and is ready.
func TestHung_BoundPausesAndReadyzNamesTheHandler(t *testing.T) {
	e := rabbitEnv(t)
	queue := e.newQueue(t, "test.hung.bound")
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	// The readiness otelsetup.Operate serves: the stack's pauses.
	var ready health.Health
	srv := httptest.NewServer(ready.ReadinessHandler())
	t.Cleanup(srv.Close)
	cfg := hungPolicy()
	cfg.MaxAbandoned, cfg.Concurrency = 2, 2
	cfg.Retry = retry.Config{MaxRetries: 2, InitialDelay: time.Hour, MaxDelay: time.Hour} // the retries stay away
	var good atomic.Int64
	s := start(t, e, cfg, func(s *router.Stack) {
		require.NoError(t, s.Handle("payments", queue, func(m *message.Message) error {
			if string(m.Payload) == "hang" {
				blockIgnoringContext(release)
				return nil
			}
			good.Add(1)
			return nil
		}))
	})
	v, _ := stackview.Of(s)
	ready.AddPauses(v.Pauses)
	e.publish(t, queue, message.NewMessage("h1", []byte("hang")))
	e.publish(t, queue, message.NewMessage("h2", []byte("hang")))
	var body string
	require.Eventually(t, func() bool {
		code, b := get(t, srv.URL)
		body = b
		return code == http.StatusServiceUnavailable
	}, 20*time.Second, 50*time.Millisecond)
	assert.Contains(t, body, "handler payments")
	assert.Contains(t, body, "stuck since")
	assert.Contains(t, body, "2 abandoned attempts still running (MaxAbandoned 2)")
	e.publish(t, queue, message.NewMessage("g1", []byte("ok")))
	time.Sleep(time.Second)
	assert.Zero(t, good.Load(), "the paused handler takes nothing")
	assert.Equal(t, 1, e.count(t, queue), "the message waits in its queue")

	releaseOnce.Do(func() { close(release) })
	require.Eventually(t, func() bool { return good.Load() == 1 }, 20*time.Second, 50*time.Millisecond, "it consumes again")
	code, _ := get(t, srv.URL)
	assert.Equal(t, http.StatusOK, code)
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // a test's local server
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestHung_BatchHandler: a batch handler that hangs is abandoned message by message, each
// dead-lettered after its retries; later batches flow and Close keeps its timeout.
func TestHung_BatchHandler(t *testing.T) {
	e := rabbitEnv(t)
	queue := e.newQueue(t, "test.hung.batch")
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	var good atomic.Int64
	cfg := hungPolicy()
	s, err := router.New(e.broker, cfg)
	require.NoError(t, err)
	require.NoError(t, s.HandleBatch("bulk", queue, func(_ context.Context, msgs []*message.Message) []error {
		for _, m := range msgs {
			if string(m.Payload) == "hang" {
				blockIgnoringContext(release)
			}
		}
		good.Add(int64(len(msgs)))
		return nil
	}, router.WithBatch(2, 50*time.Millisecond)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	<-s.Running()
	e.publish(t, queue, message.NewMessage("b-hung-1", []byte("hang")))
	e.publish(t, queue, message.NewMessage("b-hung-2", []byte("hang")))
	var dead []*message.Message
	require.Eventually(t, func() bool {
		dead = append(dead, e.dlq(t, queue)...)
		return len(dead) == 2
	}, 60*time.Second, 50*time.Millisecond)
	for _, m := range dead {
		assert.Equal(t, "sluice.handler_timeout", m.Metadata.Get(sluice.HeaderErrorType))
		assert.Contains(t, m.Metadata.Get(sluice.HeaderErrorStack), "blockIgnoringContext")
	}
	for i := range 10 {
		e.publish(t, queue, message.NewMessage(fmt.Sprintf("b-good-%d", i), []byte("ok")))
	}
	require.Eventually(t, func() bool { return good.Load() == 10 }, 30*time.Second, 50*time.Millisecond)
	cancel()
	closing := time.Now()
	<-ran
	err = s.Close()
	assert.Less(t, time.Since(closing), cfg.CloseTimeout)
	assert.ErrorIs(t, err, sluice.ErrHandlerTimeout)
}

// TestHung_PartitionedHandler: a partitioned handler (WithPartitions) whose handler hangs on
// one key: that message is dead-lettered after its retries, the other partitions' and the
// same partition's later messages flow, and Close keeps its timeout; with WithRebalancing,
// a second instance joining gets its share of the partitions although an attempt on one of
// them hangs (the hand-over waits for no hung attempt).
func TestHung_PartitionedHandler(t *testing.T) {
	r, url := partitionsNode(t)
	for _, rebalance := range []bool{false, true} {
		t.Run(fmt.Sprintf("rebalancing %v", rebalance), func(t *testing.T) {
			queue := testenv.Name("test.hung.partitioned")
			var del []string
			for k := range 4 {
				del = append(del, topology.Partition(queue, k))
			}
			r.DeleteQueues(append(del, topology.DLQ(queue), queue)...)
			release := make(chan struct{})
			var releaseOnce sync.Once
			t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
			var good atomic.Int64
			handler := func(m *message.Message) error {
				if string(m.Payload) == "hang" {
					blockIgnoringContext(release)
					return nil
				}
				good.Add(1)
				return nil
			}
			opts := []router.HandlerOption{router.WithPartitions(4), router.WithConcurrency(2)}
			if rebalance {
				opts = append(opts, router.WithRebalancing(200*time.Millisecond))
			}
			newInstance := func() (*router.Stack, func() (time.Duration, error)) {
				b := newBrokerAt(t, url)
				s, err := router.New(b, hungPolicy())
				require.NoError(t, err)
				require.NoError(t, s.Handle("payments", queue, handler, opts...))
				ctx, cancel := context.WithCancel(context.Background())
				ran := make(chan error, 1)
				go func() { ran <- s.Run(ctx) }()
				<-s.Running()
				var once sync.Once
				var took time.Duration
				var cerr error
				stop := func() (time.Duration, error) {
					once.Do(func() {
						cancel()
						begin := time.Now()
						<-ran
						cerr = s.Close()
						took = time.Since(begin)
					})
					return took, cerr
				}
				t.Cleanup(func() { _, _ = stop() })
				return s, stop
			}
			a, stopA := newInstance()
			if rebalance {
				require.Eventually(t, func() bool { return len(a.HeldPartitions("payments")) == 4 }, 20*time.Second, 20*time.Millisecond)
			}
			pub := newBrokerAt(t, url)
			ctx := context.Background()
			require.NoError(t, pub.PublishPartitioned(ctx, queue, "key-hang", message.NewMessage("p-hung", []byte("hang"))))
			if rebalance {
				// The hung attempt is running on a partition of a's when b joins.
				time.Sleep(500 * time.Millisecond)
				joined := time.Now()
				b, _ := newInstance()
				require.Eventually(t, func() bool { return len(b.HeldPartitions("payments")) == 2 && len(a.HeldPartitions("payments")) == 2 },
					30*time.Second, 20*time.Millisecond, "b gets its share while an attempt on a's partition hangs")
				t.Logf("rebalanced in %s with a hung attempt in flight", time.Since(joined).Round(10*time.Millisecond))
			}
			for i := range 40 {
				require.NoError(t, pub.PublishPartitioned(ctx, queue, fmt.Sprintf("key-%d", i), message.NewMessage(fmt.Sprintf("p-good-%d", i), []byte("ok"))))
			}
			var dead []*message.Message
			require.Eventually(t, func() bool {
				for {
					d, ok := r.Get(topology.DLQ(queue))
					if !ok {
						break
					}
					m, _ := amqp.Marshaler{}.Unmarshal(d)
					dead = append(dead, m)
				}
				return good.Load() >= 40 && len(dead) == 1
			}, 60*time.Second, 50*time.Millisecond, "good %d of 40, dead %d of 1", good.Load(), len(dead))
			assert.Equal(t, "sluice.handler_timeout", dead[0].Metadata.Get(sluice.HeaderErrorType))
			assert.Contains(t, dead[0].Metadata.Get(sluice.HeaderErrorStack), "blockIgnoringContext")
			took, err := stopA()
			assert.Less(t, took, 5*time.Second, "Close keeps its CloseTimeout")
			if err != nil {
				assert.ErrorIs(t, err, sluice.ErrHandlerTimeout)
			}
		})
	}
}

// partitionsNode is the shared node when it has the consistent-hash exchange (RabbitMQ
// 4.3's test node does), else a node of the test's own with the plugin.
func partitionsNode(t *testing.T) (*testenv.Rabbit, string) {
	t.Helper()
	url := testenv.AMQPURL(t)
	b := newBrokerAt(t, url)
	probe := testenv.Name("test.hung.probe")
	err := b.DeclarePartitioned(context.Background(), probe, 1)
	if err == nil {
		r := testenv.NewRabbit(t)
		r.DeleteQueues(topology.Partition(probe, 0), topology.DLQ(probe), probe)
		return r, url
	}
	if !errors.Is(err, amqp.ErrConsistentHashUnavailable) {
		require.NoError(t, err)
	}
	node := testenv.StartNode(t, testenv.NodeOptions{Plugins: []string{"rabbitmq_consistent_hash_exchange"}})
	return node.Rabbit(t), node.URL()
}

func newBrokerAt(t *testing.T, url string) *amqp.Broker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{url}, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}
