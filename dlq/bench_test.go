package dlq_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/benchenv"
	"github.com/sluice-go/sluice/internal/dlqfill"
	"github.com/sluice-go/sluice/internal/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// benchMessages is the size of the DLQ operations' benchmarks: 20,000 by default, the
// issue's figure; SLUICE_BENCH_DLQ_MESSAGES=100000 measures the large DLQ by hand (a run
// of minutes, so not the default of make bench).
func benchMessages() int {
	if n, err := strconv.Atoi(os.Getenv("SLUICE_BENCH_DLQ_MESSAGES")); err == nil && n > 0 {
		return n
	}
	return 20000
}

// BenchmarkDLQ measures the dead-letter operations on 1 KiB dead letters, each beside the
// raw reference of the same run: a plain amqp091-go client publishing as many messages
// with confirms pipelined to a classic queue. Rates are the operation's messages (moved,
// or read for list and groups) per second; peak-heap-MB is the client's largest heap
// during the operation.
func BenchmarkDLQ(b *testing.B) {
	n := benchMessages()
	r := testenv.NewRabbit(b)
	br := benchenv.Broker(b, r.URL)
	raw := func(b *testing.B, msgs int) {
		q := benchenv.PlainQueue(b, r, "bench.dlq.raw")
		ch, err := r.Conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		defer ch.Close()
		if err := ch.Confirm(false); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			b.StartTimer()
			nacked := benchenv.PublishPipelined(b, ch, q, msgs, 1000, func(int) amqp091.Publishing {
				return amqp091.Publishing{Body: benchenv.Payload, DeliveryMode: amqp091.Persistent}
			})
			b.StopTimer()
			if nacked > 0 {
				b.Fatalf("%d nacks", nacked)
			}
			if _, err := ch.QueuePurge(q, false); err != nil {
				b.Fatal(err)
			}
		}
		reportRate(b, msgs)
	}
	// fill dead-letters total messages into a fresh queue's DLQ; every fourth is
	// gateway_down, the rest invalid_amount.
	fill := func(b *testing.B, total int) string {
		b.Helper()
		q := benchenv.SluiceQueue(b, r, br, "bench.dlq")
		r.DeleteQueues(topology.Archive(q))
		// Two records made by the poison step, copied with each message's id: making each
		// record anew would make filling the DLQ the longest part of the benchmark.
		rec := dlqfill.NewRecorder(b, q)
		templates := []amqp091.Publishing{
			rec.Publishing(b, dlqfill.Failure{ID: "t", Handler: "payments", Err: gatewayDown(), Payload: benchenv.Payload}),
			rec.Publishing(b, dlqfill.Failure{ID: "t", Handler: "payments", Err: invalidAmount(), Payload: benchenv.Payload}),
		}
		dlqfill.Publish(b, r.Conn, topology.DLQ(q), total, func(i int) amqp091.Publishing {
			pub := templates[min(i%4, 1)]
			headers := make(amqp091.Table, len(pub.Headers))
			for k, v := range pub.Headers {
				headers[k] = v
			}
			headers[amqp.UUIDHeader] = fmt.Sprintf("m-%06d", i)
			pub.Headers = headers
			return pub
		})
		return q
	}
	conn, err := amqp091.Dial(r.URL)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	op := dlq.NewOperator(conn)
	in := dlq.NewInspector(conn)

	// each runs one operation per iteration on a DLQ of total messages, of which it
	// handles msgs, and reports msgs per second.
	each := func(b *testing.B, total, msgs int, run func(q string) (int, error)) {
		for range b.N {
			b.StopTimer()
			q := fill(b, total)
			runtime.GC()
			peak := watchHeap()
			b.StartTimer()
			got, err := run(q)
			b.StopTimer()
			b.ReportMetric(peak(), "peak-heap-MB")
			if err != nil {
				b.Fatal(err)
			}
			if got != msgs {
				b.Fatalf("handled %d messages, want %d", got, msgs)
			}
		}
		reportRate(b, msgs)
	}
	ctx := context.Background()
	cases := []struct {
		name       string
		total, msg int
		run        func(q string) (int, error)
	}{
		{name: fmt.Sprintf("ReplayAll%d", n), total: n, msg: n, run: func(q string) (int, error) {
			res, err := op.Replay(ctx, q, dlq.Selector{All: true}, dlq.Options{})
			return res.Moved, err
		}},
		{name: fmt.Sprintf("ReplayErrorType%dOf%d", n/4, n), total: n, msg: n / 4, run: func(q string) (int, error) {
			res, err := op.Replay(ctx, q, dlq.Selector{ErrorType: "gateway_down"}, dlq.Options{})
			return res.Moved, err
		}},
		{name: fmt.Sprintf("ArchiveAll%d", n), total: n, msg: n, run: func(q string) (int, error) {
			res, err := op.Archive(ctx, q, dlq.Selector{All: true}, dlq.Options{})
			return res.Moved, err
		}},
		{name: fmt.Sprintf("List%d", n), total: n, msg: n, run: func(q string) (int, error) {
			k := 0
			_, err := in.Messages(ctx, q, dlq.Selector{}, func(dlq.Record) bool { k++; return true })
			return k, err
		}},
		{name: fmt.Sprintf("Groups%d", n), total: n, msg: n, run: func(q string) (int, error) {
			gs, err := in.Groups(ctx, q)
			k := 0
			for _, g := range gs {
				k += g.Count
			}
			return k, err
		}},
	}
	if n <= 20000 {
		// The selective case: 20,000 of a DLQ four times larger.
		cases = append(cases, struct {
			name       string
			total, msg int
			run        func(q string) (int, error)
		}{name: fmt.Sprintf("ReplayGroup%dOf%d", n, 4*n), total: 4 * n, msg: n, run: func(q string) (int, error) {
			gs, err := in.Groups(ctx, q)
			if err != nil {
				return 0, err
			}
			res, err := op.Replay(ctx, q, dlq.Selector{Group: gs[len(gs)-1].ID}, dlq.Options{})
			return res.Moved, err
		}})
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.Run("raw", func(b *testing.B) { raw(b, c.msg) })
			b.Run("sluice", func(b *testing.B) { each(b, c.total, c.msg, c.run) })
		})
	}
}

func reportRate(b *testing.B, msgs int) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(msgs*b.N)/s, "msgs/s")
	}
}

// watchHeap samples the heap in use until the returned function is called, which returns
// the largest sample in MiB.
func watchHeap() func() float64 {
	var mu sync.Mutex
	var peak uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			mu.Lock()
			peak = max(peak, ms.HeapInuse)
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func() float64 {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		return float64(peak) / (1 << 20)
	}
}
