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

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/benchkit/benchenv"
	hdr "github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/dlqfill"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// benchMessages is the size of the DLQ operations' benchmarks: 20,000 by default, the
// issue's figure; SLUICE_BENCH_DLQ_MESSAGES=100000 measures the large DLQ (a run of many
// minutes: the group replay then fills 400,000, so run it with -bench
// 'DLQ/(List|Show|Stats|Groups|ReplayAll|Archive)'; see docs/performance.md).
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
	// gatewayGroup is the group of the gateway_down messages of the last fill: the same
	// record, so the same group, as a read would find.
	var gatewayGroup string
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
		gw := templates[0]
		gatewayGroup = dlq.NewRecord(amqp091.Delivery{Headers: gw.Headers, Body: gw.Body, ContentType: gw.ContentType}, q, 1, time.Now()).GroupID
		dlqfill.Publish(b, r.Conn, topology.DLQ(q), total, func(i int) amqp091.Publishing {
			pub := templates[min(i%4, 1)]
			headers := make(amqp091.Table, len(pub.Headers))
			for k, v := range pub.Headers {
				headers[k] = v
			}
			headers[hdr.UUID] = fmt.Sprintf("m-%06d", i)
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
	op := dlq.Operator{Conn: conn}
	in := dlq.Inspector{Conn: conn}

	// each runs one operation per iteration on a DLQ of total messages, of which it
	// handles msgs, and reports msgs per second. prep, untimed, returns the selector.
	// Reads share one filled queue per size (they leave it as it was); the other cases
	// fill a fresh one each iteration.
	reads := map[int]string{}
	each := func(b *testing.B, c benchCase) {
		for range b.N {
			b.StopTimer()
			var q string
			if c.read {
				if reads[c.total] == "" {
					reads[c.total] = fill(b, c.total)
				}
				q = reads[c.total]
			} else {
				q = fill(b, c.total)
			}
			var sel dlq.Selector
			if c.prep != nil {
				sel = c.prep(b, q)
			}
			runtime.GC()
			peak := watchHeap()
			b.StartTimer()
			got, err := c.run(q, sel)
			b.StopTimer()
			b.ReportMetric(peak(), "peak-heap-MB")
			if err != nil {
				b.Fatal(err)
			}
			if got != c.msgs {
				b.Fatalf("handled %d messages, want %d", got, c.msgs)
			}
		}
		reportRate(b, c.msgs)
	}
	ctx := context.Background()
	// gatewayBack sends the gateway_down dead letters (the selected quarter) back to q.
	gatewayBack := func(q string, d amqp091.Delivery) string {
		if d.Headers[sluice.HeaderErrorType] == "gateway_down" {
			return q
		}
		return ""
	}
	lastGroup := func(*testing.B, string) dlq.Selector {
		return dlq.Selector{Group: gatewayGroup} // a quarter of the DLQ
	}
	replay := func(q string, sel dlq.Selector) (int, error) {
		res, err := op.Replay(ctx, q, sel, dlq.Options{})
		return res.Moved, err
	}
	cases := []benchCase{
		// The selective case: n by group, a quarter of a DLQ four times larger.
		{name: fmt.Sprintf("ReplayGroup%dOf%d", n, 4*n), total: 4 * n, msgs: n, prep: lastGroup, run: replay, move: gatewayBack},
		{name: fmt.Sprintf("List%d", n), total: n, msgs: n, read: true, run: func(q string, _ dlq.Selector) (int, error) {
			k := 0
			_, err := in.Messages(ctx, q, dlq.Selector{}, func(dlq.Record) bool { k++; return true })
			return k, err
		}},
		{name: fmt.Sprintf("Show%d", n), total: n, msgs: n, read: true, run: func(q string, _ dlq.Selector) (int, error) {
			_, err := in.Show(ctx, q, fmt.Sprintf("m-%06d", n-1)) // the last: every message read
			return n, err
		}},
		{name: fmt.Sprintf("Stats%d", n), total: n, msgs: n, read: true, run: func(q string, _ dlq.Selector) (int, error) {
			st, err := in.Stats(ctx, q)
			return st.Total, err
		}},
		{name: fmt.Sprintf("Groups%d", n), total: n, msgs: n, read: true, run: func(q string, _ dlq.Selector) (int, error) {
			gs, err := in.Groups(ctx, q)
			k := 0
			for _, g := range gs {
				k += g.Count
			}
			return k, err
		}},
		{name: fmt.Sprintf("ReplayAll%d", n), total: n, msgs: n, run: func(q string, _ dlq.Selector) (int, error) {
			return replay(q, dlq.Selector{All: true})
		}, move: func(q string, _ amqp091.Delivery) string { return q }},
		{name: fmt.Sprintf("ReplayErrorType%dOf%d", n/4, n), total: n, msgs: n / 4, run: func(q string, _ dlq.Selector) (int, error) {
			return replay(q, dlq.Selector{ErrorType: "gateway_down"})
		}, move: gatewayBack},
		{name: fmt.Sprintf("ArchiveAll%d", n), total: n, msgs: n, run: func(q string, _ dlq.Selector) (int, error) {
			res, err := op.Archive(ctx, q, dlq.Selector{All: true}, dlq.Options{})
			return res.Moved, err
		}, move: func(q string, _ amqp091.Delivery) string { return topology.Archive(q) }, archive: true},
	}
	// scan is the floor of a selective operation on a FIFO queue: a plain client consuming
	// and acknowledging (prefetch 2,000, one multiple ack per 500) every message of the same
	// DLQ, which any selection must read. Its rate counts the c.msgs selected messages, so
	// it reads beside the operation's.
	scan := func(b *testing.B, c benchCase) {
		for range b.N {
			b.StopTimer()
			q := topology.DLQ(fill(b, c.total))
			ch, err := r.Conn.Channel()
			if err != nil {
				b.Fatal(err)
			}
			if err := ch.Qos(2000, 0, false); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			ds, err := ch.Consume(q, "", false, false, false, false, nil)
			if err != nil {
				b.Fatal(err)
			}
			for k := 1; k <= c.total; k++ {
				d := <-ds
				if k%500 == 0 || k == c.total {
					if err := d.Ack(true); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.StopTimer()
			_ = ch.Close()
		}
		reportRate(b, c.msgs)
	}
	// rawTx is the floor of a crash-safe move: a plain client doing what the operation does
	// on the wire, with nothing of sluice's (no record parsed, no destination check, no
	// header rewritten): one tx channel, prefetch 2,000, each message published to where
	// c.move says (mandatory) or, skipped, back to the DLQ's tail, and acknowledged, a
	// tx.commit every 500. Its rate counts the c.msgs moved messages.
	rawTx := func(b *testing.B, c benchCase) {
		for range b.N {
			b.StopTimer()
			q := fill(b, c.total)
			if c.archive {
				declareArchive(b, r, q)
			}
			src := topology.DLQ(q)
			ch, err := r.Conn.Channel()
			if err != nil {
				b.Fatal(err)
			}
			if err := ch.Qos(2000, 0, false); err != nil {
				b.Fatal(err)
			}
			if err := ch.Tx(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			ds, err := ch.Consume(src, "", false, false, false, false, nil)
			if err != nil {
				b.Fatal(err)
			}
			moved := 0
			for k := 1; k <= c.total; k++ {
				d := <-ds
				pub := amqp091.Publishing{Headers: d.Headers, ContentType: d.ContentType, DeliveryMode: d.DeliveryMode,
					MessageId: d.MessageId, Timestamp: d.Timestamp, Body: d.Body}
				dest, mandatory := c.move(q, d), true
				if dest == "" {
					dest, mandatory = src, false
				} else {
					moved++
				}
				if err := ch.Publish("", dest, mandatory, false, pub); err != nil {
					b.Fatal(err)
				}
				if err := ch.Ack(d.DeliveryTag, false); err != nil {
					b.Fatal(err)
				}
				if k%500 == 0 || k == c.total {
					if err := ch.TxCommit(); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.StopTimer()
			_ = ch.Close()
			if moved != c.msgs {
				b.Fatalf("raw-tx moved %d messages, want %d", moved, c.msgs)
			}
		}
		reportRate(b, c.msgs)
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.Run("raw", func(b *testing.B) { raw(b, c.msgs) })
			if c.total > c.msgs {
				b.Run("raw-scan", func(b *testing.B) { scan(b, c) })
			}
			if c.move != nil {
				b.Run("raw-tx", func(b *testing.B) { rawTx(b, c) })
			}
			b.Run("sluice", func(b *testing.B) { each(b, c) })
		})
	}
}

// benchCase is one row of BenchmarkDLQ: an operation on a DLQ of total messages that
// handles msgs of them.
type benchCase struct {
	name        string
	total, msgs int
	// read: the operation leaves the queue as it was, so its queue is filled once.
	read bool
	// move, for a replay or an archive, says where the raw-tx reference sends a message
	// of queue q's DLQ: its destination, or "" for the message the operation skips.
	move func(q string, d amqp091.Delivery) string
	// archive: the destination is the archive, which the raw-tx reference declares as an
	// archive run would.
	archive bool
	prep    func(b *testing.B, q string) dlq.Selector
	run     func(q string, sel dlq.Selector) (int, error)
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

// declareArchive declares q's archive as an archive run does (classic, the default
// retention as its TTL), deleted when b ends.
func declareArchive(b *testing.B, r *testenv.Rabbit, q string) {
	b.Helper()
	ch, err := r.Conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	args := amqp091.Table(topology.DeadLetterArgs("classic", map[string]any{"x-message-ttl": dlq.DefaultRetention.Milliseconds()}))
	if _, err := ch.QueueDeclare(topology.Archive(q), true, false, false, false, args); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.DeleteQueues(topology.Archive(q)) })
}
