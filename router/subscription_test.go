package router_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/binding"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry"
)

func TestSubscriptionRegistrationErrors(t *testing.T) {
	mem := memory.New(memory.Config{Logger: silentLogger})
	t.Cleanup(func() { _ = mem.Close() })
	noop := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	cases := []struct {
		name   string
		broker router.Broker
		output string
		opts   []router.HandlerOption
		want   error
	}{
		{
			name:   "output queue and output exchange",
			broker: mem,
			output: "out",
			opts:   []router.HandlerOption{router.WithOutputExchange(router.Output{Exchange: "events"})},
			want:   router.ErrInvalidOption,
		},
		{
			name:   "output exchange without a name",
			broker: mem,
			opts:   []router.HandlerOption{router.WithOutputExchange(router.Output{})},
			want:   router.ErrInvalidOption,
		},
		{
			name:   "subscription with partitions",
			broker: mem,
			opts:   []router.HandlerOption{router.WithSubscription(router.Binding{Exchange: "orders"}), router.WithPartitions(2)},
			want:   router.ErrInvalidOption,
		},
		{
			name:   "binding without an exchange",
			broker: mem,
			opts:   []router.HandlerOption{router.WithSubscription(router.Binding{Keys: []string{"a"}})},
			want:   router.ErrInvalidOption,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := router.New(tc.broker, router.Config{Logger: silentLogger})
			require.NoError(t, err)
			err = s.HandleWithOutput("h", "in", tc.output, noop, tc.opts...)
			require.ErrorIs(t, err, tc.want)
		})
	}
}

// runSubscribed runs s until the test ends.
func runSubscribed(t *testing.T, s *router.Stack) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-s.Running():
	case err := <-done:
		t.Fatalf("stack stopped at start: %v", err)
	}
	t.Cleanup(func() {
		_ = s.Close()
		cancel()
		<-done
	})
}

// A subscriber consumes what the exchange routes to its queue; its outputs go to the
// output exchange with the handler's routing key or the message's own, the metadata key
// that chose it removed, and an output nobody is bound for is kept in sluice.unrouted.
func TestSubscriptionAndExchangeOutputOnTheEmbeddedBroker(t *testing.T) {
	mem := memory.New(memory.Config{Logger: silentLogger})
	t.Cleanup(func() { _ = mem.Close() })
	ctx := context.Background()
	s, err := router.New(mem, router.Config{Logger: silentLogger})
	require.NoError(t, err)
	require.NoError(t, s.HandleWithOutput("fraud", "fraud.checks", "", func(m *message.Message) ([]*message.Message, error) {
		ok := message.NewMessage("ok-"+m.UUID, m.Payload)
		odd := message.NewMessage("odd-"+m.UUID, m.Payload)
		odd.Metadata.Set(router.RoutingKeyMetadata, "check.flagged")
		return []*message.Message{ok, odd}, nil
	},
		router.WithSubscription(router.Binding{Exchange: "orders", Kind: broker.Direct, Keys: []string{"order.created"}}),
		router.WithOutputExchange(router.Output{Exchange: "checks", Kind: broker.Topic, RoutingKey: "check.passed"}),
	))
	runSubscribed(t, s)
	require.NoError(t, mem.DeclareSubscription(ctx, "audit", []binding.Binding{{Exchange: "checks", Keys: []string{"check.passed"}}}, false))

	require.NoError(t, mem.PublishToExchange(ctx, "orders", "order.created", message.NewMessage("o1", []byte("x"))))
	require.NoError(t, mem.PublishToExchange(ctx, "orders", "order.paid", message.NewMessage("o2", []byte("x"))))
	require.Eventually(t, func() bool { return mem.Len("audit") == 1 && mem.Len(topology.UnroutedQueue) == 2 }, 5*time.Second, 5*time.Millisecond)

	audit := mem.Peek("audit")[0]
	require.Equal(t, "ok-o1", audit.UUID)
	require.Equal(t, "check.passed", audit.Metadata.Get(binding.MetadataRoutingKey))
	require.Empty(t, audit.Metadata.Get(router.RoutingKeyMetadata))
	unrouted := map[string]string{}
	for _, m := range mem.Peek(topology.UnroutedQueue) {
		unrouted[m.UUID] = m.Metadata.Get(binding.MetadataExchange) + " " + m.Metadata.Get(binding.MetadataRoutingKey)
		require.Empty(t, m.Metadata.Get(router.RoutingKeyMetadata))
	}
	require.Equal(t, map[string]string{"odd-o1": "checks check.flagged", "o2": "orders order.paid"}, unrouted)
}

// With telemetry, an output to an exchange gets its producer span, named after the
// exchange, and carries the trace context like an output to a queue.
func TestExchangeOutputIsTraced(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	in := &telemetry.Config{TracerProvider: tp, Propagator: propagation.TraceContext{}}
	mem := memory.New(memory.Config{Logger: silentLogger})
	t.Cleanup(func() { _ = mem.Close() })
	s, err := router.New(mem, router.Config{Logger: silentLogger, Telemetry: in})
	require.NoError(t, err)
	require.NoError(t, s.HandleWithOutput("h", "in", "", func(m *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("out-"+m.UUID, nil)}, nil
	}, router.WithOutputExchange(router.Output{Exchange: "events", Kind: broker.Fanout})))
	runSubscribed(t, s)
	require.NoError(t, mem.Publish("in", message.NewMessage("m1", nil)))
	require.Eventually(t, func() bool { return mem.Len(topology.UnroutedQueue) == 1 }, 5*time.Second, 5*time.Millisecond)
	out := mem.Peek(topology.UnroutedQueue)[0]
	require.NotEmpty(t, out.Metadata.Get("traceparent"))
	var names []string
	for _, sp := range spans.Ended() {
		names = append(names, sp.Name())
	}
	require.Contains(t, names, "send events")
}
