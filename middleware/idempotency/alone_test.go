package idempotency_test

import (
	"context"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/middleware/idempotency"
)

// The idempotency step alone in a plain Watermill router: a duplicate of a key already
// done is acked without calling the handler, whatever sits around the step. (A concurrent
// duplicate is deferred; without sluice's retry step that deferral is an error the router
// nacks, and the pub/sub redelivers it until the first attempt has finished.)
func TestGuard_AloneInAPlainWatermillRouter(t *testing.T) {
	ps := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	t.Cleanup(func() { _ = ps.Close() })
	g, err := idempotency.New(idempotency.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close() })

	var mu sync.Mutex
	charged := map[string]int{}
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddMiddleware(g.Middleware)
	r.AddConsumerHandler("charge", "payments", ps, func(m *message.Message) error {
		mu.Lock()
		charged[m.Metadata.Get(sluice.HeaderIdempotencyKey)]++
		mu.Unlock()
		return nil
	})
	stopped := make(chan error, 1)
	go func() { stopped <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-stopped)
	})
	<-r.Running()

	keys := []string{"pay-1", "pay-2", "pay-1", "pay-3", "pay-2", "pay-1"}
	for _, k := range keys {
		m := message.NewMessage(watermill.NewUUID(), nil)
		m.Metadata.Set(sluice.HeaderIdempotencyKey, k)
		// Publish returns once the message is acked (BlockPublishUntilSubscriberAck).
		require.NoError(t, ps.Publish("payments", m))
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[string]int{"pay-1": 1, "pay-2": 1, "pay-3": 1}, charged, "each key charged once, every message acked")
}
