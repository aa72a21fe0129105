package memory_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/internal/binding"
	"github.com/sluice-go/sluice/internal/topology"
)

func TestTopicMatch(t *testing.T) {
	cases := []struct {
		binding, key string
		want         bool
	}{
		{"order.created", "order.created", true},
		{"order.created", "order.shipped", false},
		{"order.*", "order.created", true},
		{"order.*", "order", false},
		{"order.*", "order.created.eu", false},
		{"order.#", "order", true},
		{"order.#", "order.created.eu", true},
		{"#", "", true},
		{"#", "anything.at.all", true},
		{"*.created", "order.created", true},
		{"#.created", "a.b.created", true},
		{"#.created", "a.b.shipped", false},
		{"a.#.z", "a.z", true},
		{"a.#.z", "a.b.c.z", true},
		{"a.*.z", "a.z", false},
	}
	for _, tc := range cases {
		t.Run(tc.binding+"~"+tc.key, func(t *testing.T) {
			require.Equal(t, tc.want, memory.TopicMatch(tc.binding, tc.key))
		})
	}
}

func TestExchangeRouting(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name    string
		binding binding.Binding
		key     string
		meta    map[string]string
		routed  bool
	}{
		{name: "topic match", binding: binding.Binding{Exchange: "x", Keys: []string{"order.*"}}, key: "order.created", routed: true},
		{name: "topic miss", binding: binding.Binding{Exchange: "x", Keys: []string{"order.*"}}, key: "invoice.paid"},
		{name: "direct match", binding: binding.Binding{Exchange: "x", Kind: binding.Direct, Keys: []string{"a", "b"}}, key: "b", routed: true},
		{name: "direct miss", binding: binding.Binding{Exchange: "x", Kind: binding.Direct, Keys: []string{"a"}}, key: "a.b"},
		{name: "fanout", binding: binding.Binding{Exchange: "x", Kind: binding.Fanout}, key: "whatever", routed: true},
		{name: "headers all", binding: binding.Binding{Exchange: "x", Kind: binding.Headers, Headers: map[string]string{"region": "eu", "tier": "gold"}}, meta: map[string]string{"region": "eu", "tier": "gold"}, routed: true},
		{name: "headers all, one differs", binding: binding.Binding{Exchange: "x", Kind: binding.Headers, Headers: map[string]string{"region": "eu", "tier": "gold"}}, meta: map[string]string{"region": "eu", "tier": "free"}},
		{name: "headers any", binding: binding.Binding{Exchange: "x", Kind: binding.Headers, MatchAny: true, Headers: map[string]string{"region": "eu", "tier": "gold"}}, meta: map[string]string{"region": "eu"}, routed: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := memory.New(memory.Config{})
			defer b.Close()
			require.NoError(t, b.DeclareSubscription(ctx, "q", []binding.Binding{tc.binding}, false))
			m := message.NewMessage("m1", []byte("p"))
			for k, v := range tc.meta {
				m.Metadata.Set(k, v)
			}
			require.NoError(t, b.PublishToExchange(ctx, "x", tc.key, m))
			if !tc.routed {
				require.Equal(t, 0, b.Len("q"))
				require.Len(t, b.Peek(topology.UnroutedQueue), 1)
				return
			}
			got := b.Peek("q")
			require.Len(t, got, 1)
			require.Equal(t, "x", got[0].Metadata.Get(binding.MetadataExchange))
			require.Equal(t, tc.key, got[0].Metadata.Get(binding.MetadataRoutingKey))
			require.Equal(t, 0, b.Len(topology.UnroutedQueue))
		})
	}
}

// Every subscriber gets each event once, even when several of its keys match; an event
// nobody is bound for is kept and replayed once someone subscribes.
func TestSubscribersAndUnroutedReplay(t *testing.T) {
	ctx := context.Background()
	b := memory.New(memory.Config{})
	defer b.Close()
	require.NoError(t, b.DeclareSubscription(ctx, "billing", []binding.Binding{{Exchange: "orders", Keys: []string{"order.*", "order.created"}}}, false))
	require.NoError(t, b.DeclareSubscription(ctx, "shipping", []binding.Binding{{Exchange: "orders", Keys: []string{"order.paid"}}}, false))
	for _, k := range []string{"order.created", "order.paid", "invoice.sent"} {
		require.NoError(t, b.PublishToExchange(ctx, "orders", k, message.NewMessage(k, nil)))
	}
	require.Equal(t, 2, b.Len("billing"))
	require.Equal(t, 1, b.Len("shipping"))
	require.Equal(t, 1, b.Len(topology.UnroutedQueue))

	n, err := b.ReplayUnrouted(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 1, b.Len(topology.UnroutedQueue), "still nobody bound: back in %s", topology.UnroutedQueue)

	require.NoError(t, b.DeclareSubscription(ctx, "invoices", []binding.Binding{{Exchange: "orders", Keys: []string{"invoice.#"}}}, false))
	n, err = b.ReplayUnrouted(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 0, b.Len(topology.UnroutedQueue))
	got := b.Peek("invoices")
	require.Len(t, got, 1)
	require.Equal(t, "invoice.sent", got[0].UUID)

	require.ErrorIs(t, b.DeclareExchange(ctx, "orders", binding.Fanout, false), broker.ErrInequivalent)
	require.NoError(t, b.DeclareExchange(ctx, "orders", binding.Fanout, true), "adopt uses it as it is")
	require.ErrorIs(t, b.PublishToExchange(ctx, "nowhere", "k", message.NewMessage("x", nil)), memory.ErrNoExchange)
}

// A retry of one subscriber's copy goes to its own queue: Delay names a queue, not an
// exchange, so the other subscriber never sees it again.
func TestDelayStaysWithTheSubscriber(t *testing.T) {
	ctx := context.Background()
	b := memory.New(memory.Config{})
	defer b.Close()
	for _, q := range []string{"a", "b"} {
		require.NoError(t, b.DeclareSubscription(ctx, q, []binding.Binding{{Exchange: "ev", Kind: binding.Fanout}}, false))
	}
	require.NoError(t, b.PublishToExchange(ctx, "ev", "", message.NewMessage("m", nil)))
	require.NoError(t, b.Delay(ctx, "a", time.Millisecond, b.Peek("a")[0]))
	require.Eventually(t, func() bool { return b.Len("a") == 2 }, time.Second, time.Millisecond)
	require.Equal(t, 1, b.Len("b"))
}
