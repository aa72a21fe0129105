package router_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/benchkit/benchenv"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// benchNativeDelay is both variants' retry delay: the shortest the native retry takes.
const benchNativeDelay = time.Millisecond

// BenchmarkRetryPathNative43 is BenchmarkRetryPath on RabbitMQ 4.3 with quorum queues
// (what the native retry needs), each of b.N pre-filled messages failing once and
// succeeding on its retry after benchNativeDelay, through the full stack:
//   - sluice: the retry hands a confirmed copy to the delay cascade, then acks;
//   - native: the handler has router.WithNativeRetry, so the retry is a basic.reject that
//     the queue holds back itself.
//
// Besides msgs/s (over the whole run) it reports the broker's CPU time per 1,000 messages
// (broker-cpu-ms/kmsg, 0 when the broker's process cannot be read) and this process's
// (cpu-ms/kmsg).
func BenchmarkRetryPathNative43(b *testing.B) {
	testenv.Require43(b)
	url := testenv.AMQPURL(b)
	b.Run("sluice", func(b *testing.B) { benchRetryNative(b, url, false) })
	b.Run("native", func(b *testing.B) { benchRetryNative(b, url, true) })
}

func benchRetryNative(b *testing.B, url string, native bool) {
	r := testenv.NewRabbit(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	br, err := amqp.New(ctx, amqp.Config{URLs: []string{url}, Logger: benchLogger, QueueType: amqp.QueueQuorum})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = br.Close() })
	q := testenv.Name("bench.retrynative")
	r.DeleteQueues(q, topology.DLQ(q), topology.IdempotencyJournal(q))
	count := benchCountTo(b.N)
	// Every first attempt fails: a breaker on the path that never trips.
	reg, err := breaker.New(breaker.Config{ConsecutiveFailures: math.MaxUint32, Logger: benchLogger})
	if err != nil {
		b.Fatal(err)
	}
	stack := benchStack(b, br, router.Config{
		Retry:    retry.Config{InitialDelay: benchNativeDelay, MaxDelay: benchNativeDelay, Multiplier: 1, Jitter: retry.NoJitter},
		Breakers: reg,
	}, true)
	opts := []router.HandlerOption{router.WithConcurrency(benchPrefetch), router.WithPrefetch(benchPrefetch)}
	if native {
		opts = append(opts, router.WithNativeRetry(benchNativeDelay, benchNativeDelay))
	}
	failed := map[string]bool{} // the handler runs one message at a time per id
	var mu = make(chan struct{}, 1)
	errOnce := errors.New("fails once")
	if err := stack.Handle("bench", q, func(m *message.Message) error {
		mu <- struct{}{}
		first := !failed[m.UUID]
		failed[m.UUID] = true
		<-mu
		if first {
			return errOnce
		}
		count.handled()
		return nil
	}, opts...); err != nil {
		b.Fatal(err)
	}
	if err := stack.Declare(ctx); err != nil {
		b.Fatal(err)
	}
	benchPrefill(b, r, q, b.N)
	cpu := newBenchCPU(url)
	cpu.start(b)
	b.ReportAllocs()
	b.ResetTimer()
	benchRun(b, stack, count, func(b *testing.B) {
		benchenv.ReportRate(b)
		cpu.report(b)
	})
}
