package memory_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/internal/benchkit/delaybench"
)

// BenchmarkDelayAccuracy is broker/amqp's BenchmarkDelayAccuracy on the embedded broker:
// 240 messages handed to Broker.Delay at once, delays spread geometrically from 100ms to
// 20s; it reports how late each arrives (actual minus requested, from just before the
// Delay call to the delivery: p50, p99, max) and the hand-off's p99, in milliseconds. One
// round takes about 20s, so b.N is 1.
func BenchmarkDelayAccuracy(b *testing.B) {
	b.Run("sluice", func(b *testing.B) {
		br := memory.New(memory.Config{Logger: slog.New(slog.DiscardHandler)})
		b.Cleanup(func() { _ = br.Close() })
		const q = "bench.delay"
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := br.DeclareQueue(ctx, q); err != nil {
			b.Fatal(err)
		}
		sub := br.Subscriber(broker.SubscribeOptions{Concurrency: 16})
		b.Cleanup(func() { _ = sub.Close() })
		msgs, err := sub.Subscribe(ctx, q)
		if err != nil {
			b.Fatal(err)
		}
		delaybench.Measure(ctx, b, msgs, func(d time.Duration, m *message.Message) error {
			return br.Delay(ctx, q, d, m)
		})
	})
}
