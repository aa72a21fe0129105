package amqp_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/benchkit/benchenv"
	"github.com/sluice-go/sluice/internal/benchkit/delaybench"
	hdr "github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// Benchmarks against the local RabbitMQ, every message benchenv.Payload (1 KiB) and
// persistent, one comparison per parent benchmark (see internal/benchkit/benchenv). Figures of one run are comparable with each other,
// never with another machine's or another moment's: the broker is shared.

// publishInFlight is how many confirms may be outstanding at once in both shapes: the
// messages of one Publish call (batch), the number of callers (concurrent), raw's window.
const publishInFlight = 128

// BenchmarkConfirmedPublishBatch publishes 1 KiB persistent messages, each confirmed by
// RabbitMQ, from one goroutine, publishInFlight messages per Publish call (the shape of a
// handler's outputs, a replay, any producer with more than one message to send):
//   - sluice: Broker.Publisher().Publish(topic, batch...): every message of the call in
//     flight at once, the call returning when all are confirmed;
//   - raw: amqp091-go on one channel, PublishWithDeferredConfirm with a window of
//     publishInFlight confirms outstanding, the ceiling a client can reach; the same
//     message on the wire (id header and property, timestamp), made by hand;
//   - watermill: watermill-amqp's publisher, NewDurableQueueConfig with
//     Publish.ConfirmDelivery, Publish(topic, batch...): it waits for each message's
//     confirm before it sends the next, one synchronous confirm wait per message.
func BenchmarkConfirmedPublishBatch(b *testing.B) {
	url := testenv.AMQPURL(b)
	publishBatches := func(b *testing.B, pub message.Publisher, q string) {
		batch := make([]*message.Message, 0, publishInFlight)
		for sent := 0; sent < b.N; sent += len(batch) {
			batch = batch[:0]
			for range min(publishInFlight, b.N-sent) {
				batch = append(batch, message.NewMessage(watermill.NewUUID(), benchenv.Payload))
			}
			if err := pub.Publish(q, batch...); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("sluice", func(b *testing.B) {
		pub, q := sluicePublisher(b, url, "bench.publish.batch.sluice")
		b.ReportAllocs()
		b.ResetTimer()
		publishBatches(b, pub, q)
		benchenv.ReportRate(b)
	})
	b.Run("raw", func(b *testing.B) {
		rawPublish(b, "bench.publish.batch.raw")
	})
	b.Run("watermill", func(b *testing.B) {
		pub, q := watermillPublisher(b, url, "bench.publish.batch.watermill")
		b.ReportAllocs()
		b.ResetTimer()
		publishBatches(b, pub, q)
		benchenv.ReportRate(b)
	})
}

// BenchmarkConfirmedPublishConcurrent publishes the same messages from publishInFlight
// concurrent callers, one message per Publish call, each call waiting for its own confirm
// (the shape of request handlers that each publish an event):
//   - sluice: Broker.Publisher().Publish on its one confirm channel, the callers'
//     publishes pipelined on it;
//   - raw: as in BenchmarkConfirmedPublishBatch, one channel and a window of
//     publishInFlight;
//   - watermill: watermill-amqp's publisher as above. Without a channel pool (its
//     default) every Publish call opens a channel of its own, so its callers' confirms
//     are in flight at once too, at the cost of opening and closing a channel each.
func BenchmarkConfirmedPublishConcurrent(b *testing.B) {
	url := testenv.AMQPURL(b)
	publishParallel := func(b *testing.B, pub message.Publisher, q string) {
		parallelCallers(b, publishInFlight)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := pub.Publish(q, message.NewMessage(watermill.NewUUID(), benchenv.Payload)); err != nil {
					b.Error(err)
					return
				}
			}
		})
		benchenv.ReportRate(b)
	}
	b.Run("sluice", func(b *testing.B) {
		pub, q := sluicePublisher(b, url, "bench.publish.concurrent.sluice")
		publishParallel(b, pub, q)
	})
	b.Run("raw", func(b *testing.B) {
		rawPublish(b, "bench.publish.concurrent.raw")
	})
	b.Run("watermill", func(b *testing.B) {
		pub, q := watermillPublisher(b, url, "bench.publish.concurrent.watermill")
		publishParallel(b, pub, q)
	})
}

// sluicePublisher returns a broker's publisher and a declared queue, the confirm channel
// already open.
func sluicePublisher(b *testing.B, url, prefix string) (message.Publisher, string) {
	br := benchenv.Broker(b, url)
	q := benchenv.SluiceQueue(b, testenv.NewRabbit(b), br, prefix)
	pub := br.Publisher()
	if err := pub.Publish(q, message.NewMessage(watermill.NewUUID(), benchenv.Payload)); err != nil {
		b.Fatal(err) // also opens the confirm channel outside the timer
	}
	return pub, q
}

// watermillPublisher returns watermill-amqp's confirming publisher and its queue, declared
// by a first publish outside the timer.
func watermillPublisher(b *testing.B, url, prefix string) (message.Publisher, string) {
	r := testenv.NewRabbit(b)
	q := benchenv.PlainQueue(b, r, prefix)
	cfg := wamqp.NewDurableQueueConfig(url)
	cfg.Publish.ConfirmDelivery = true
	pub, err := wamqp.NewPublisher(cfg, watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = pub.Close() })
	if err := pub.Publish(q, message.NewMessage(watermill.NewUUID(), benchenv.Payload)); err != nil {
		b.Fatal(err)
	}
	return pub, q
}

// rawPublish publishes b.N messages with amqp091-go on one confirm channel, at most
// publishInFlight confirms outstanding.
func rawPublish(b *testing.B, prefix string) {
	r := testenv.NewRabbit(b)
	q := benchenv.PlainQueue(b, r, prefix)
	ch, err := r.Conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	nacked := benchenv.PublishPipelined(b, ch, q, b.N, publishInFlight, func(int) amqp091.Publishing {
		// The same message on the wire as sluice's: a fresh id as message-id and in
		// Watermill's uuid header, a timestamp, persistent.
		id := watermill.NewUUID()
		return amqp091.Publishing{
			Headers:      amqp091.Table{hdr.UUID: id},
			MessageId:    id,
			Timestamp:    time.Now().UTC().Truncate(time.Second),
			DeliveryMode: amqp091.Persistent,
			Body:         benchenv.Payload,
		}
	})
	if nacked > 0 {
		b.Fatalf("%d publishes nacked", nacked)
	}
	benchenv.ReportRate(b)
}

// BenchmarkDelayAccuracy hands 240 messages to Broker.Delay at once, their delays spread
// geometrically from 100ms to 20s, and reports how late each one arrives: actual minus
// requested delay, from just before its Delay call to its delivery (p50, p99, max, in
// milliseconds), and how long the confirmed hand-off itself took (p99). One round takes
// about 21s, so b.N is 1. Each variant has a new broker:
//   - sluice: its first delays, a service's first burst of failures (the cascade declared
//     on the node already, as after any earlier run);
//   - warm: a burst after a first one (not measured), as every later burst of a service;
//   - alone: after a first burst, the delays one at a time, 10 ms apart: a failure that no
//     other hand-off competes with.
func BenchmarkDelayAccuracy(b *testing.B) {
	url := testenv.AMQPURL(b)
	for _, v := range []struct {
		name    string
		measure func(context.Context, *testing.B, <-chan *message.Message, func(time.Duration, *message.Message) error)
	}{
		{"sluice", delaybench.Measure},
		{"warm", delaybench.MeasureWarm},
		{"alone", delaybench.MeasureAlone},
	} {
		b.Run(v.name, func(b *testing.B) {
			br := benchenv.Broker(b, url)
			q := testenv.Name("bench.delay")
			r := testenv.NewRabbit(b)
			r.DeleteQueues(q, topology.DLQ(q))
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if err := br.DeclareQueue(ctx, q); err != nil {
				b.Fatal(err)
			}
			sub := br.Subscriber(broker.SubscribeOptions{Concurrency: 16, Prefetch: 64})
			msgs, err := sub.Subscribe(ctx, q)
			if err != nil {
				b.Fatal(err)
			}
			v.measure(ctx, b, msgs, func(d time.Duration, m *message.Message) error {
				return br.Delay(ctx, q, d, m)
			})
		})
	}
}

// parallelCallers makes RunParallel use about n goroutines.
func parallelCallers(b *testing.B, n int) {
	b.SetParallelism(max(1, (n+runtime.GOMAXPROCS(0)-1)/runtime.GOMAXPROCS(0)))
}
