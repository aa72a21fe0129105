// Package dlqfill fills dead-letter queues for tests and benchmarks with the failure
// records package poison writes, fast: the records are published straight to Q.dlq with
// confirms pipelined, instead of failing each message through a running stack.
package dlqfill

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/topology"
)

// Failure is one dead letter to create.
type Failure struct {
	// ID is the message's Watermill id.
	ID string
	// Handler is recorded as x-handler.
	Handler string
	// Err is what the handler returned (a recovered panic included).
	Err error
	// At is when it failed; zero means now.
	At time.Time
	// Retries is the retry count it had.
	Retries int
	// Payload is the body; nil means {"id":"<ID>"}.
	Payload []byte
	// Metadata is set on the message before the record is made; Override after, to
	// write a record the way another sluice version would.
	Metadata, Override map[string]string
}

type noDeadLetterer struct{}

func (noDeadLetterer) DeadLetter(context.Context, string, *message.Message) error {
	return errors.New("dlqfill: not used")
}

// Recorder makes the records of one queue.
type Recorder struct {
	queue string
	p     *carry.Carrier
}

// NewRecorder returns a Recorder for queue's dead letters.
func NewRecorder(tb testing.TB, queue string) *Recorder {
	tb.Helper()
	p := carry.New(carry.Carrier{Host: "worker-1"})
	return &Recorder{queue: queue, p: p}
}

// Publishing returns the publishing of f's record, as the poison step would send it.
func (r *Recorder) Publishing(tb testing.TB, f Failure) amqp091.Publishing {
	payload := f.Payload
	if payload == nil {
		payload = []byte(`{"id":"` + f.ID + `"}`)
	}
	msg := message.NewMessage(f.ID, payload)
	msg.Metadata.Set(sluice.HeaderRetryCount, strconv.Itoa(f.Retries))
	msg.Metadata.Set(headers.TraceParent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	for k, v := range f.Metadata {
		msg.Metadata.Set(k, v)
	}
	rec := r.p.Record(msg, r.queue, sluice.RetryCount(msg.Metadata), f.Err)
	rec.Metadata.Set(headers.Handler, f.Handler)
	if !f.At.IsZero() {
		rec.Metadata.Set(headers.FailedAt, failure.FormatTime(f.At))
	}
	for k, v := range f.Override {
		rec.Metadata.Set(k, v)
	}
	pub, err := amqp.Marshaler{}.Marshal(rec)
	if err != nil {
		tb.Fatalf("marshal record of %s: %v", f.ID, err)
	}
	return pub
}

// Fill publishes the records of n failures, f(0) … f(n-1), to queue's DLQ, in that order,
// and returns once RabbitMQ confirmed them all.
func Fill(tb testing.TB, conn *amqp091.Connection, queue string, n int, f func(i int) Failure) {
	tb.Helper()
	r := NewRecorder(tb, queue)
	Publish(tb, conn, topology.DLQ(queue), n, func(i int) amqp091.Publishing { return r.Publishing(tb, f(i)) })
}

// Publish publishes n messages, pub(0) … pub(n-1), to queue through the default exchange,
// mandatory, with up to 1000 confirms outstanding, and fails tb on a nack.
func Publish(tb testing.TB, conn *amqp091.Connection, queue string, n int, pub func(i int) amqp091.Publishing) {
	tb.Helper()
	ch, err := conn.Channel()
	if err != nil {
		tb.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		tb.Fatal(err)
	}
	pending := make(chan *amqp091.DeferredConfirmation, 999)
	nacked := make(chan int)
	go func() {
		k := 0
		for dc := range pending {
			if !dc.Wait() {
				k++
			}
		}
		nacked <- k
	}()
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, true, false, pub(i))
		if err != nil {
			close(pending)
			<-nacked
			tb.Fatalf("publish to %s: %v", queue, err)
		}
		pending <- dc
	}
	close(pending)
	if k := <-nacked; k > 0 {
		tb.Fatalf("%d of %d publishes to %s nacked", k, n, queue)
	}
}
