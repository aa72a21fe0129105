package breaker_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/middleware/breaker"
)

// The breaker alone in a plain Watermill router (no sluice retry step to turn its
// deferral into a broker-side delay) behaves like Watermill's own middleware.CircuitBreaker:
// a rejection is an error the router nacks and the pub/sub redelivers. What it still
// guarantees: while it is open the dependency is not called, no message is lost, and once
// the dependency heals every message is handled and acked.
func TestRegistry_AloneInAPlainWatermillRouter(t *testing.T) {
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, watermill.NopLogger{})
	t.Cleanup(func() { _ = ps.Close() })
	reg, err := breaker.New(breaker.Config{Name: "gateway", ConsecutiveFailures: 3, OpenTimeout: 200 * time.Millisecond, Spread: -1})
	require.NoError(t, err)

	var healthy atomic.Bool
	var calls, callsWhileOpen atomic.Int64
	done := make(chan string, 64)
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	// The router runs the redelivered messages side by side: a call let through while the
	// breaker was closed may find it open inside the handler, tripped by another call that
	// failed in between. A call made while open finds it open both before the breaker
	// decided and after.
	type openBefore struct{}
	r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			m.SetContext(context.WithValue(m.Context(), openBefore{}, reg.State("gateway") == breaker.StateOpen))
			return h(m)
		}
	}, reg.Middleware)
	r.AddConsumerHandler("charge", "payments", ps, func(m *message.Message) error {
		calls.Add(1)
		if m.Context().Value(openBefore{}) == true && reg.State("gateway") == breaker.StateOpen {
			callsWhileOpen.Add(1)
		}
		if !healthy.Load() {
			return errors.New("gateway: 503")
		}
		done <- m.UUID
		return nil
	})
	stopped := make(chan error, 1)
	go func() { stopped <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-stopped)
	})
	<-r.Running()

	const n = 5
	for i := range n {
		require.NoError(t, ps.Publish("payments", message.NewMessage(watermill.NewShortUUID()+string(rune('a'+i)), nil)))
	}
	require.Eventually(t, func() bool { return reg.State("gateway") == breaker.StateOpen }, 5*time.Second, time.Millisecond,
		"three failures trip the breaker")
	// Open: the router redelivers, the breaker rejects, the dependency is left alone.
	before := calls.Load()
	time.Sleep(100 * time.Millisecond)
	assert.LessOrEqual(t, calls.Load()-before, int64(1), "at most a half-open probe reaches the handler while the breaker is open")
	healthy.Store(true)

	seen := map[string]bool{}
	timeout := time.After(10 * time.Second)
	for len(seen) < n {
		select {
		case id := <-done:
			seen[id] = true
		case <-timeout:
			t.Fatalf("%d of %d messages handled after the dependency healed", len(seen), n)
		}
	}
	assert.Zero(t, callsWhileOpen.Load(), "no call reached the handler in the open state")
	assert.Equal(t, breaker.StateClosed, reg.State("gateway"))
}
