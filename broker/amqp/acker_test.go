package amqp_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

// publishN publishes n confirmed messages with ids m-0 … m-(n-1).
func publishN(t *testing.T, b *amqp.Broker, queue string, n int) {
	t.Helper()
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(fmt.Sprintf("m-%d", i), []byte("x"))
	}
	require.NoError(t, b.Publisher().Publish(queue, msgs...))
}

// Acks leave together (basic.ack with multiple), but never wait for a message that is
// still being handled: with 100 messages, a prefetch of 32 and the first message held by
// its handler, RabbitMQ delivers the other 99 only if their acks reach it while the first
// is still unacked.
func TestSlowMessageDoesNotHoldBackOtherAcks(t *testing.T) {
	r := testenv.NewRabbit(t)
	b := newBroker(t, amqp.Config{})
	queue := testenv.Name("test.ack.slow")
	declare(t, b, r, queue)
	const n = 100
	publishN(t, b, queue, n)

	sub := b.Subscriber(broker.SubscribeOptions{Concurrency: 4, Prefetch: 32})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, queue)
	require.NoError(t, err)

	var (
		mu     sync.Mutex
		seen   = map[string]int{}
		others = make(chan struct{})
	)
	slow := <-msgs // the first delivery: the lowest delivery tag
	go func() {
		for msg := range msgs {
			mu.Lock()
			seen[msg.UUID]++
			if len(seen) == n-1 {
				close(others)
			}
			mu.Unlock()
			msg.Ack()
		}
	}()
	select {
	case <-others:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("only %d of the other %d messages arrived while the first was held: their acks waited for it", len(seen), n-1)
	}
	slow.Ack()

	require.Eventually(t, func() bool { return r.Count(queue) == 0 }, 10*time.Second, 50*time.Millisecond)
	require.NoError(t, sub.Close())
	assert.Equal(t, 0, r.Count(queue), "every message acked, none back in the queue")
	mu.Lock()
	defer mu.Unlock()
	for id, times := range seen {
		assert.Equal(t, 1, times, "message %s delivered more than once", id)
	}
	assert.NotContains(t, seen, slow.UUID, "the held message was delivered once, to its own handler")
}

// An ack still waiting for others when the subscriber closes is sent before its channel
// closes; otherwise RabbitMQ would redeliver messages that were handled.
func TestAcksWaitingAtCloseAreSent(t *testing.T) {
	r := testenv.NewRabbit(t)
	// A minute's delay and a batch that never fills (31 of a prefetch of 64 for one
	// handler): only Close can send these acks.
	b := newBroker(t, amqp.Config{AckDelay: time.Minute})
	queue := testenv.Name("test.ack.close")
	declare(t, b, r, queue)
	const n = 10
	publishN(t, b, queue, n)

	sub := b.Subscriber(broker.SubscribeOptions{Concurrency: 1, Prefetch: 64})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, queue)
	require.NoError(t, err)
	for i := 0; i < n; i++ {
		select {
		case msg := <-msgs:
			msg.Ack()
		case <-ctx.Done():
			t.Fatalf("%d of %d messages delivered", i, n)
		}
	}
	require.NoError(t, sub.Close())

	assert.Equal(t, 0, r.Count(queue), "handled messages must not return to the queue")
	_, got := r.Get(queue)
	assert.False(t, got, "nothing is left to redeliver")
}
