package dlq_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// queueTypes are the queue types every broker test runs on.
var queueTypes = []amqp.QueueType{amqp.QueueClassic, amqp.QueueQuorum}

// fixture is a queue with sluice's topology, its DLQ, and a plain client.
type fixture struct {
	rabbit *testenv.Rabbit
	conn   *amqp091.Connection // what the code under test uses
	queue  string
	dlq    string
}

// newFixture declares a fresh queue of type qt with sluice's own broker (so the topology is
// the real one) and removes it when t ends.
func newFixture(t *testing.T, qt amqp.QueueType) *fixture {
	t.Helper()
	r := testenv.NewRabbit(t)
	queue := testenv.Name("test.dlq." + string(qt))
	r.DeleteQueues(queue, topology.DLQ(queue))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{r.URL}, QueueType: qt})
	require.NoError(t, err)
	require.NoError(t, b.DeclareQueue(ctx, queue))
	require.NoError(t, b.Close())
	conn, err := amqp091.Dial(r.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return &fixture{rabbit: r, conn: conn, queue: queue, dlq: topology.DLQ(queue)}
}

// failure describes one dead-lettered message to create.
type failure struct {
	id      string
	err     error
	failed  time.Time // zero: now
	retries int
	md      map[string]string
	// record are headers set on the dead-letter copy after the poison step wrote it: a
	// record sluice wrote for a partition, or one an older sluice wrote.
	record map[string]string
}

type typedError struct{ typ, msg string }

func (e typedError) Error() string     { return e.msg }
func (e typedError) ErrorType() string { return e.typ }

func invalidAmount() error {
	return sluice.Permanent(typedError{"invalid_amount", "amount must be positive"})
}
func gatewayDown() error { return typedError{"gateway_down", "gateway: 503 service unavailable"} }

type noDeadLetterer struct{}

func (noDeadLetterer) DeadLetter(context.Context, string, *message.Message) error {
	return errors.New("not used")
}

// deadLetter puts f into the DLQ with the record package poison writes, the way the stack
// would, with a few properties and headers a replay must keep.
func (fx *fixture) deadLetter(t *testing.T, f failure) {
	t.Helper()
	at := f.failed
	if at.IsZero() {
		at = time.Now()
	}
	p := carry.New(carry.Carrier{Now: func() time.Time { return at }, Host: "worker-1"})
	msg := message.NewMessage(f.id, []byte(`{"id":"`+f.id+`"}`))
	msg.Metadata.Set(sluice.HeaderRetryCount, strconv.Itoa(f.retries))
	msg.Metadata.Set(headers.TraceParent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	msg.Metadata.Set(headers.TraceState, "vendor=1")
	msg.Metadata.Set(amqp.MetadataContentType, "application/json")
	msg.Metadata.Set(amqp.MetadataCorrelationID, "corr-"+f.id)
	msg.Metadata.Set("tenant", "acme")
	for k, v := range f.md {
		msg.Metadata.Set(k, v)
	}
	rec := p.Record(msg, fx.queue, sluice.RetryCount(msg.Metadata), f.err)
	rec.Metadata.Set(headers.Handler, "payments")
	for k, v := range f.record {
		rec.Metadata.Set(k, v)
	}
	pub, err := amqp.Marshaler{}.Marshal(rec)
	require.NoError(t, err)
	fx.rabbit.Publish(fx.dlq, pub)
}

// peek returns the ids in queue, head first, without consuming them, and waits until the
// queue holds them all again.
func (fx *fixture) peek(t *testing.T, queue string) []string {
	t.Helper()
	var ids []string
	for _, d := range fx.peekDeliveries(t, queue) {
		ids = append(ids, idOf(d))
	}
	return ids
}

// peekDeliveries returns the messages of queue, head first, without consuming them: a
// consumer takes them all, and closing its channel gives them back in place. (A basic.get
// is 3 ms a message on a quorum queue, and a quorum queue takes messages fetched with
// basic.get back in an order of its own: measured on RabbitMQ 3.10.)
func (fx *fixture) peekDeliveries(t *testing.T, queue string) []amqp091.Delivery {
	t.Helper()
	n := fx.rabbit.Count(queue)
	ch, err := fx.rabbit.Conn.Channel()
	require.NoError(t, err)
	// Quorum queues read a prefetch of 0 as 2000 (RabbitMQ 3.10).
	require.NoError(t, ch.Qos(min(n+1, 65535), 0, false))
	ds, err := ch.Consume(queue, "", false, false, false, false, nil)
	require.NoError(t, err)
	var out []amqp091.Delivery
	for len(out) < n {
		select {
		case d := <-ds:
			out = append(out, d)
		case <-time.After(10 * time.Second):
			t.Fatalf("peek %s: %d of %d messages", queue, len(out), n)
		}
	}
	require.NoError(t, ch.Close())
	fx.waitCount(t, queue, len(out))
	return out
}

// waitCount waits until queue holds n ready messages (a closed channel's messages come
// back asynchronously on some queue types).
func (fx *fixture) waitCount(t *testing.T, queue string, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return fx.rabbit.Count(queue) == n }, 10*time.Second, 10*time.Millisecond,
		"queue %s should hold %d messages, holds %d", queue, n, fx.rabbit.Count(queue))
}

// take consumes every message of queue.
func (fx *fixture) take(t *testing.T, queue string) []amqp091.Delivery {
	t.Helper()
	var out []amqp091.Delivery
	for {
		d, ok := fx.rabbit.Get(queue)
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

func idOf(d amqp091.Delivery) string {
	if v, ok := d.Headers[headers.UUID].(string); ok {
		return v
	}
	return d.MessageId
}
