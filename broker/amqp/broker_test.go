package amqp_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

func newBroker(t *testing.T, cfg amqp.Config) *amqp.Broker {
	t.Helper()
	cfg.URLs = []string{testenv.AMQPURL(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func declare(t *testing.T, b *amqp.Broker, r *testenv.Rabbit, queue string) {
	t.Helper()
	r.DeleteQueues(queue, topology.DLQ(queue))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, b.DeclareQueue(ctx, queue))
}

func TestForeignProducerWithTypedHeadersIsConsumedOnce(t *testing.T) {
	r := testenv.NewRabbit(t)
	b := newBroker(t, amqp.Config{})
	queue := testenv.Name("test.foreign")
	declare(t, b, r, queue)

	r.Publish(queue, amqp091.Publishing{
		MessageId:   "foreign-1",
		ContentType: "application/json",
		Headers: amqp091.Table{
			"attempt": int32(3),
			"meta":    amqp091.Table{"source": "pika", "n": int64(7)},
		},
		Body: []byte(`{"hello":"world"}`),
	})

	sub := b.Subscriber(amqp.SubscribeOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := sub.Subscribe(ctx, queue)
	require.NoError(t, err)

	select {
	case msg := <-msgs:
		assert.Equal(t, "foreign-1", msg.UUID)
		assert.Equal(t, "3", msg.Metadata.Get("attempt"))
		assert.JSONEq(t, `{"source":"pika","n":7}`, msg.Metadata.Get("meta"))
		assert.Equal(t, "application/json", msg.Metadata.Get(amqp.MetadataContentType))
		msg.Ack()
	case <-time.After(10 * time.Second):
		t.Fatal("message not delivered")
	}
	select {
	case msg := <-msgs:
		t.Fatalf("message delivered again: %s", msg.UUID)
	case <-time.After(1 * time.Second):
	}
	require.NoError(t, sub.Close())
	assert.Equal(t, 0, r.Count(queue), "queue must be empty after the ack")
}

func TestUnroutablePublishReturnsError(t *testing.T) {
	b := newBroker(t, amqp.Config{})
	err := b.Publisher().Publish(testenv.Name("test.nowhere"), message.NewMessage("m1", []byte("x")))
	require.ErrorIs(t, err, amqp.ErrUnroutable)
}

func TestPublishToMissingExchangeFailsFast(t *testing.T) {
	b := newBroker(t, amqp.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	err := b.Publisher().PublishTo(ctx, testenv.Name("no.such.exchange"), "k", message.NewMessage("m1", []byte("x")))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "NOT_FOUND")
	assert.Less(t, time.Since(start), 5*time.Second, "a missing exchange must not be retried until the deadline")
}

func TestShortDelayOvertakesLongDelay(t *testing.T) {
	r := testenv.NewRabbit(t)
	b := newBroker(t, amqp.Config{})
	queue := testenv.Name("test.delay")
	declare(t, b, r, queue)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, b.Delay(ctx, queue, 30*time.Second, message.NewMessage("long", []byte("30s"))))
	require.NoError(t, b.Delay(ctx, queue, 1*time.Second, message.NewMessage("short", []byte("1s"))))

	sub := b.Subscriber(amqp.SubscribeOptions{})
	msgs, err := sub.Subscribe(ctx, queue)
	require.NoError(t, err)
	select {
	case msg := <-msgs:
		elapsed := time.Since(start)
		assert.Equal(t, "short", msg.UUID, "the 1s message must not wait behind the 30s one")
		assert.GreaterOrEqual(t, elapsed, 990*time.Millisecond)
		assert.Less(t, elapsed, 2*time.Second)
		msg.Ack()
	case <-ctx.Done():
		t.Fatal("short-delayed message not delivered")
	}
}

// A node may negotiate a frame_max below RabbitMQ's default, and a content header over it
// makes RabbitMQ close the connection. A publish fits its headers to what was negotiated.
func TestPublishFitsHeadersToTheNegotiatedFrameMax(t *testing.T) {
	r := testenv.NewRabbit(t)
	b := newBroker(t, amqp.Config{FrameMax: 8192})
	queue := testenv.Name("test.framemax")
	declare(t, b, r, queue)

	msg := message.NewMessage("big-1", []byte("x"))
	msg.Metadata.Set("big", strings.Repeat("b", 20000)) // fits 131072, not 8192
	msg.Metadata.Set("small", "kept")
	require.NoError(t, b.Publisher().Publish(queue, msg))

	d, ok := r.Get(queue)
	require.True(t, ok, "the message must be in the queue")
	assert.NotContains(t, d.Headers, "big")
	assert.Equal(t, "kept", d.Headers["small"])
	assert.Equal(t, "big", d.Headers[headers.Dropped])
	assert.Equal(t, "big-1", d.MessageId)

	// The connection is still the one that published: no reconnect, no lost confirm.
	require.NoError(t, b.Publisher().Publish(queue, message.NewMessage("small-2", []byte("y"))))
	d, ok = r.Get(queue)
	require.True(t, ok)
	assert.Equal(t, "small-2", d.MessageId)
}

func TestFrameMaxBelowTheAMQPMinimumIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := amqp.New(ctx, amqp.Config{URLs: []string{testenv.AMQPURL(t)}, FrameMax: 1024})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "FrameMax 1024")
}
