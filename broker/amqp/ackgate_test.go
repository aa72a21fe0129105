package amqp_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

// A step that holds a delivery's ack (broker.Delivery.HoldAck, what the idempotency journal does)
// frees the handler's slot at once: with one handler at a time, the next message is handed
// out while the first one's ack waits. The held message is acknowledged when the wait
// returns nil, and goes back to its queue when it returns an error.
func TestSubscriberHeldAck(t *testing.T) {
	r := testenv.NewRabbit(t)
	b := newBroker(t, amqp.Config{})
	queue := testenv.Name("test.heldack")
	declare(t, b, r, queue)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs, err := b.Subscriber(broker.SubscribeOptions{Concurrency: 1, Prefetch: 4}).Subscribe(ctx, queue)
	require.NoError(t, err)
	require.NoError(t, b.Publisher().Publish(queue, message.NewMessage("m-1", []byte("1")), message.NewMessage("m-2", []byte("2"))))

	release := map[string]chan error{"m-1": make(chan error, 1), "m-2": make(chan error, 1)}
	next := func() *message.Message {
		t.Helper()
		select {
		case m := <-msgs:
			return m
		case <-ctx.Done():
			t.Fatal("no delivery")
			return nil
		}
	}
	for _, id := range []string{"m-1", "m-2"} {
		m := next()
		require.Equal(t, id, m.UUID, "handed out while the previous ack is held")
		wait := release[id]
		require.True(t, broker.DeliveryFrom(m.Context()).HoldAck(func(<-chan struct{}) error { return <-wait }))
		assert.False(t, broker.DeliveryFrom(m.Context()).HoldAck(func(<-chan struct{}) error { return nil }), "one hold a message")
		m.Ack()
	}
	// Both held: RabbitMQ still counts them unacknowledged, none ready.
	time.Sleep(200 * time.Millisecond)
	assert.Zero(t, r.Count(queue))

	release["m-1"] <- nil                                // confirmed: acknowledged
	release["m-2"] <- errors.New("record not confirmed") // given back
	m := next()
	assert.Equal(t, "m-2", m.UUID, "the message whose held ack failed is delivered again")
	assert.Equal(t, "true", m.Metadata.Get(amqp.MetadataRedelivered))
	m.Ack()
	require.Eventually(t, func() bool { return r.Count(queue) == 0 }, 10*time.Second, 20*time.Millisecond)
	select {
	case extra := <-msgs:
		t.Fatalf("%s delivered again: its held ack was released with nil", extra.UUID)
	case <-time.After(500 * time.Millisecond):
	}
}

// Outside a sluice subscriber (a plain context) nothing holds an ack: the step waits in
// place.
func TestHoldAckWithoutGate(t *testing.T) {
	assert.False(t, broker.DeliveryFrom(context.Background()).HoldAck(func(<-chan struct{}) error { return nil }))
}

// A held ack whose wait does not end by itself is ended when the subscriber closes and its
// drain timeout has passed: Close returns, the wait's stop is closed, and the message is
// back in its queue, not acknowledged.
func TestSubscriberHeldAckEndsOnClose(t *testing.T) {
	r := testenv.NewRabbit(t)
	b := newBroker(t, amqp.Config{DrainTimeout: 300 * time.Millisecond})
	queue := testenv.Name("test.heldack.close")
	declare(t, b, r, queue)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub := b.Subscriber(broker.SubscribeOptions{Concurrency: 1, Prefetch: 4})
	msgs, err := sub.Subscribe(ctx, queue)
	require.NoError(t, err)
	require.NoError(t, b.Publisher().Publish(queue, message.NewMessage("m-held", []byte("1"))))
	m := <-msgs
	stopped := make(chan struct{})
	require.True(t, broker.DeliveryFrom(m.Context()).HoldAck(func(stop <-chan struct{}) error {
		<-stop
		close(stopped)
		return errors.New("stopped waiting")
	}))
	m.Ack()
	closed := make(chan error, 1)
	go func() { closed <- sub.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for a held ack that never ends")
	}
	select {
	case <-stopped:
	default:
		t.Fatal("the held ack's wait was not stopped")
	}
	require.Eventually(t, func() bool { return r.Count(queue) == 1 }, 10*time.Second, 20*time.Millisecond, "the message is back in its queue")
}
