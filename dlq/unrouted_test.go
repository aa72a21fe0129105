package dlq_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// unroutedFixture is an exchange sluice declared (with its alternate exchange) and a
// broker to publish to it.
type unroutedFixture struct {
	rabbit   *testenv.Rabbit
	broker   *amqp.Broker
	exchange string
}

func newUnroutedFixture(t *testing.T) *unroutedFixture {
	t.Helper()
	r := testenv.NewRabbit(t)
	testenv.LockUnrouted(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{r.URL}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	fx := &unroutedFixture{rabbit: r, broker: b, exchange: testenv.Name("test.unrouted")}
	require.NoError(t, b.DeclareExchange(ctx, fx.exchange, broker.Topic, false))
	t.Cleanup(func() {
		ch, err := r.Conn.Channel()
		if err != nil {
			return
		}
		defer ch.Close()
		_ = ch.ExchangeDelete(fx.exchange, false, false)
		// Leave the shared sluice.unrouted without this test's events.
		for {
			d, ok, err := ch.Get(dlq.UnroutedQueue, false)
			if err != nil || !ok {
				return
			}
			if dlq.NewUnroutedEvent(d, 0).Exchange == fx.exchange {
				_ = d.Ack(false)
			}
		}
	})
	return fx
}

func (fx *unroutedFixture) publish(t *testing.T, id, key string) {
	t.Helper()
	m := message.NewMessage(id, []byte(`{"id":"`+id+`"}`))
	m.Metadata.Set("tenant", "acme")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, fx.broker.PublishToExchange(ctx, fx.exchange, key, m))
}

func (fx *unroutedFixture) list(t *testing.T) []dlq.UnroutedEvent {
	t.Helper()
	l, err := dlq.ListUnrouted(context.Background(), fx.rabbit.Conn, dlq.UnroutedSelector{Exchange: fx.exchange}, 0)
	require.NoError(t, err)
	return l.Events
}

func TestUnroutedListAndReplay(t *testing.T) {
	fx := newUnroutedFixture(t)
	ctx := context.Background()
	fx.publish(t, "e1", "order.created")
	fx.publish(t, "e2", "order.paid")

	events := fx.list(t)
	require.Len(t, events, 2)
	assert.Equal(t, "e1", events[0].ID)
	assert.Equal(t, fx.exchange, events[0].Exchange)
	assert.Equal(t, "order.created", events[0].RoutingKey)
	assert.Equal(t, "acme", events[0].Headers["tenant"])
	assert.Equal(t, `{"id":"e1"}`, events[0].Payload)
	assert.Len(t, fx.list(t), 2, "listing leaves the events where they are")

	res, err := dlq.ReplayUnrouted(ctx, fx.rabbit.Conn, dlq.UnroutedSelector{Exchange: fx.exchange}, true)
	require.NoError(t, err)
	require.Len(t, res.Replayed, 2)
	assert.Len(t, fx.list(t), 2, "a dry run changes nothing")

	// Nobody bound yet: the events come back, once each, counted as replayed.
	res, err = dlq.ReplayUnrouted(ctx, fx.rabbit.Conn, dlq.UnroutedSelector{Exchange: fx.exchange}, false)
	require.NoError(t, err)
	require.Len(t, res.Replayed, 2)
	require.Eventually(t, func() bool { return len(fx.list(t)) == 2 }, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, 1, fx.list(t)[0].Replays)

	queue := testenv.Name("test.unrouted.sub")
	fx.rabbit.DeleteQueues(queue, topology.DLQ(queue))
	require.NoError(t, fx.broker.DeclareSubscription(ctx, queue, []broker.Binding{{Exchange: fx.exchange, Keys: []string{"order.paid"}}}, false))
	res, err = dlq.ReplayUnrouted(ctx, fx.rabbit.Conn, dlq.UnroutedSelector{Exchange: fx.exchange, RoutingKey: "order.paid"}, false)
	require.NoError(t, err)
	require.Len(t, res.Replayed, 1)
	require.Eventually(t, func() bool { return fx.rabbit.Count(queue) == 1 }, 10*time.Second, 20*time.Millisecond)
	d, ok := fx.rabbit.Get(queue)
	require.True(t, ok)
	assert.Equal(t, "order.paid", d.RoutingKey)
	assert.Equal(t, "2", d.Headers[headers.ReplayCount])
	assert.Equal(t, "acme", d.Headers["tenant"])
	left := fx.list(t)
	require.Len(t, left, 1)
	assert.Equal(t, "e1", left[0].ID)
}

// An event whose exchange is gone stays; one whose exchange now routes it nowhere and has
// no alternate exchange is put back, naming its exchange and routing key.
func TestUnroutedReplayKeepsWhatCannotGoBack(t *testing.T) {
	fx := newUnroutedFixture(t)
	ctx := context.Background()
	fx.publish(t, "gone-1", "order.created")
	ch, err := fx.rabbit.Conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDelete(fx.exchange, false, false))
	_, err = dlq.ReplayUnrouted(ctx, fx.rabbit.Conn, dlq.UnroutedSelector{Exchange: fx.exchange}, false)
	require.ErrorIs(t, err, dlq.ErrNoExchange)
	require.Len(t, fx.list(t), 1, "the event stays")

	// Redeclared by someone else, without an alternate exchange.
	require.NoError(t, ch.ExchangeDeclare(fx.exchange, amqp091.ExchangeTopic, true, false, false, false, nil))
	require.NoError(t, ch.Close())
	res, err := dlq.ReplayUnrouted(ctx, fx.rabbit.Conn, dlq.UnroutedSelector{Exchange: fx.exchange}, false)
	require.Error(t, err)
	require.Len(t, res.Failed, 1)
	events := fx.list(t)
	require.Len(t, events, 1, "the returned event is back")
	assert.Equal(t, fx.exchange, events[0].Exchange)
	assert.Equal(t, "order.created", events[0].RoutingKey)
	assert.Equal(t, "gone-1", events[0].ID)
}
