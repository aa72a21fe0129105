package test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// TestShutdownWithHandlersInFlightLosesNothing closes a stack while handlers are busy: the
// ones that finish within the drain are acked, the ones that do not go back to the queue,
// and a new stack processes every message. After Close no goroutine of sluice is left.
func TestShutdownWithHandlersInFlightLosesNothing(t *testing.T) {
	r := testenv.NewRabbit(t)
	queue := testenv.Name("test.shutdown")
	r.DeleteQueues(queue, topology.DLQ(queue))
	const total = 20
	ignore := goleak.IgnoreCurrent()
	finished := map[string]bool{} // acked by the first stack

	func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		b, err := amqp.New(ctx, amqp.Config{URLs: []string{r.URL}, Logger: testLogger(), DrainTimeout: 500 * time.Millisecond})
		require.NoError(t, err)
		s, err := router.New(b, router.Config{Logger: testLogger(), Concurrency: 4, CloseTimeout: 2 * time.Second})
		require.NoError(t, err)
		started := make(chan string, total)
		var fmu sync.Mutex
		// Handlers of odd messages finish quickly once shutdown begins; even ones hang
		// until their context is cancelled by the drain timeout.
		stopping := make(chan struct{})
		require.NoError(t, s.Handle("slow", queue, func(m *message.Message) error {
			started <- m.UUID
			var n int
			_, _ = fmt.Sscanf(m.UUID, "m-%d", &n)
			select {
			case <-stopping:
				if n%2 == 1 {
					fmu.Lock()
					finished[m.UUID] = true
					fmu.Unlock()
					return nil
				}
				<-m.Context().Done()
				return m.Context().Err()
			case <-m.Context().Done():
				return m.Context().Err()
			}
		}))
		runCtx, stopRun := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(runCtx) }()
		<-s.Running()
		for i := 0; i < total; i++ {
			e := &env{rabbit: r}
			e.publish(t, queue, message.NewMessage(fmt.Sprintf("m-%d", i), []byte("x")))
		}
		for i := 0; i < 4; i++ { // four handlers in flight
			select {
			case <-started:
			case <-time.After(20 * time.Second):
				t.Fatal("handlers did not start")
			}
		}
		close(stopping)
		_ = s.Close() // may report the router's close timeout: the hung handlers
		stopRun()
		<-done
		require.NoError(t, b.Close())
	}()
	goleak.VerifyNone(t, ignore)

	// Nothing was lost: every message is still in the queue or was acked once.
	e := rabbitEnv(t)
	var mu sync.Mutex
	seen := map[string]int{}
	start(t, e, router.Config{Concurrency: 4}, func(s *router.Stack) {
		require.NoError(t, s.Handle("drain", queue, func(m *message.Message) error {
			mu.Lock()
			seen[m.UUID]++
			mu.Unlock()
			assert.Empty(t, m.Metadata.Get(sluice.HeaderRetryCount), "shutdown used no attempt of %s", m.UUID)
			return nil
		}))
	})
	require.Eventually(t, func() bool { return r.Count(queue) == 0 }, 30*time.Second, 50*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	// The odd messages in flight finished during the shutdown and were acked; every
	// other message — the hung ones included, with no attempt used — comes back once.
	for i := 0; i < total; i++ {
		id := fmt.Sprintf("m-%d", i)
		if finished[id] {
			assert.Zero(t, seen[id], "message %s was acked before shutdown yet came back", id)
			continue
		}
		assert.Equal(t, 1, seen[id], "message %s after the restart", id)
	}
	assert.NotEmpty(t, finished, "some handlers finished during the shutdown")
}

// TestMissingDeadLetterExchangeRedeliversWithBackoff: when the dead-letter publish fails,
// the original is not acked and not lost, and redeliveries slow down.
func TestMissingDeadLetterExchangeRedeliversWithBackoff(t *testing.T) {
	e := rabbitEnv(t)
	queue := e.newQueue(t, "test.poison.nodlx")
	var c calls
	broken := deadLettererFunc(func(ctx context.Context, q string, m *message.Message) error {
		return e.amqp.Publisher().PublishTo(ctx, "sluice.test.missing-dlx", q, m)
	})
	start(t, e, router.Config{Retry: retry.Config{DeadLetterer: broken, MaxRetries: -1}}, func(s *router.Stack) {
		require.NoError(t, s.Handle("nodlx", queue, func(m *message.Message) error {
			c.add(m)
			return errors.New("always fails")
		}))
	})
	e.publish(t, queue, message.NewMessage("msg-nodlx", []byte("payload")))
	require.Eventually(t, func() bool { return c.n() >= 5 }, 30*time.Second, 20*time.Millisecond, "redelivered after each failed dead-letter publish")
	gaps := c.gaps()
	assert.Greater(t, gaps[len(gaps)-1], gaps[0], "redeliveries back off: %v", gaps)
	assert.GreaterOrEqual(t, gaps[len(gaps)-1], 100*time.Millisecond, "redeliveries back off: %v", gaps)
	for _, m := range c.msgs {
		assert.Equal(t, "msg-nodlx", m.UUID, "the same message, never lost or replaced")
	}
	assert.Equal(t, 0, e.count(t, topology.DLQ(queue)))
}

type deadLettererFunc func(ctx context.Context, queue string, m *message.Message) error

func (f deadLettererFunc) DeadLetter(ctx context.Context, queue string, m *message.Message) error {
	return f(ctx, queue, m)
}
