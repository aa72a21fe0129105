// Package benchenv holds what the RabbitMQ benchmarks of several packages share: the
// message they send, the broker and queues they measure on, and how they report a rate.
// Sub-benchmarks named sluice, raw and watermill under one parent are one comparison;
// internal/benchkit/benchtable (make bench) puts them side by side.
package benchenv

import (
	"context"
	"log/slog"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// Payload is the body of every benchmark message: 1 KiB of letters.
var Payload = func() []byte {
	p := make([]byte, 1024)
	for i := range p {
		p[i] = 'a' + byte(i%26)
	}
	return p
}()

// Broker connects a sluice broker to url that logs nothing and is closed when b ends.
func Broker(b *testing.B, url string) *amqp.Broker {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	br, err := amqp.New(ctx, amqp.Config{URLs: []string{url}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = br.Close() })
	return br
}

// SluiceQueue declares a fresh queue named after prefix with sluice's topology (its DLQ and
// delay route) and deletes both when b ends.
func SluiceQueue(b *testing.B, r *testenv.Rabbit, br *amqp.Broker, prefix string) string {
	b.Helper()
	q := testenv.Name(prefix)
	r.DeleteQueues(q, topology.DLQ(q), topology.IdempotencyJournal(q))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := br.DeclareQueue(ctx, q); err != nil {
		b.Fatal(err)
	}
	return q
}

// PlainQueue declares a fresh durable classic queue named after prefix without arguments,
// as watermill-amqp's durable queue config declares it, and deletes it when b ends.
func PlainQueue(b *testing.B, r *testenv.Rabbit, prefix string) string {
	b.Helper()
	q := testenv.Name(prefix)
	r.DeleteQueues(q)
	ch, err := r.Conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	return q
}

// ReportRate reports b.N messages over the timed run as msgs/s.
func ReportRate(b *testing.B) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(b.N)/s, "msgs/s")
	}
}

// PublishPipelined publishes n messages, msg(0) … msg(n-1), to queue through the default
// exchange on ch, a channel in confirm mode, mandatory, with up to window confirms
// outstanding: the raw amqp091-go ceiling. It returns once every confirm arrived, with how
// many were nacks.
func PublishPipelined(b testing.TB, ch *amqp091.Channel, queue string, n, window int, msg func(i int) amqp091.Publishing) (nacked int) {
	b.Helper()
	pending := make(chan *amqp091.DeferredConfirmation, max(window-1, 0))
	counted := make(chan int)
	go func() {
		k := 0
		for dc := range pending {
			if !dc.Wait() {
				k++
			}
		}
		counted <- k
	}()
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, true, false, msg(i))
		if err != nil {
			close(pending)
			<-counted
			b.Fatalf("publish to %s: %v", queue, err)
		}
		pending <- dc
	}
	close(pending)
	return <-counted
}
