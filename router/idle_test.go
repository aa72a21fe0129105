package router_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

const idleFor = 300 * time.Millisecond

// idleRun is one Run with StopWhenIdle on the embedded broker, consuming "work".
type idleRun struct {
	s       *router.Stack
	handled atomic.Int64
	// lastEnd is when the handler last returned.
	mu      sync.Mutex
	lastEnd time.Time
}

func newIdleRun(t *testing.T, b router.Broker, cfg router.Config, h func(*message.Message) error) *idleRun {
	t.Helper()
	cfg.Logger = silentLogger
	if cfg.StopWhenIdle == 0 {
		cfg.StopWhenIdle = idleFor
	}
	s, err := router.New(b, cfg)
	require.NoError(t, err)
	r := &idleRun{s: s}
	require.NoError(t, s.Handle("work", "work", func(m *message.Message) error {
		defer func() {
			r.mu.Lock()
			r.lastEnd = time.Now()
			r.mu.Unlock()
		}()
		err := h(m)
		if err == nil {
			r.handled.Add(1)
		}
		return err
	}))
	require.NoError(t, s.Declare(context.Background()))
	return r
}

// run runs the stack until it returns by itself (the test fails after 20 s), and returns
// when it returned and Run's error.
func (r *idleRun) run(t *testing.T) (time.Time, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := r.s.Run(ctx)
	require.NoError(t, ctx.Err(), "Run returned only because its context ended")
	return time.Now(), err
}

func (r *idleRun) handlerLastReturned() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastEnd
}

// Run with StopWhenIdle returns nil once the queue has been empty and nothing in flight
// for the idle time: every message handled (a retry due within the idle time included),
// not before the idle time has passed since the last attempt ended, the stack closed (no
// goroutine or timer left, without calling Close), whatever kept it busy.
func TestStopWhenIdle_ReturnsOnceTheWorkIsDone(t *testing.T) {
	tests := []struct {
		name string
		// handler handles message i's call n (from 1).
		handler func(i, n int) error
		// during publishes while Run runs; nil publishes nothing.
		during   func(t *testing.T, b *testBroker)
		messages int
		want     int64
		// minRun is the least time Run must have lasted.
		minRun time.Duration
		// idle is the case's StopWhenIdle, idleFor when zero.
		idle time.Duration
	}{
		{
			name:     "a backlog, some failing once (their retries due within the idle time)",
			messages: 20,
			handler: func(i, n int) error {
				if i%4 == 0 && n == 1 {
					return errors.New("flaky")
				}
				return nil
			},
			want: 20, minRun: idleFor,
		},
		{
			name:     "an attempt longer than the idle time is work in flight",
			messages: 1,
			handler: func(_, _ int) error {
				time.Sleep(3 * idleFor)
				return nil
			},
			want: 1, minRun: 4 * idleFor,
		},
		{
			name:     "a message arriving during the idle wait starts it again",
			messages: 1,
			handler:  func(_, _ int) error { return nil },
			// A longer idle time than the other cases: the publishing goroutine may be
			// scheduled hundreds of milliseconds late on a loaded machine, and a late
			// publish that lands after Run returned proves nothing.
			idle: 2 * time.Second,
			during: func(t *testing.T, b *testBroker) {
				time.Sleep(500 * time.Millisecond)
				publish(t, b, "work", "late-1")
				time.Sleep(500 * time.Millisecond)
				publish(t, b, "work", "late-2")
			},
			want: 3, minRun: 3 * time.Second,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newTestBroker(t)
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			var mu sync.Mutex
			calls := map[string]int{}
			idle := tt.idle
			if idle == 0 {
				idle = idleFor
			}
			r := newIdleRun(t, b, router.Config{Retry: fastRetries(3), Concurrency: 4, StopWhenIdle: idle}, func(m *message.Message) error {
				mu.Lock()
				calls[m.UUID]++
				n := calls[m.UUID]
				mu.Unlock()
				var i int
				_, _ = fmt.Sscanf(m.UUID, "m-%d", &i)
				return tt.handler(i, n)
			})
			for i := range tt.messages {
				publish(t, b, "work", fmt.Sprintf("m-%d", i))
			}
			start := time.Now()
			var wg sync.WaitGroup
			if tt.during != nil {
				wg.Go(func() { tt.during(t, b) })
			}
			returned, err := r.run(t)
			wg.Wait()
			require.NoError(t, err)
			assert.Equal(t, tt.want, r.handled.Load(), "messages handled before Run returned")
			assert.GreaterOrEqual(t, returned.Sub(start), tt.minRun, "Run returned before the work was done")
			assert.GreaterOrEqual(t, returned.Sub(r.handlerLastReturned()), idle, "Run returned less than the idle time after the last attempt")
			assert.Less(t, returned.Sub(r.handlerLastReturned()), idle+2*time.Second, "Run returned long after it was idle")
			assert.False(t, r.s.Consuming(), "the stack still consumes")
			assert.Zero(t, b.mem.Len("work"), "messages left in the queue")
			assert.NoError(t, r.s.Close(), "Close after an idle stop")
		})
	}
}

// A queue that is not empty keeps Run running, even when this stack takes nothing from
// it (a partition another instance holds, a handler paused by its breaker): the broker's
// depth is read, not only the stack's own attempts. Once it reads empty, the idle time
// runs from then.
func TestStopWhenIdle_WaitsForAQueueThatIsNotEmpty(t *testing.T) {
	b := &depthOverride{testBroker: newTestBroker(t)}
	b.ready.Store(1)
	r := newIdleRun(t, b, router.Config{}, func(*message.Message) error { return nil })
	start := time.Now()
	emptied := make(chan time.Time, 1)
	go func() {
		time.Sleep(4 * idleFor)
		emptied <- time.Now()
		b.ready.Store(0)
	}()
	returned, err := r.run(t)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, returned.Sub(start), 5*idleFor, "Run returned while the queue held a ready message")
	assert.GreaterOrEqual(t, returned.Sub(<-emptied), idleFor, "the idle time runs from when the queue read empty")
}

// depthOverride reports a queue depth the test sets for "work", as another instance's
// backlog would show.
type depthOverride struct {
	*testBroker
	ready atomic.Int64
}

func (b *depthOverride) QueueDepth(ctx context.Context, queue string) (sluice.QueueDepth, error) {
	d, err := b.testBroker.QueueDepth(ctx, queue)
	if queue == "work" {
		d.Ready += b.ready.Load()
	}
	return d, err
}

// A retry waiting out its delay is not work in flight: Run returns while it waits, and it
// comes back into the queue on time, where the next run takes it. On the embedded broker
// the delay is a timer in this process, so this holds only while the process (and the
// broker) lives; RabbitMQ keeps it across a process exit (test/scaletozero_test.go).
func TestStopWhenIdle_ARetryWaitingOutItsDelayIsNotWorkInFlight(t *testing.T) {
	const delay = 4 * idleFor
	b := newTestBroker(t)
	var attempts atomic.Int64
	handler := func(m *message.Message) error {
		if attempts.Add(1) == 1 {
			return errors.New("gateway timeout")
		}
		return nil
	}
	cfg := router.Config{Retry: retry.Config{MaxRetries: 2, InitialDelay: delay, MaxDelay: delay, Jitter: retry.NoJitter}}
	first := newIdleRun(t, b, cfg, handler)
	publish(t, b, "work", "m-1")
	start := time.Now()
	returned, err := first.run(t)
	require.NoError(t, err)
	assert.Less(t, returned.Sub(start), delay, "the first run waited for the retry's delay")
	assert.EqualValues(t, 1, attempts.Load())
	assert.Zero(t, b.mem.Len(topology.DLQ("work")))

	// The retry is back in the queue after its delay, and the next run handles it.
	require.Eventually(t, func() bool {
		d, err := b.QueueDepth(context.Background(), "work")
		return err == nil && d.Ready == 1
	}, 10*delay, 10*time.Millisecond, "the retry came back into the queue")
	assert.GreaterOrEqual(t, time.Since(start), delay, "the retry came back before its delay")
	second := newIdleRun(t, b, cfg, handler)
	_, err = second.run(t)
	require.NoError(t, err)
	assert.EqualValues(t, 2, attempts.Load())
	assert.EqualValues(t, 1, second.handled.Load())
}

// Without StopWhenIdle, Run consumes until its context ends however long the queue is
// empty; a negative StopWhenIdle is refused.
func TestStopWhenIdle_ZeroAndNegative(t *testing.T) {
	t.Run("zero consumes until the context ends", func(t *testing.T) {
		b := newTestBroker(t)
		s, err := router.New(b, router.Config{Logger: silentLogger})
		require.NoError(t, err)
		require.NoError(t, s.Handle("work", "work", func(*message.Message) error { return nil }))
		ctx, cancel := context.WithTimeout(context.Background(), 4*idleFor)
		defer cancel()
		start := time.Now()
		require.NoError(t, s.Run(ctx))
		assert.GreaterOrEqual(t, time.Since(start), 4*idleFor)
		assert.NoError(t, s.Close())
	})
	t.Run("negative is refused", func(t *testing.T) {
		b := memory.New(memory.Config{Logger: silentLogger})
		t.Cleanup(func() { _ = b.Close() })
		s, err := router.New(b, router.Config{Logger: silentLogger, StopWhenIdle: -time.Second})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "StopWhenIdle is -1s")
		assert.Nil(t, s)
	})
}
