package amqp_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// An output queue gets no dead-letter queue, and its consumer's later declaration agrees
// with it and adds the DLQ, on both queue types.
func TestOutputQueueHasNoDLQUntilConsumed(t *testing.T) {
	r := testenv.NewRabbit(t)
	for _, qt := range []amqp.QueueType{amqp.QueueClassic, amqp.QueueQuorum} {
		t.Run(string(qt), func(t *testing.T) {
			b := newBroker(t, amqp.Config{QueueType: qt})
			queue := testenv.Name("test.output." + string(qt))
			r.DeleteQueues(queue, topology.DLQ(queue))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			require.NoError(t, b.DeclareOutputQueue(ctx, queue))
			require.NoError(t, b.DeclareOutputQueue(ctx, queue), "declaring again is harmless")
			require.Equal(t, 0, r.Count(queue))
			require.Equal(t, -1, r.Count(topology.DLQ(queue)), "no DLQ for a queue only published to")
			require.NoError(t, b.DeclareQueue(ctx, queue), "the consumer's declaration agrees")
			require.Equal(t, 0, r.Count(topology.DLQ(queue)))
		})
	}
}
