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

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// Every node refuses an exchange type it does not know the way it refuses x-consistent-hash
// without the plugin, so a made-up type exercises that path on any RabbitMQ.
func TestDeclarePartitionedWithoutThePluginSaysHowToEnableIt(t *testing.T) {
	restore := amqp.SetConsistentHashType("x-sluice-no-such-type")
	defer restore()
	r := testenv.NewRabbit(t)
	b := newBroker(t, amqp.Config{})
	queue := testenv.Name("test.partitioned.noplugin")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	err := b.DeclarePartitioned(ctx, queue, 2)
	require.ErrorIs(t, err, amqp.ErrConsistentHashUnavailable)
	assert.Contains(t, err.Error(), "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange")
	assert.Contains(t, err.Error(), queue, "the error names the exchange")
	assert.NotContains(t, err.Error(), "guest:guest", "the password is masked")
	assert.Equal(t, -1, r.Count(topology.Partition(queue, 0)), "nothing is declared behind a missing exchange")

	// RabbitMQ closed the connection the declaration ran on; the broker's own connection,
	// which its consumers and publishes use, is untouched.
	plain := testenv.Name("test.partitioned.after")
	declare(t, b, r, plain)
	require.NoError(t, b.Publisher().Publish(plain, message.NewMessage("m1", []byte("x"))))
	assert.Equal(t, 1, r.Count(plain))
}

func TestPublishPartitionedRejectsUnusableKeys(t *testing.T) {
	b := newBroker(t, amqp.Config{})
	cases := []struct {
		name string
		key  string
	}{
		{"empty", ""},
		{"longer than a routing key may be", strings.Repeat("k", amqp.MaxPartitionKeyBytes+1)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := b.PublishPartitioned(context.Background(), "q", tc.key, message.NewMessage("m", nil))
			require.ErrorIs(t, err, broker.ErrPartitionKey)
		})
	}
}

func TestConsumerCount(t *testing.T) {
	r := testenv.NewRabbit(t)
	b := newBroker(t, amqp.Config{})
	queue := testenv.Name("test.consumers")
	declare(t, b, r, queue)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	n, err := b.ConsumerCount(ctx, queue)
	require.NoError(t, err)
	assert.Equal(t, 0, n)

	ch, err := r.Conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.Consume(queue, "", false, false, false, false, nil)
	require.NoError(t, err)
	n, err = b.ConsumerCount(ctx, queue)
	require.NoError(t, err)
	assert.Equal(t, 1, n)

	_, err = b.ConsumerCount(ctx, testenv.Name("test.missing"))
	var amqpErr *amqp091.Error
	require.ErrorAs(t, err, &amqpErr)
	assert.Equal(t, amqp091.NotFound, amqpErr.Code)
}
