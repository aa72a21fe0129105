package amqp_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/broker/brokertest"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// The RabbitMQ broker meets package broker's contract (package brokertest), with every
// optional capability: prefetch, consumer counts, membership, stream journals. On RabbitMQ
// 4.3 its consumed queues are quorum queues with a delivery limit, where it also carries
// out native delayed retry and counts failed deliveries but not returns; on 3.10 they are
// classic queues, which count nothing, and native retry is refused. Partitioned queues
// need the consistent-hash exchange: where the shared node lacks it (the machine's 3.10),
// the suite runs on a node of its own that has it.
func TestConformance(t *testing.T) {
	cfg := amqp.Config{URLs: []string{partitionsURL(t)}, DrainTimeout: 500 * time.Millisecond}
	has := brokertest.Features{Prefetch: true, ConsumerCounter: true, Joiner: true, Journaler: true}
	if testenv.Is43() {
		cfg.QueueType, cfg.DeliveryLimit = amqp.QueueQuorum, 5
		has.NativeRetry, has.DeliveryLimit = true, cfg.DeliveryLimit
	}
	brokertest.Run(t, func(t *testing.T) broker.Broker {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		b, err := amqp.New(ctx, cfg)
		require.NoError(t, err)
		return b
	}, has)
}

// partitionsURL is the shared node's URL when it has the consistent-hash exchange
// (RabbitMQ 4.3's test node does), else a node's of the test's own with the plugin.
func partitionsURL(t *testing.T) string {
	t.Helper()
	b := newBroker(t, amqp.Config{})
	probe := testenv.Name("test.conformance.probe")
	err := b.DeclarePartitioned(context.Background(), probe, 1)
	if err == nil {
		testenv.NewRabbit(t).DeleteQueues(topology.Partition(probe, 0), topology.DLQ(probe), probe)
		return testenv.AMQPURL(t)
	}
	require.ErrorIs(t, err, amqp.ErrConsistentHashUnavailable)
	return testenv.StartNode(t, testenv.NodeOptions{Plugins: []string{"rabbitmq_consistent_hash_exchange"}}).URL()
}
