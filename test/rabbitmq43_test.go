package test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/markers"
	"github.com/sluice-go/sluice/internal/membership"
	"github.com/sluice-go/sluice/internal/testkit/steptest"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// quorumEnv is rabbitEnv with quorum consumed queues (delivery limit 20, sluice's default
// and RabbitMQ 4.x's) and a short nack backoff, so redeliveries come quickly.
func quorumEnv(t *testing.T) *env {
	t.Helper()
	r := testenv.NewRabbit(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{r.URL}, Logger: testLogger(), QueueType: amqp.QueueQuorum, NackBackoffMax: 20 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return &env{name: "rabbitmq", broker: b, amqp: b, rabbit: r}
}

// RabbitMQ 4.x counts only basic.reject (and connection loss) toward a quorum queue's
// delivery limit, not a requeueing basic.nack. sluice's subscriber rejects a failure and
// nacks a message given back through no fault of its own; the broker's limit then catches
// a poison message, into sluice's DLQ, and never a message that was only given back.
func TestDeliveryLimitOn43(t *testing.T) {
	testenv.Require43(t)
	const limit = 20

	t.Run("a message that keeps failing is dead-lettered by the broker into sluice's DLQ", func(t *testing.T) {
		e := quorumEnv(t)
		queue := e.newQueue(t, "test.limit43.poison")
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		require.NoError(t, e.amqp.DeclareQueue(ctx, queue))
		// A plain Watermill router on sluice's subscriber, no retry step: every failure is
		// a nack to Watermill, a basic.reject to RabbitMQ.
		var deliveries atomic.Int64
		r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		require.NoError(t, err)
		sub := e.amqp.Subscriber(broker.SubscribeOptions{})
		r.AddConsumerHandler("poison", queue, sub, func(*message.Message) error {
			deliveries.Add(1)
			return errors.New("cannot parse the payment")
		})
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		t.Cleanup(func() {
			_ = r.Close()
			<-done
		})
		<-r.Running()
		e.publish(t, queue, message.NewMessage("poison-1", []byte("{")))
		require.Eventually(t, func() bool { return e.count(t, topology.DLQ(queue)) == 1 }, 60*time.Second, 20*time.Millisecond,
			"the broker dead-lettered the message after %d deliveries (so far %d)", limit, deliveries.Load())
		assert.Equal(t, int64(limit+1), deliveries.Load(), "the first delivery and %d redeliveries", limit)
		assert.Zero(t, e.count(t, queue))

		conn, err := amqp091.Dial(e.rabbit.URL)
		require.NoError(t, err)
		defer conn.Close()
		recs, err := dlq.Inspector{Conn: conn}.Show(ctx, queue, "poison-1")
		require.NoError(t, err)
		rec := recs[0]
		assert.Equal(t, "rabbitmq.delivery_limit", rec.ErrorType, "the record says the broker's delivery limit ended it")
		assert.Equal(t, queue, rec.OriginalQueue, "a replay goes back to the queue")
		t.Logf("RabbitMQ %s: %d deliveries, then dead-lettered into %s with error type %s", testenv.Version(), deliveries.Load(), topology.DLQ(queue), rec.ErrorType)
	})

	t.Run("a message returned unprocessed more often than the limit is still delivered", func(t *testing.T) {
		e := quorumEnv(t)
		queue := e.newQueue(t, "test.limit43.giveback")
		const returns = limit + 10
		// The handler's step returns the message unprocessed (what the breaker does while
		// its handler is paused) until it has done so returns times: each is a basic.nack,
		// which RabbitMQ does not count.
		var mu sync.Mutex
		attempts := 0
		succeeded := make(chan struct{})
		start(t, e, router.Config{}, func(s *router.Stack) {
			require.NoError(t, s.Handle("giveback", queue, func(m *message.Message) error {
				mu.Lock()
				defer mu.Unlock()
				attempts++
				if attempts <= returns {
					return markers.ReturnUnprocessed(errors.New("gateway breaker open: handler paused"))
				}
				close(succeeded)
				return nil
			}))
		})
		e.publish(t, queue, message.NewMessage("giveback-1", []byte("x")))
		select {
		case <-succeeded:
		case <-time.After(2 * time.Minute):
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("the message was not handled after %d returns (DLQ holds %d)", attempts, e.count(t, topology.DLQ(queue)))
		}
		assert.Zero(t, e.count(t, topology.DLQ(queue)), "the broker's delivery limit never dead-lettered a message returned unprocessed")
		t.Logf("RabbitMQ %s: returned unprocessed %d times (limit %d), then handled", testenv.Version(), returns, limit)
	})

	t.Run("a hand-off that keeps failing ends in sluice's DLQ by the delivery limit, not in a loop", func(t *testing.T) {
		e := quorumEnv(t)
		queue := e.newQueue(t, "test.limit43.handoff")
		var attempts atomic.Int64
		broken := steptest.DelayerFunc(func(ctx context.Context, q string, d time.Duration, m *message.Message) error {
			return e.amqp.Publisher().PublishTo(ctx, "sluice.test.missing-exchange", q, m)
		})
		start(t, e, router.Config{Retry: retry.Config{Delayer: broken, InitialDelay: 10 * time.Millisecond}}, func(s *router.Stack) {
			require.NoError(t, s.Handle("handoff", queue, func(*message.Message) error {
				attempts.Add(1)
				return errors.New("gateway: 503")
			}))
		})
		e.publish(t, queue, message.NewMessage("handoff-1", []byte("x")))
		require.Eventually(t, func() bool { return e.count(t, topology.DLQ(queue)) == 1 }, 2*time.Minute, 20*time.Millisecond,
			"dead-lettered by the broker after %d failed hand-offs (so far %d)", limit, attempts.Load())
		assert.Equal(t, int64(limit+1), attempts.Load())
		t.Logf("RabbitMQ %s: %d failed hand-offs, then the delivery limit moved the message to %s", testenv.Version(), attempts.Load(), topology.DLQ(queue))
	})
}

// RabbitMQ 4.3 denies deprecated features by default (transient non-exclusive queues,
// global QoS, ...; the test node denies them explicitly too). Everything sluice declares
// (consumed queues of both types and their DLQs, the delay cascade, partitions,
// subscriptions with sluice.unrouted, membership queues, the archive) is declared on it,
// and the node reports no deprecated feature used.
func TestDeclaresNoDeniedFeatureOn43(t *testing.T) {
	testenv.Require43(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	denied := map[string]bool{}
	var features []struct {
		Name  string `json:"name"`
		State string `json:"state"`
	}
	require.NoError(t, json.Unmarshal([]byte(testenv.Ctl(t, "-q", "--formatter", "json", "list_deprecated_features")), &features))
	for _, f := range features {
		denied[f.Name] = f.State == "denied"
	}
	assert.True(t, denied["transient_nonexcl_queues"], "the node denies transient non-exclusive queues")
	assert.True(t, denied["global_qos"], "the node denies global QoS")

	for _, qt := range []amqp.QueueType{amqp.QueueClassic, amqp.QueueQuorum} {
		t.Run(string(qt), func(t *testing.T) {
			r := testenv.NewRabbit(t)
			b, err := amqp.New(ctx, amqp.Config{URLs: []string{r.URL}, Logger: testLogger(), QueueType: qt})
			require.NoError(t, err)
			defer b.Close()
			queue := testenv.Name("test.denied43." + string(qt))
			parts := testenv.Name("test.denied43.parts." + string(qt))
			sub := testenv.Name("test.denied43.sub." + string(qt))
			exchange := testenv.Name("test.denied43.events")
			r.DeleteQueues(queue, topology.DLQ(queue), topology.DLQ(queue)+".archive", sub, topology.DLQ(sub), parts+".p0", parts+".p1", topology.DLQ(parts))
			require.NoError(t, b.DeclareQueue(ctx, queue))
			require.NoError(t, b.DeclareDelays(ctx, math.MaxInt64))
			require.NoError(t, b.Delay(ctx, queue, 100*time.Millisecond, message.NewMessage("delayed", []byte("x"))))
			require.NoError(t, b.DeclarePartitioned(ctx, parts, 2))
			require.NoError(t, b.DeclareSubscription(ctx, sub, []broker.Binding{{Exchange: exchange, Keys: []string{"payments.#"}}}, false))
			m, err := b.Join(ctx, queue, membership.Config{})
			require.NoError(t, err)
			require.NoError(t, m.Close())
			// A dead letter archived: the archive queue is declared by the operator.
			require.NoError(t, b.DeadLetter(ctx, queue, message.NewMessage("dead", []byte("x"))))
			conn, err := amqp091.Dial(r.URL)
			require.NoError(t, err)
			defer conn.Close()
			require.Eventually(t, func() bool { return r.Count(topology.DLQ(queue)) == 1 }, 10*time.Second, 10*time.Millisecond)
			res, err := dlq.Operator{Conn: conn}.Archive(ctx, queue, dlq.Selector{All: true}, dlq.Options{})
			require.NoError(t, err)
			assert.Equal(t, 1, res.Moved)
		})
	}
	used := testenv.Ctl(t, "-q", "--formatter", "json", "list_deprecated_features", "--used")
	var inUse []map[string]any
	require.NoError(t, json.Unmarshal([]byte(used), &inUse), used)
	assert.Empty(t, inUse, "no deprecated feature in use on the node")
}
