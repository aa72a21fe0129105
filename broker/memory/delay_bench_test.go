package memory_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker/memory"
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
		sub := br.Subscriber(memory.SubscribeOptions{Concurrency: 16})
		b.Cleanup(func() { _ = sub.Close() })
		msgs, err := sub.Subscribe(ctx, q)
		if err != nil {
			b.Fatal(err)
		}
		var late, handoff []time.Duration
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			l, h := delayRound(ctx, b, msgs, func(d time.Duration, m *message.Message) error {
				return br.Delay(ctx, q, d, m)
			})
			late, handoff = append(late, l...), append(handoff, h...)
		}
		b.StopTimer()
		b.ReportMetric(percentileMS(late, 0.50), "p50-late-ms")
		b.ReportMetric(percentileMS(late, 0.99), "p99-late-ms")
		b.ReportMetric(percentileMS(late, 1), "max-late-ms")
		b.ReportMetric(percentileMS(handoff, 0.99), "p99-handoff-ms")
	})
}

// delayRound delays 240 messages at once and returns how late each arrived and how long
// each Delay call took. (The same measurement as broker/amqp's, kept beside each
// benchmark since test helpers cannot be shared across the two test packages.)
func delayRound(ctx context.Context, b *testing.B, msgs <-chan *message.Message, delay func(time.Duration, *message.Message) error) (late, handoff []time.Duration) {
	const n = 240
	const lo, hi = 100 * time.Millisecond, 20 * time.Second
	type sent struct {
		at        time.Time
		requested time.Duration
	}
	var mu sync.Mutex
	sentAt := make(map[string]sent, n)
	delays := make([]time.Duration, n)
	for i := range delays {
		delays[i] = time.Duration(float64(lo) * math.Pow(float64(hi)/float64(lo), float64(i)/float64(n-1)))
	}
	rand.Shuffle(n, func(i, j int) { delays[i], delays[j] = delays[j], delays[i] })

	errs := make(chan error, n)
	handoffs := make(chan time.Duration, n)
	var wg sync.WaitGroup
	for i, d := range delays {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := message.NewMessage(fmt.Sprintf("delay-%d-%s", i, watermill.NewShortUUID()), make([]byte, 1024))
			start := time.Now()
			mu.Lock()
			sentAt[m.UUID] = sent{at: start, requested: d}
			mu.Unlock()
			if err := delay(d, m); err != nil {
				errs <- err
				return
			}
			handoffs <- time.Since(start)
		}()
	}
	wg.Wait()
	close(errs)
	close(handoffs)
	for err := range errs {
		b.Fatal(err)
	}
	for h := range handoffs {
		handoff = append(handoff, h)
	}

	late = make([]time.Duration, 0, n)
	deadline := time.After(hi + 30*time.Second)
	for len(late) < n {
		select {
		case m, ok := <-msgs:
			if !ok {
				b.Fatalf("subscription closed after %d of %d delayed messages", len(late), n)
			}
			arrived := time.Now()
			m.Ack()
			mu.Lock()
			s, ok := sentAt[m.UUID]
			delete(sentAt, m.UUID)
			mu.Unlock()
			if ok {
				late = append(late, arrived.Sub(s.at)-s.requested)
			}
		case <-deadline:
			b.Fatalf("only %d of %d delayed messages arrived", len(late), n)
		case <-ctx.Done():
			b.Fatal(ctx.Err())
		}
	}
	return late, handoff
}

// percentileMS returns the p-quantile of ds (nearest rank) in milliseconds.
func percentileMS(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	i := int(math.Ceil(p*float64(len(ds)))) - 1
	return float64(ds[max(i, 0)]) / float64(time.Millisecond)
}
