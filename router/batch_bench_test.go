package router_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/internal/benchkit/benchenv"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/router"
)

// benchBulkWriteCost is what one call of the simulated bulk write costs, whatever the
// number of rows: a database round trip and commit.
const benchBulkWriteCost = 2 * time.Millisecond

// benchBulkWriter is a database behind one connection: its writes are serialized and each
// costs benchBulkWriteCost.
type benchBulkWriter struct{ mu sync.Mutex }

func (w *benchBulkWriter) write(rows int, count *benchCounter) {
	w.mu.Lock()
	time.Sleep(benchBulkWriteCost)
	w.mu.Unlock()
	for range rows {
		count.handled()
	}
}

// BenchmarkBatchBulkWrite drains b.N pre-filled messages through the full stack on
// RabbitMQ into a simulated bulk write (benchBulkWriter), 50 messages at a time either way:
//   - batch: HandleBatch, WithBatch(50, 20ms), one write per batch;
//   - single: Handle, WithConcurrency(50), one write per message.
func BenchmarkBatchBulkWrite(b *testing.B) {
	url := testenv.AMQPURL(b)
	for _, tc := range []struct {
		name     string
		register func(s *router.Stack, q string, w *benchBulkWriter, count *benchCounter) error
	}{
		{name: "batch", register: func(s *router.Stack, q string, w *benchBulkWriter, count *benchCounter) error {
			return s.HandleBatch("bench", q, func(_ context.Context, msgs []*message.Message) []error {
				w.write(len(msgs), count)
				return nil
			}, router.WithBatch(50, 20*time.Millisecond), router.WithPrefetch(100))
		}},
		{name: "single", register: func(s *router.Stack, q string, w *benchBulkWriter, count *benchCounter) error {
			return s.Handle("bench", q, func(*message.Message) error {
				w.write(1, count)
				return nil
			}, router.WithConcurrency(50), router.WithPrefetch(100))
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r := testenv.NewRabbit(b)
			br := benchenv.Broker(b, url)
			q := benchenv.SluiceQueue(b, r, br, "bench.batch."+tc.name)
			benchPrefill(b, r, q, b.N)
			count := benchCountTo(b.N)
			stack := benchStack(b, br, router.Config{}, true)
			if err := tc.register(stack, q, &benchBulkWriter{}, count); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			benchRun(b, stack, count, func(b *testing.B) { benchReportRate(b, count) })
		})
	}
}
