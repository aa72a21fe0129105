package amqp_test

import (
	"context"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// TestQuorumDLQHasNoReachableDeliveryLimit: a quorum DLQ is declared with topology.NoDeliveryLimit,
// and a quorum DLQ an earlier sluice declared without it is kept as it is.
func TestQuorumDLQHasNoReachableDeliveryLimit(t *testing.T) {
	cases := []struct {
		name     string
		existing amqp091.Table // Q.dlq declared by hand first; nil: none
	}{
		{name: "new DLQ"},
		{name: "DLQ of an earlier sluice", existing: amqp091.Table{"x-queue-type": "quorum"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := testenv.NewRabbit(t)
			queue := testenv.Name("test.dlqlimit")
			dlq := topology.DLQ(queue)
			r.DeleteQueues(queue, dlq)
			ch, err := r.Conn.Channel()
			require.NoError(t, err)
			defer ch.Close()
			if tc.existing != nil {
				_, err := ch.QueueDeclare(dlq, true, false, false, false, tc.existing)
				require.NoError(t, err)
			}
			b := newBroker(t, amqp.Config{QueueType: amqp.QueueQuorum})
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			require.NoError(t, b.DeclareQueue(ctx, queue))

			want := amqp091.Table(topology.DeadLetterArgs(string(amqp.QueueQuorum), nil))
			if tc.existing != nil {
				want = tc.existing
			}
			_, err = ch.QueueDeclare(dlq, true, false, false, false, want)
			assert.NoError(t, err, "Q.dlq has the arguments %v", want)
		})
	}
	assert.Equal(t, int64(1<<31-1), topology.DeadLetterArgs(string(amqp.QueueQuorum), nil)["x-delivery-limit"])
	assert.NotContains(t, topology.DeadLetterArgs(string(amqp.QueueClassic), nil), "x-delivery-limit")
}
