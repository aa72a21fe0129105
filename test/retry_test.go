package test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/testkit/steptest"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// fastRetry is a policy without jitter, so gaps can be checked against it.
func fastRetry() retry.Config {
	return retry.Config{MaxRetries: 3, InitialDelay: 300 * time.Millisecond, Multiplier: 2, MaxDelay: 5 * time.Second, Jitter: retry.NoJitter}
}

// assertGap checks a delay between attempts: never earlier than asked (less the cascade's
// 10ms rounding), and not later than a loaded 2-core CI machine explains. The precision
// itself is measured by BenchmarkDelayAccuracy, not asserted here.
func assertGap(t *testing.T, want, got time.Duration) {
	t.Helper()
	assert.GreaterOrEqual(t, got, want-20*time.Millisecond, "attempt came early: want %s, got %s", want, got)
	assert.Less(t, got, want+time.Second, "attempt came late: want %s, got %s", want, got)
}

// settle waits until cond holds, then a little longer to see that nothing more happens.
func settle(t *testing.T, cond func() bool, what string) {
	t.Helper()
	require.Eventually(t, cond, 30*time.Second, 20*time.Millisecond, what)
	time.Sleep(700 * time.Millisecond)
}

func TestRetryFailsTwiceThenSucceeds(t *testing.T) {
	onEachBroker(t, func(t *testing.T, e *env) {
		queue := e.newQueue(t, "test.retry.twice")
		var c calls
		start(t, e, router.Config{Retry: fastRetry()}, func(s *router.Stack) {
			require.NoError(t, s.Handle("twice", queue, func(m *message.Message) error {
				if c.add(m) <= 2 {
					return errors.New("dependency not ready")
				}
				return nil
			}))
		})
		e.publish(t, queue, message.NewMessage("msg-1", []byte(`{"n":1}`)))
		settle(t, func() bool { return c.n() >= 3 }, "three attempts")

		assert.Equal(t, 3, c.n(), "handler calls")
		gaps := c.gaps()
		require.Len(t, gaps, 2)
		// No jitter: 300ms then 600ms.
		assertGap(t, 300*time.Millisecond, gaps[0])
		assertGap(t, 600*time.Millisecond, gaps[1])
		last := c.msgs[2]
		assert.Equal(t, "msg-1", last.UUID)
		assert.Equal(t, "2", last.Metadata.Get(sluice.HeaderRetryCount))
		assert.Equal(t, queue, last.Metadata.Get(sluice.HeaderOriginalQueue))
		assert.Len(t, failure.History(last.Metadata), 2)
		if e.rabbit != nil {
			// The second trip through the cascade started from a copy without the first
			// trip's x-death: RabbitMQ's records do not pile up from retry to retry.
			var deaths []map[string]any
			require.NoError(t, json.Unmarshal([]byte(last.Metadata.Get("x-death")), &deaths), "x-death %q", last.Metadata.Get("x-death"))
			require.NotEmpty(t, deaths, "the delayed copy went through the cascade")
			for _, d := range deaths {
				assert.EqualValues(t, 1, d["count"], "x-death entry %v counted more than one trip", d)
			}
		}
		assert.Equal(t, 0, e.count(t, queue), "queue empty")
		assert.Equal(t, 0, e.count(t, topology.DLQ(queue)), "DLQ empty")
	})
}

func TestRetryClassesOfError(t *testing.T) {
	cases := []struct {
		name      string
		err       error
		wantCalls int
		wantDLQ   int
	}{
		{name: "permanent goes to the DLQ after one call", err: sluice.Permanent(errors.New("invalid amount")), wantCalls: 1, wantDLQ: 1},
		{name: "discard is acked after one call", err: sluice.Discard(errors.New("order already cancelled")), wantCalls: 1, wantDLQ: 0},
		{name: "plain error is retried until exhausted", err: errors.New("gateway down"), wantCalls: 4, wantDLQ: 1},
	}
	onEachBroker(t, func(t *testing.T, e *env) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				queue := e.newQueue(t, "test.retry.class")
				var c calls
				start(t, e, router.Config{Retry: retry.Config{MaxRetries: 3, InitialDelay: 50 * time.Millisecond, Jitter: retry.NoJitter}}, func(s *router.Stack) {
					require.NoError(t, s.Handle("classes", queue, func(m *message.Message) error {
						c.add(m)
						return tc.err
					}))
				})
				e.publish(t, queue, message.NewMessage("msg-"+tc.name[:4], []byte("payload")))
				settle(t, func() bool { return c.n() >= tc.wantCalls }, "calls")
				assert.Equal(t, tc.wantCalls, c.n(), "handler calls")
				require.Eventually(t, func() bool { return e.count(t, topology.DLQ(queue)) == tc.wantDLQ }, 10*time.Second, 20*time.Millisecond)
				assert.Equal(t, 0, e.count(t, queue), "queue empty")
			})
		}
	})
}

func TestRetryAfterWaitsExactly(t *testing.T) {
	onEachBroker(t, func(t *testing.T, e *env) {
		queue := e.newQueue(t, "test.retry.after")
		var c calls
		// The policy's backoff (100ms) would come far sooner than the 2s asked for.
		start(t, e, router.Config{Retry: retry.Config{InitialDelay: 100 * time.Millisecond, Jitter: retry.NoJitter}}, func(s *router.Stack) {
			require.NoError(t, s.Handle("after", queue, func(m *message.Message) error {
				if c.add(m) == 1 {
					return sluice.RetryAfter(2*time.Second, errors.New("429 too many requests"))
				}
				return nil
			}))
		})
		e.publish(t, queue, message.NewMessage("msg-ra", []byte("x")))
		settle(t, func() bool { return c.n() >= 2 }, "second attempt")
		require.Equal(t, 2, c.n())
		assertGap(t, 2*time.Second, c.gaps()[0])
	})
}

func TestMessageWaitingInDelayArrivesAfterConsumerRestart(t *testing.T) {
	onEachBroker(t, func(t *testing.T, e *env) {
		queue := e.newQueue(t, "test.retry.restart")
		failed := make(chan struct{}, 1)
		cfg := router.Config{Retry: retry.Config{InitialDelay: 2 * time.Second, Jitter: retry.NoJitter}}
		s := start(t, e, cfg, func(s *router.Stack) {
			require.NoError(t, s.Handle("restart", queue, func(m *message.Message) error {
				failed <- struct{}{}
				return errors.New("fail once")
			}))
		})
		e.publish(t, queue, message.NewMessage("msg-wait", []byte("x")))
		select {
		case <-failed:
		case <-time.After(20 * time.Second):
			t.Fatal("first attempt did not happen")
		}
		// Stop consuming while the retry copy waits in the delay.
		require.NoError(t, s.Close())
		time.Sleep(2500 * time.Millisecond) // past the delay: nobody consumes
		assert.Equal(t, 1, e.count(t, queue), "the delayed copy waits in the queue while nobody consumes")

		var c calls
		start(t, e, cfg, func(s *router.Stack) {
			require.NoError(t, s.Handle("restart-2", queue, func(m *message.Message) error {
				c.add(m)
				return nil
			}))
		})
		settle(t, func() bool { return c.n() >= 1 }, "delivery after restart")
		assert.Equal(t, 1, c.n())
		assert.Equal(t, "1", c.msgs[0].Metadata.Get(sluice.HeaderRetryCount))
	})
}

func TestFailedHandoffLeavesOriginalUnacked(t *testing.T) {
	e := rabbitEnv(t)
	queue := e.newQueue(t, "test.retry.handoff")
	var c calls
	// A delayer whose exchange does not exist: RabbitMQ refuses the publish.
	brokenDelay := steptest.DelayerFunc(func(ctx context.Context, q string, d time.Duration, m *message.Message) error {
		return e.amqp.Publisher().PublishTo(ctx, "sluice.test.missing-exchange", q, m)
	})
	start(t, e, router.Config{Retry: retry.Config{Delayer: brokenDelay, InitialDelay: 50 * time.Millisecond}}, func(s *router.Stack) {
		require.NoError(t, s.Handle("handoff", queue, func(m *message.Message) error {
			c.add(m)
			return errors.New("always fails")
		}))
	})
	e.publish(t, queue, message.NewMessage("msg-handoff", []byte("x")))
	require.Eventually(t, func() bool { return c.n() >= 5 }, 20*time.Second, 20*time.Millisecond, "redelivered after each failed hand-off")
	// The original is never acked nor dead-lettered: the same message comes back.
	assert.Equal(t, 0, e.count(t, topology.DLQ(queue)), "nothing dead-lettered")
	for _, m := range c.msgs {
		assert.Equal(t, "msg-handoff", m.UUID)
		assert.Empty(t, m.Metadata.Get(sluice.HeaderRetryCount), "no retry copy was ever confirmed")
	}
	gaps := c.gaps()
	last := gaps[len(gaps)-1]
	// Against the shortest earlier gap, not the first: a busy machine can stretch any one
	// gap (the first channel reopened after the broker closed it took 1.5 s once).
	assert.Greater(t, last, slices.Min(gaps[:len(gaps)-1]), "redeliveries back off instead of spinning: %v", gaps)
	assert.GreaterOrEqual(t, last, 100*time.Millisecond, "redeliveries back off instead of spinning: %v", gaps)
}
