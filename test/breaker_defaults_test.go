package test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// The default breaker and one panicking message: first alone in a quiet queue, retried
// fast, then again among steady healthy traffic. Before, the default tripped on five
// consecutive failures, so the poison message's retries alone opened it and an unrelated
// healthy message waited out the open breaker (48s in the issue). Now a message counts as
// one failure however often it fails: the breaker stays closed, no healthy message is ever
// deferred, and the poison message is dead-lettered.
func TestBreaker_DefaultIgnoresOnePoisonMessageAmongHealthyTraffic(t *testing.T) {
	const (
		maxRetries = 8
		healthy    = 40
	)
	e := rabbitEnv(t)
	q := e.newQueue(t, "breaker-default")
	var (
		mu          sync.Mutex
		transitions []string
	)
	reg, err := breaker.New(breaker.Config{
		Logger: testLogger(),
		OnStateChange: func(name string, from, to breaker.State) {
			mu.Lock()
			transitions = append(transitions, fmt.Sprintf("%s: %s -> %s", name, from, to))
			mu.Unlock()
		},
	})
	require.NoError(t, err)
	var deferred, handled atomic.Int64
	start(t, e, router.Config{
		Breakers: reg,
		Retry: retry.Config{
			MaxRetries: maxRetries, InitialDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond, Jitter: retry.NoJitter,
			OnRetry: func(ev retry.Event) {
				if ev.Deferred {
					deferred.Add(1)
				}
			},
		},
	}, func(s *router.Stack) {
		require.NoError(t, s.Handle("charge", q, func(msg *message.Message) error {
			if string(msg.Payload) == "poison" {
				panic("cannot charge this one")
			}
			handled.Add(1)
			return nil
		}))
	})

	// A quiet queue: the poison message alone, all its attempts.
	e.publish(t, q, message.NewMessage(watermill.NewUUID(), []byte("poison")))
	require.Eventually(t, func() bool { return e.count(t, topology.DLQ(q)) == 1 }, 30*time.Second, 10*time.Millisecond)

	// Steady healthy traffic with a second poison message among it.
	for i := range healthy {
		if i == healthy/4 {
			e.publish(t, q, message.NewMessage(watermill.NewUUID(), []byte("poison")))
		}
		e.publish(t, q, message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "order-%d", i)))
		time.Sleep(10 * time.Millisecond) // steady traffic, not one burst
	}
	require.Eventually(t, func() bool { return handled.Load() == healthy && e.count(t, topology.DLQ(q)) == 2 },
		30*time.Second, 10*time.Millisecond, "every healthy message handled, both poison messages dead-lettered")
	assert.Zero(t, deferred.Load(), "no message was deferred by the breaker")
	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, transitions, "the default breaker never left closed")
	assert.Equal(t, breaker.StateClosed, reg.State("charge"))
}
