package brokertest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/binding"
	"github.com/sluice-go/sluice/internal/topology"
)

// Name names the messaging system, as telemetry reports it (messaging.system): not empty,
// the same on every call.
func (s *suite) name(t *testing.T) {
	b := s.broker(t)
	n := b.Name()
	assert.NotEmpty(t, n)
	assert.Equal(t, n, b.Name(), "one name")
}

// DeclareQueue declares a queue with its dead-letter queue, Q.dlq; declaring it again is
// harmless and keeps its messages.
func (s *suite) declareQueue(t *testing.T) {
	b := s.broker(t)
	q := queue(t, b)
	assert.Zero(t, ready(t, b, q), "a new queue is empty")
	assert.Zero(t, ready(t, b, topology.DLQ(q)), "its dead-letter queue exists")
	publish(t, b, q, newMessage("kept"))
	eventuallyReady(t, b, q, 1)
	require.NoError(t, b.DeclareQueue(ctx(t), q), "declared again")
	eventuallyReady(t, b, q, 1, "declaring again keeps the messages")
}

// DeclareOutputQueue declares a queue the stack only publishes to: what is published there
// is kept for its consumer, and the consumer's DeclareQueue, later, adds the failure paths
// and keeps the messages.
func (s *suite) declareOutputQueue(t *testing.T) {
	b := s.broker(t)
	q := name(t, "out")
	require.NoError(t, b.DeclareOutputQueue(ctx(t), q))
	m := newMessage("output")
	publish(t, b, q, m)
	eventuallyReady(t, b, q, 1)
	require.NoError(t, b.DeclareQueue(ctx(t), q), "its consumer declares it")
	eventuallyReady(t, b, q, 1, "the consumer's declaration keeps the messages")
	assert.Zero(t, ready(t, b, topology.DLQ(q)), "and adds the dead-letter queue")
	got := subscribe(t, b, q, broker.SubscribeOptions{}).next(t)
	sameMessage(t, m, got)
	got.Ack()
}

// PublishConfirmed returns once the messages are in the queue: a subscriber gets them in
// the order published, with their id, payload and metadata. A context already ended is
// an error wrapping its cause.
func (s *suite) publishConfirmed(t *testing.T) {
	b := s.broker(t)
	q := queue(t, b)
	msgs := []*message.Message{newMessage("one"), newMessage("two"), newMessage("three")}
	publish(t, b, q, msgs...)
	eventuallyReady(t, b, q, 3, "confirmed messages are in the queue")
	sub := subscribe(t, b, q, broker.SubscribeOptions{})
	for _, want := range msgs {
		got := sub.next(t)
		sameMessage(t, want, got)
		got.Ack()
	}

	ended, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, b.PublishConfirmed(ended, q, newMessage("late")), context.Canceled)
}

// DeclarePartitioned declares partitions queues (topology.Partition) sharing one
// dead-letter queue; PublishPartitioned sends every message of a key to the same
// partition, in order, and spreads keys over the partitions; an empty key is an error
// wrapping broker.ErrPartitionKey. Declaring again with the same count is harmless; a
// partition's dead letters go to the shared dead-letter queue.
func (s *suite) declarePartitioned(t *testing.T) {
	b := s.broker(t)
	q := name(t, "parts")
	const partitions = 3
	require.NoError(t, b.DeclarePartitioned(ctx(t), q, partitions))
	require.NoError(t, b.DeclarePartitioned(ctx(t), q, partitions), "declared again")
	for k := range partitions {
		assert.Zero(t, ready(t, b, topology.Partition(q, k)), "partition %d exists", k)
	}
	assert.Zero(t, ready(t, b, topology.DLQ(q)), "the shared dead-letter queue exists")

	// One key: one partition, in order.
	same := []*message.Message{newMessage("k1"), newMessage("k2"), newMessage("k3")}
	require.NoError(t, b.PublishPartitioned(ctx(t), q, "customer-1", same...))
	depths := func() []int64 {
		out := make([]int64, partitions)
		for k := range partitions {
			out[k] = readyNow(b, topology.Partition(q, k))
		}
		return out
	}
	var held int
	require.Eventually(t, func() bool {
		for k, n := range depths() {
			if n == int64(len(same)) {
				held = k
				return true
			}
		}
		return false
	}, eventually, tick, "every message of one key in one partition")
	sub := subscribe(t, b, topology.Partition(q, held), broker.SubscribeOptions{})
	for _, want := range same {
		got := sub.next(t)
		sameMessage(t, want, got)
		got.Ack()
	}
	sub.close(t)

	// Many keys: every partition.
	for i := range 30 {
		require.NoError(t, b.PublishPartitioned(ctx(t), q, fmt.Sprintf("key-%d", i), newMessage("spread")))
	}
	require.Eventually(t, func() bool {
		var sum int64
		for _, n := range depths() {
			sum += n
		}
		return sum == 30
	}, eventually, tick, "30 messages in the partitions")
	for k, n := range depths() {
		assert.Positive(t, n, "30 keys are spread over the partitions: partition %d has none", k)
	}

	assert.ErrorIs(t, b.PublishPartitioned(ctx(t), q, "", newMessage("no key")), broker.ErrPartitionKey)

	dead := newMessage("dead")
	require.NoError(t, b.DeadLetter(ctx(t), topology.Partition(q, 1), dead))
	got := subscribe(t, b, topology.DLQ(q), broker.SubscribeOptions{}).next(t)
	sameMessage(t, dead, got)
	got.Ack()
}

// DeclareExchange declares an exchange of each kind (zero: topic); declaring it again
// with its kind is harmless, with another kind an error wrapping broker.ErrInequivalent,
// unless adopt, which takes it as it is. An empty name or an unknown kind is an error
// wrapping broker.ErrBinding.
func (s *suite) declareExchange(t *testing.T) {
	b := s.broker(t)
	for _, kind := range []broker.ExchangeKind{"", broker.Topic, broker.Direct, broker.Fanout, broker.Headers} {
		ex := name(t, "ex."+string(kind))
		require.NoError(t, b.DeclareExchange(ctx(t), ex, kind, false), "kind %q", kind)
		require.NoError(t, b.DeclareExchange(ctx(t), ex, kind, false), "kind %q declared again", kind)
	}
	ex := name(t, "ex.inequivalent")
	require.NoError(t, b.DeclareExchange(ctx(t), ex, broker.Topic, false))
	assert.ErrorIs(t, b.DeclareExchange(ctx(t), ex, broker.Fanout, false), broker.ErrInequivalent)
	assert.NoError(t, b.DeclareExchange(ctx(t), ex, broker.Fanout, true), "adopted as it is")

	assert.ErrorIs(t, b.DeclareExchange(ctx(t), "", broker.Topic, false), broker.ErrBinding)
	assert.ErrorIs(t, b.DeclareExchange(ctx(t), name(t, "ex.unknown"), "x-unknown", false), broker.ErrBinding)
}

// DeclareSubscription binds a queue to exchanges; PublishToExchange routes an event to
// every queue whose binding matches (topic keys with * and #, direct keys, fanout, header
// values), each queue once, with its exchange and routing key in metadata
// (amqp-exchange, amqp-routing-key); an event a binding does not match is not delivered.
// An invalid binding is an error wrapping broker.ErrBinding.
func (s *suite) declareSubscription(t *testing.T) {
	tests := []struct {
		name          string
		binding       broker.Binding
		match, other  string            // routing keys
		matchMetadata map[string]string // for a headers exchange
	}{
		{name: "topic", binding: broker.Binding{Kind: broker.Topic, Keys: []string{"order.*", "order.#"}}, match: "order.created", other: "invoice.created"},
		{name: "direct", binding: broker.Binding{Kind: broker.Direct, Keys: []string{"eu"}}, match: "eu", other: "us"},
		{name: "fanout", binding: broker.Binding{Kind: broker.Fanout}, match: "anything", other: ""},
		{name: "headers", binding: broker.Binding{Kind: broker.Headers, Headers: map[string]string{"region": "eu"}}, match: "k", other: "k", matchMetadata: map[string]string{"region": "eu"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := s.broker(t)
			ex := name(t, "ex")
			bd := tt.binding
			bd.Exchange = ex
			first, second := name(t, "sub1"), name(t, "sub2")
			require.NoError(t, b.DeclareSubscription(ctx(t), first, []broker.Binding{bd}, false))
			require.NoError(t, b.DeclareSubscription(ctx(t), second, []broker.Binding{bd}, false))
			assert.Zero(t, ready(t, b, topology.DLQ(first)), "the subscriber's queue has its failure paths")

			if tt.name != "fanout" {
				// Published first: were it routed, it would come before the match.
				miss := newMessage("miss")
				if tt.matchMetadata != nil {
					miss.Metadata.Set("region", "us")
				}
				require.NoError(t, b.PublishToExchange(ctx(t), ex, tt.other, miss))
			}
			hit := newMessage("hit")
			for k, v := range tt.matchMetadata {
				hit.Metadata.Set(k, v)
			}
			require.NoError(t, b.PublishToExchange(ctx(t), ex, tt.match, hit))
			for _, q := range []string{first, second} {
				sub := subscribe(t, b, q, broker.SubscribeOptions{})
				got := sub.next(t)
				sameMessage(t, hit, got)
				assert.Equal(t, ex, got.Metadata.Get(binding.MetadataExchange), "the exchange it came from")
				assert.Equal(t, tt.match, got.Metadata.Get(binding.MetadataRoutingKey), "its routing key")
				got.Ack()
				sub.none(t, "every matching queue gets an event once, and no other event")
			}
		})
	}
	t.Run("invalid", func(t *testing.T) {
		t.Parallel()
		b := s.broker(t)
		err := b.DeclareSubscription(ctx(t), name(t, "sub"), []broker.Binding{{Exchange: name(t, "ex"), Kind: broker.Direct}}, false)
		assert.ErrorIs(t, err, broker.ErrBinding, "a direct binding needs a key")
	})
}

// DeadLetter puts a copy of the message in the queue's dead-letter queue, confirmed, and
// nothing in the queue itself.
func (s *suite) deadLetterer(t *testing.T) {
	b := s.broker(t)
	q := queue(t, b)
	m := newMessage("dead")
	require.NoError(t, b.DeadLetter(ctx(t), q, m))
	eventuallyReady(t, b, topology.DLQ(q), 1)
	assert.Zero(t, ready(t, b, q))
	got := subscribe(t, b, topology.DLQ(q), broker.SubscribeOptions{}).next(t)
	sameMessage(t, m, got)
	got.Ack()
}

// QueueDepth counts a queue's ready messages (not those with a handler), and, on a broker
// that counts consumers (Features.ConsumerCounter), its consumers; a queue that does not
// exist is an error wrapping sluice.ErrQueueNotFound.
func (s *suite) queueDepth(t *testing.T) {
	b := s.broker(t)
	_, err := b.QueueDepth(ctx(t), name(t, "missing"))
	require.ErrorIs(t, err, sluice.ErrQueueNotFound)

	q := queue(t, b)
	publish(t, b, q, newMessage("1"), newMessage("2"), newMessage("3"))
	eventuallyReady(t, b, q, 3)
	sub := subscribe(t, b, q, broker.SubscribeOptions{Concurrency: 1, Prefetch: 1})
	m := sub.next(t)
	eventuallyReady(t, b, q, 2, "the message with a handler is not ready")
	if s.has.ConsumerCounter {
		d, err := b.QueueDepth(ctx(t), q)
		require.NoError(t, err)
		assert.EqualValues(t, 1, d.Consumers, "one consumer")
	}
	m.Ack()
	sub.next(t).Ack()
	sub.next(t).Ack()
	eventuallyReady(t, b, q, 0, "all taken")
}

// Close closes the broker: its subscriptions end (their channels close), and declaring,
// publishing and subscribing afterwards are errors wrapping broker.ErrClosed.
func (s *suite) close(t *testing.T) {
	b := s.broker(t)
	q := queue(t, b)
	sub := subscribe(t, b, q, broker.SubscribeOptions{})
	require.NoError(t, b.Close())
	select {
	case _, ok := <-sub.msgs:
		assert.False(t, ok, "nothing delivered after Close")
	case <-time.After(eventually):
		assert.Fail(t, "the subscription did not end with its broker")
	}
	assert.ErrorIs(t, b.DeclareQueue(context.Background(), name(t, "after")), broker.ErrClosed, "DeclareQueue")
	assert.ErrorIs(t, b.PublishConfirmed(context.Background(), q, newMessage("after")), broker.ErrClosed, "PublishConfirmed")
	_, err := b.Subscriber(broker.SubscribeOptions{}).Subscribe(context.Background(), q)
	assert.ErrorIs(t, err, broker.ErrClosed, "Subscribe")
}
