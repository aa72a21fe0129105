package amqp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
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

	sub := b.Subscriber(broker.SubscribeOptions{})
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

	sub := b.Subscriber(broker.SubscribeOptions{})
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

// A delay waits in one cascade queue per nonzero base-16 digit and passes the exchanges of
// the zero ones: delays of every shape (no digit, one, several, zeros between) all arrive.
func TestDelaysOfEveryDigitShapeArrive(t *testing.T) {
	r := testenv.NewRabbit(t)
	b := newBroker(t, amqp.Config{})
	queue := testenv.Name("test.delay.digits")
	declare(t, b, r, queue)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	units := []int{0, 1, 15, 16, 17, 0xff, 0x100, 0x101, 0x111}
	want := map[string]bool{}
	for _, u := range units {
		id := fmt.Sprintf("units-%#x", u)
		want[id] = true
		require.NoError(t, b.Delay(ctx, queue, time.Duration(u)*amqp.DelayResolution, message.NewMessage(id, []byte(id))))
	}
	msgs, err := b.Subscriber(broker.SubscribeOptions{Concurrency: 4}).Subscribe(ctx, queue)
	require.NoError(t, err)
	for len(want) > 0 {
		select {
		case msg := <-msgs:
			assert.True(t, want[msg.UUID], "unexpected or repeated message %q", msg.UUID)
			delete(want, msg.UUID)
			msg.Ack()
		case <-ctx.Done():
			t.Fatalf("delayed messages not delivered: %v", want)
		}
	}
}

// Messages parked in the binary cascade of sluice 0.1.0 (sluice.delay.00 … 25, one level a
// bit) when a vhost is upgraded still reach their queue: that cascade is left in place and
// dead-letters into the delivery exchange this version binds every queue to.
func TestDelayParkedInTheBinaryCascadeStillArrives(t *testing.T) {
	r := testenv.NewRabbit(t)
	b := newBroker(t, amqp.Config{})
	queue := testenv.Name("test.delay.upgrade")
	declareBinaryCascade(t, r, 3)
	declare(t, b, r, queue)

	// 5 units (50ms): binary 101 waits in levels 2 and 0, passes level 1's exchange.
	key := strings.Repeat("0.", amqp.DelayLevels-3) + "1.0.1." + queue
	ch, err := r.Conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	require.NoError(t, ch.Confirm(false))
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), topology.DelayLevel(2), key, true, false,
		amqp091.Publishing{MessageId: "parked", DeliveryMode: amqp091.Persistent, Body: []byte("0.1.0")})
	require.NoError(t, err)
	require.True(t, dc.Wait(), "publish to the binary cascade confirmed")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	msgs, err := b.Subscriber(broker.SubscribeOptions{}).Subscribe(ctx, queue)
	require.NoError(t, err)
	select {
	case msg := <-msgs:
		assert.Equal(t, "parked", msg.UUID)
		msg.Ack()
	case <-ctx.Done():
		t.Fatal("message parked in the binary cascade not delivered")
	}
}

// declareBinaryCascade declares the lowest levels of sluice 0.1.0's binary cascade as that
// version did: level k is a topic exchange and a quorum queue with TTL 2^k units that
// dead-letters to level k-1's exchange (level 0 to the delivery exchange); the exchange
// sends digit 1 to its queue, digit 0 on. On a vhost that still has them it changes nothing.
func declareBinaryCascade(t *testing.T, r *testenv.Rabbit, levels int) {
	t.Helper()
	ch, err := r.Conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	require.NoError(t, ch.ExchangeDeclare(topology.DelayDeliveryExchange, amqp091.ExchangeTopic, true, false, false, false, nil))
	for k := 0; k < levels; k++ {
		name := topology.DelayLevel(k)
		next := topology.DelayDeliveryExchange
		if k > 0 {
			next = topology.DelayLevel(k - 1)
		}
		require.NoError(t, ch.ExchangeDeclare(name, amqp091.ExchangeTopic, true, false, false, false, nil))
		_, err := ch.QueueDeclare(name, true, false, false, false, amqp091.Table{
			"x-queue-type":           "quorum",
			"x-message-ttl":          int64(time.Duration(1<<k) * amqp.DelayResolution / time.Millisecond),
			"x-dead-letter-exchange": next,
			"x-dead-letter-strategy": "at-least-once",
			"x-overflow":             "reject-publish",
		})
		require.NoError(t, err, "declare %s as sluice 0.1.0 did", name)
		prefix := strings.Repeat("*.", amqp.DelayLevels-1-k)
		require.NoError(t, ch.QueueBind(name, prefix+"1.#", name, false, nil))
		require.NoError(t, ch.ExchangeBind(next, prefix+"0.#", name, false, nil))
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

// A queue declared before with other arguments is refused with the argument named, every
// time: the refusal closes the declaring channel, and the declarations sent after it on
// that channel must not hide it behind "channel/connection is not open".
func TestDeclareQueue_RefusalNamesTheArgument(t *testing.T) {
	r := testenv.NewRabbit(t)
	b := newBroker(t, amqp.Config{QueueType: amqp.QueueQuorum})
	ch, err := r.Conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	for i := range 30 {
		queue := testenv.Name(fmt.Sprintf("test.refused.%d", i))
		r.DeleteQueues(queue, topology.DLQ(queue))
		_, err := ch.QueueDeclare(queue, true, false, false, false, amqp091.Table{"x-queue-type": "classic"})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err = b.DeclareQueue(ctx, queue)
		cancel()
		var refused *amqp091.Error
		require.ErrorAs(t, err, &refused, "declaration %d", i)
		assert.Equal(t, amqp091.PreconditionFailed, refused.Code, "declaration %d: %v", i, err)
		assert.Contains(t, refused.Reason, "inequivalent arg", "declaration %d", i)
	}
}
