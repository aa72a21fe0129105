package outbox_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/router"
)

// consumeOnce consumes queue on b the way a sluice service does: the stack with its
// idempotency step keyed on the message id (the UUID the producer gave the message, which
// the outbox and Watermill's forwarder carry unchanged), one message at a time so that
// order shows. The handler's side effect is recording the message: received.order holds
// every side effect (a message whose effect ran twice appears twice), received.duplicates
// the copies the idempotency step acknowledged without running it, received.total every
// delivery. It returns once want messages had their effect and nothing came for a second.
func consumeOnce(t testing.TB, b *amqp.Broker, queue string, want int) received {
	t.Helper()
	var (
		mu       sync.Mutex
		r        = received{order: map[string][]int{}}
		distinct = map[string]bool{}
		last     = time.Now()
	)
	dup := func(*message.Message, string) {
		mu.Lock()
		defer mu.Unlock()
		r.duplicates++
		r.total++
		last = time.Now()
	}
	guard, err := idempotency.New(idempotency.Config{OnDuplicate: dup})
	require.NoError(t, err)
	stack, err := router.New(b, router.Config{
		Guard: guard, Concurrency: 1, Prefetch: 200, Logger: quietLogger(),
	})
	require.NoError(t, err)
	require.NoError(t, stack.Handle("outbox-consumer", queue, func(m *message.Message) error {
		var p, i int
		if _, err := fmt.Sscanf(m.UUID, "p%d-%d", &p, &i); err != nil {
			return fmt.Errorf("message id %q: %w", m.UUID, err)
		}
		mu.Lock()
		defer mu.Unlock()
		key := strconv.Itoa(p)
		r.order[key] = append(r.order[key], i)
		distinct[m.UUID] = true
		r.total++
		last = time.Now()
		return nil
	}))
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- stack.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, stack.Close())
		require.NoError(t, <-runDone)
		require.NoError(t, guard.Close())
	}()

	deadline := time.Now().Add(120 * time.Second)
	for {
		time.Sleep(100 * time.Millisecond)
		mu.Lock()
		n, idle := len(distinct), time.Since(last)
		mu.Unlock()
		if n >= want && idle > time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue %s: %d of %d messages consumed after 120s", queue, n, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	return r
}
