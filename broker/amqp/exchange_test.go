package amqp_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

func TestBindingValidate(t *testing.T) {
	cases := []struct {
		name     string
		in       broker.Binding
		wantErr  bool
		wantKind broker.ExchangeKind
		wantKeys []string
	}{
		{name: "topic by default, every key", in: broker.Binding{Exchange: "orders"}, wantKind: broker.Topic, wantKeys: []string{"#"}},
		{name: "topic keys kept", in: broker.Binding{Exchange: "orders", Keys: []string{"order.*"}}, wantKind: broker.Topic, wantKeys: []string{"order.*"}},
		{name: "direct needs a key", in: broker.Binding{Exchange: "orders", Kind: broker.Direct}, wantErr: true},
		{name: "fanout takes no key", in: broker.Binding{Exchange: "orders", Kind: broker.Fanout}, wantKind: broker.Fanout},
		{name: "headers need headers", in: broker.Binding{Exchange: "orders", Kind: broker.Headers}, wantErr: true},
		{name: "headers only on headers", in: broker.Binding{Exchange: "orders", Headers: map[string]string{"a": "b"}}, wantErr: true},
		{name: "no exchange", in: broker.Binding{}, wantErr: true},
		{name: "unknown kind", in: broker.Binding{Exchange: "orders", Kind: "x-consistent-hash"}, wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.in
			err := b.Validate()
			if tc.wantErr {
				require.ErrorIs(t, err, broker.ErrBinding)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.wantKind, b.Kind)
			require.Equal(t, tc.wantKeys, b.Keys)
		})
	}
}

// deleteExchanges deletes exchanges when t ends (and now, for leftovers of an earlier run).
func deleteExchanges(t *testing.T, url string, names ...string) {
	del := func() {
		conn, err := amqp091.Dial(url)
		if err != nil {
			return
		}
		defer conn.Close()
		for _, n := range names {
			ch, err := conn.Channel()
			if err != nil {
				return
			}
			_ = ch.ExchangeDelete(n, false, false)
			_ = ch.Close()
		}
	}
	del()
	t.Cleanup(del)
}

// unroutedCopy finds the message with id in sluice.unrouted without consuming anything (the
// queue is shared by every test of the vhost) and returns it.
func unroutedCopy(t *testing.T, r *testenv.Rabbit, id string) (amqp091.Delivery, bool) {
	t.Helper()
	ch, err := r.Conn.Channel()
	require.NoError(t, err)
	defer ch.Close() // gives every message back
	for {
		d, ok, err := ch.Get(topology.UnroutedQueue, false)
		require.NoError(t, err)
		if !ok {
			return amqp091.Delivery{}, false
		}
		if d.MessageId == id || d.Headers["_watermill_message_uuid"] == id {
			return d, true
		}
	}
}

// Two queues bound with different keys to one topic exchange each get the events that
// match their keys; an event nobody is bound for lands in sluice.unrouted with its
// exchange, routing key, headers and payload, and its publish is confirmed, not returned.
func TestExchangeRoutesToSubscribersAndKeepsUnrouted(t *testing.T) {
	r := testenv.NewRabbit(t)
	testenv.LockUnrouted(t)
	b := newBroker(t, amqp.Config{})
	exchange := testenv.Name("test.orders")
	created, any := testenv.Name("test.created"), testenv.Name("test.any")
	deleteExchanges(t, r.URL, exchange)
	r.DeleteQueues(created, topology.DLQ(created), any, topology.DLQ(any))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, b.DeclareSubscription(ctx, created, []broker.Binding{{Exchange: exchange, Keys: []string{"order.created"}}}, false))
	require.NoError(t, b.DeclareSubscription(ctx, any, []broker.Binding{{Exchange: exchange, Keys: []string{"order.*"}}}, false))

	publish := func(id, key string) {
		m := message.NewMessage(id, []byte("payload "+id))
		m.Metadata.Set("tenant", "t1")
		require.NoError(t, b.PublishToExchange(ctx, exchange, key, m))
	}
	publish("c1", "order.created")
	publish("s1", "order.shipped")
	publish("u1", "invoice.paid")

	require.Eventually(t, func() bool { return r.Count(created) == 1 && r.Count(any) == 2 }, 10*time.Second, 20*time.Millisecond)
	d, ok := r.Get(created)
	require.True(t, ok)
	require.Equal(t, "order.created", d.RoutingKey)

	d, ok = unroutedCopy(t, r, "u1")
	require.True(t, ok, "the event nobody is bound for is kept in %s", topology.UnroutedQueue)
	require.Equal(t, exchange, d.Exchange)
	require.Equal(t, "invoice.paid", d.RoutingKey)
	require.Equal(t, "t1", d.Headers["tenant"])
	require.Equal(t, "payload u1", string(d.Body))
	removeUnrouted(t, r, "u1")
}

// removeUnrouted takes this test's message out of the shared sluice.unrouted.
func removeUnrouted(t *testing.T, r *testenv.Rabbit, id string) {
	t.Helper()
	ch, err := r.Conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	for {
		d, ok, err := ch.Get(topology.UnroutedQueue, false)
		require.NoError(t, err)
		if !ok {
			return
		}
		if d.MessageId == id || d.Headers["_watermill_message_uuid"] == id {
			require.NoError(t, d.Ack(false))
		}
	}
}

// A queue declared by a plain client with other arguments is refused with an error naming
// the argument, and adopted as it is when asked; an exchange likewise.
func TestAdoptOrRefuseExistingTopology(t *testing.T) {
	r := testenv.NewRabbit(t)
	b := newBroker(t, amqp.Config{})
	queue, exchange := testenv.Name("test.foreignq"), testenv.Name("test.foreignx")
	r.DeleteQueues(queue, topology.DLQ(queue))
	deleteExchanges(t, r.URL, exchange)
	ch, err := r.Conn.Channel()
	require.NoError(t, err)
	// The arguments sluice gives a queue, but of another type.
	_, err = ch.QueueDeclare(queue, true, false, false, false, amqp091.Table{
		"x-queue-type":              "quorum",
		"x-dead-letter-exchange":    topology.DeadLetterExchange,
		"x-dead-letter-routing-key": queue,
	})
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(exchange, amqp091.ExchangeDirect, true, false, false, false, nil))
	require.NoError(t, ch.Close())

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bindings := []broker.Binding{{Exchange: exchange, Kind: broker.Direct, Keys: []string{"k"}}}

	err = b.DeclareSubscription(ctx, queue, bindings, false)
	var ie *amqp.InequivalentError
	require.ErrorAs(t, err, &ie)
	require.ErrorIs(t, err, broker.ErrInequivalent)
	require.Equal(t, "queue", ie.What)
	require.Equal(t, "x-queue-type", ie.Argument)
	require.Contains(t, err.Error(), "adopt")

	err = b.DeclareExchange(ctx, exchange, broker.Direct, false)
	require.True(t, errors.As(err, &ie), "%v", err)
	require.Equal(t, "exchange", ie.What)
	require.Equal(t, amqp.AlternateExchangeArg, ie.Argument)

	require.NoError(t, b.DeclareSubscription(ctx, queue, bindings, true))
	require.NoError(t, b.PublishToExchange(ctx, exchange, "k", message.NewMessage("a1", []byte("x"))))
	require.Eventually(t, func() bool { return r.Count(queue) == 1 }, 10*time.Second, 20*time.Millisecond)
	// Adopted, the queue still has its failure paths: Q.dlq and the route back from the
	// delay cascade.
	require.NoError(t, b.DeadLetter(ctx, queue, message.NewMessage("d1", []byte("x"))))
	require.NoError(t, b.Delay(ctx, queue, 0, message.NewMessage("r1", []byte("x"))))
	require.Eventually(t, func() bool { return r.Count(topology.DLQ(queue)) == 1 && r.Count(queue) == 2 }, 10*time.Second, 20*time.Millisecond)
}

// Each exchange kind routes to the queue what its binding matches, and keeps the rest in
// sluice.unrouted.
func TestBindingKindsRouteOnRabbitMQ(t *testing.T) {
	r := testenv.NewRabbit(t)
	testenv.LockUnrouted(t)
	b := newBroker(t, amqp.Config{})
	cases := []struct {
		name    string
		binding broker.Binding
		key     string
		headers map[string]string
		routed  bool
	}{
		{name: "direct match", binding: broker.Binding{Kind: broker.Direct, Keys: []string{"a", "b"}}, key: "b", routed: true},
		{name: "direct miss", binding: broker.Binding{Kind: broker.Direct, Keys: []string{"a"}}, key: "a.b"},
		{name: "fanout", binding: broker.Binding{Kind: broker.Fanout}, key: "anything", routed: true},
		{name: "topic #", binding: broker.Binding{Keys: []string{"order.#"}}, key: "order.created.eu", routed: true},
		{name: "headers all", binding: broker.Binding{Kind: broker.Headers, Headers: map[string]string{"region": "eu", "tier": "gold"}}, headers: map[string]string{"region": "eu", "tier": "gold"}, routed: true},
		{name: "headers all, one differs", binding: broker.Binding{Kind: broker.Headers, Headers: map[string]string{"region": "eu", "tier": "gold"}}, headers: map[string]string{"region": "eu", "tier": "free"}},
		{name: "headers any", binding: broker.Binding{Kind: broker.Headers, MatchAny: true, Headers: map[string]string{"region": "eu", "tier": "gold"}}, headers: map[string]string{"region": "eu"}, routed: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			exchange, queue := testenv.Name("test.kinds"), testenv.Name("test.kinds.q")
			deleteExchanges(t, r.URL, exchange)
			r.DeleteQueues(queue, topology.DLQ(queue))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			tc.binding.Exchange = exchange
			require.NoError(t, b.DeclareSubscription(ctx, queue, []broker.Binding{tc.binding}, false))
			id := testenv.Name("m")
			m := message.NewMessage(id, []byte("x"))
			for k, v := range tc.headers {
				m.Metadata.Set(k, v)
			}
			require.NoError(t, b.PublishToExchange(ctx, exchange, tc.key, m))
			if tc.routed {
				require.Eventually(t, func() bool { return r.Count(queue) == 1 }, 10*time.Second, 20*time.Millisecond)
				return
			}
			require.Eventually(t, func() bool { _, ok := unroutedCopy(t, r, id); return ok }, 10*time.Second, 20*time.Millisecond)
			require.Equal(t, 0, r.Count(queue))
			removeUnrouted(t, r, id)
		})
	}
}
