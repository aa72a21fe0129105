// Package brokertest is the conformance suite of package broker's contract, in the spirit
// of Watermill's pubsub/tests and River's riverdrivertest: one subtest per capability a
// broker.Broker has (declaring, publishing, delaying, dead-lettering, consuming, pausing,
// reading depths), per optional capability (broker.ConsumerCounter, broker.Joiner,
// broker.NativeRetrier, broker.Journaler) and per broker.Settlement, each stating in its
// comment what a broker must do and checking it as a user would see it, on a running
// broker. Both of sluice's brokers run it (broker/amqp on RabbitMQ 3.10 and 4.3,
// broker/memory); a third broker that passes it runs the stack (package router) unchanged.
//
//	func TestConformance(t *testing.T) {
//		brokertest.Run(t, func(t *testing.T) broker.Broker { return mybroker.New(...) }, brokertest.Features{})
//	}
//
// Queues, exchanges and journals get names of their own ("brokertest." and a random
// suffix): a shared broker is safe to use, and what the suite declares is left there.
package brokertest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
)

// Features says which optional parts of the contract the broker under test has. The zero
// value is a broker with only what broker.Broker requires. Each field is checked both
// ways: a broker must have what its Features say, and must not implement an optional
// interface its Features leave out (the stack would use it).
type Features struct {
	// Prefetch: a subscriber takes up to broker.SubscribeOptions.Prefetch deliveries
	// ahead of its handlers (RabbitMQ's QoS prefetch). Without it Prefetch is ignored.
	Prefetch bool
	// ConsumerCounter: the broker is a broker.ConsumerCounter, and QueueDepth counts a
	// queue's consumers too.
	ConsumerCounter bool
	// Joiner: the broker is a broker.Joiner.
	Joiner bool
	// Journaler: the broker is a broker.Journaler.
	Journaler bool
	// NativeRetry: the broker is a broker.NativeRetrier that carries out native delayed
	// retry (RabbitMQ 4.3's quorum queues). A NativeRetrier without it (RabbitMQ 3.10, a
	// classic queue) must refuse DeclareNativeRetryQueue with an error.
	NativeRetry bool
	// DeliveryLimit is how many failed deliveries (broker.SettleReject,
	// broker.SettleHoldBack) of a message the broker counts before it moves the message
	// to its queue's dead-letter queue, as a RabbitMQ 4.x quorum queue's x-delivery-limit
	// does; returns (broker.SettleReturn) are not counted. Zero means the broker counts
	// none.
	DeliveryLimit int
}

// Run runs the suite against brokers newBroker returns, one for each subtest (Run closes
// it when the subtest ends). A broker's subscribers should give a handler at most a
// second to settle a message once they close (a drain timeout; both of sluice's brokers
// have Config.DrainTimeout), and pause consecutive rejections up to at least a second
// (their Config.NackBackoffMax, 10 s by default): the suite closes subscribers holding
// messages, and tells rejections from returns by their pauses.
//
// Subtests that judge how long something takes run one at a time; the others in
// parallel, each on queues of its own.
func Run(t *testing.T, newBroker func(t *testing.T) broker.Broker, has Features) {
	s := &suite{newBroker: newBroker, has: has}
	// Serial: they judge pauses, which other subtests' load would stretch.
	t.Run("Settlement", s.settlement)
	t.Run("Delayer", s.delayer)
	t.Run("NativeRetrier", s.nativeRetrier)
	t.Run("Subscriber/Pause", s.pause)
	// Parallel.
	for _, tc := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"Name", s.name},
		{"DeclareQueue", s.declareQueue},
		{"DeclareOutputQueue", s.declareOutputQueue},
		{"PublishConfirmed", s.publishConfirmed},
		{"DeclarePartitioned", s.declarePartitioned},
		{"DeclareExchange", s.declareExchange},
		{"DeclareSubscription", s.declareSubscription},
		{"DeadLetterer", s.deadLetterer},
		{"QueueDepth", s.queueDepth},
		{"Subscriber/Ack", s.ack},
		{"Subscriber/Concurrency", s.concurrency},
		{"Subscriber/Prefetch", s.prefetch},
		{"Subscriber/Close", s.subscriberClose},
		{"Delivery/HoldAck", s.holdAck},
		{"Delivery/HoldAckStoppedOnClose", s.holdAckStopped},
		{"Delivery/HoldAckAfterSettlement", s.holdAckAfterSettlement},
		{"ConsumerCounter", s.consumerCounter},
		{"Joiner", s.joiner},
		{"Journaler", s.journaler},
		{"Close", s.close},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t)
		})
	}
}

type suite struct {
	newBroker func(t *testing.T) broker.Broker
	has       Features
}

// Waits: long enough for any broker under load, never what a passing test waits for.
const (
	// eventually bounds what must happen (a delivery, a count).
	eventually = 10 * time.Second
	// tick is how often a condition is polled.
	tick = 10 * time.Millisecond
	// quiet is how long nothing must happen (no delivery of what must not come).
	quiet = 300 * time.Millisecond
)

// broker returns a broker for t, closed when t ends.
func (s *suite) broker(t *testing.T) broker.Broker {
	t.Helper()
	b := s.newBroker(t)
	require.NotNil(t, b, "newBroker returned nil")
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// ctx returns a context for one call, ended when t ends.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// name returns a name unique to this run, for a queue, exchange or journal.
func name(t *testing.T, what string) string {
	base := strings.NewReplacer("/", ".", " ", "-").Replace(t.Name())
	if len(base) > 80 {
		base = base[len(base)-80:]
	}
	return fmt.Sprintf("brokertest.%s.%s.%d%06d", what, base, time.Now().UnixNano()%1e6, rand.IntN(1e6))
}

// queue declares a queue of its own for t and returns its name.
func queue(t *testing.T, b broker.Broker) string {
	t.Helper()
	q := name(t, "q")
	require.NoError(t, b.DeclareQueue(ctx(t), q), "declare queue %q", q)
	return q
}

// newMessage returns a message with payload and a metadata entry, both checked on
// delivery.
func newMessage(payload string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte(payload))
	m.Metadata.Set("brokertest-payload", payload)
	return m
}

// publish publishes messages to q, confirmed.
func publish(t *testing.T, b broker.Broker, q string, msgs ...*message.Message) {
	t.Helper()
	require.NoError(t, b.PublishConfirmed(ctx(t), q, msgs...), "publish to %q", q)
}

// subscription is one subscriber consuming one queue.
type subscription struct {
	sub  broker.Subscriber
	msgs <-chan *message.Message
}

// subscribe consumes q with opts until t ends.
func subscribe(t *testing.T, b broker.Broker, q string, opts broker.SubscribeOptions) *subscription {
	t.Helper()
	sub := b.Subscriber(opts)
	c, cancel := context.WithCancel(context.Background())
	msgs, err := sub.Subscribe(c, q)
	require.NoError(t, err, "subscribe to %q", q)
	t.Cleanup(func() {
		cancel()
		_ = sub.Close()
	})
	return &subscription{sub: sub, msgs: msgs}
}

// close closes the subscriber: what it had not handed out goes back to the queue.
func (s *subscription) close(t *testing.T) {
	t.Helper()
	require.NoError(t, s.sub.Close())
}

// next returns the next delivery, failing t when none comes.
func (s *subscription) next(t *testing.T) *message.Message {
	t.Helper()
	select {
	case m, ok := <-s.msgs:
		require.True(t, ok, "the subscription ended")
		return m
	case <-time.After(eventually):
		require.FailNow(t, "no delivery", "none within %s", eventually)
		return nil
	}
}

// none fails t when a delivery comes within quiet.
func (s *subscription) none(t *testing.T, why string) {
	t.Helper()
	select {
	case m, ok := <-s.msgs:
		if ok {
			assert.Failf(t, "unexpected delivery", "%s delivered: %s", m.UUID, why)
		}
	case <-time.After(quiet):
	}
}

// sameMessage asserts that got is want as delivered: id, payload and metadata.
func sameMessage(t *testing.T, want, got *message.Message) {
	t.Helper()
	assert.Equal(t, want.UUID, got.UUID, "the message id travels")
	assert.Equal(t, string(want.Payload), string(got.Payload), "the payload travels")
	assert.Equal(t, want.Metadata.Get("brokertest-payload"), got.Metadata.Get("brokertest-payload"), "the metadata travels")
}

// ready returns q's ready messages.
func ready(t *testing.T, b broker.Broker, q string) int64 {
	t.Helper()
	d, err := b.QueueDepth(ctx(t), q)
	require.NoError(t, err, "depth of %q", q)
	return d.Ready
}

// readyNow returns q's ready messages, -1 when they cannot be read: for conditions polled
// off the test's goroutine.
func readyNow(b broker.Broker, q string) int64 {
	d, err := b.QueueDepth(context.Background(), q)
	if err != nil {
		return -1
	}
	return d.Ready
}

// eventuallyReady waits for q to hold n ready messages.
func eventuallyReady(t *testing.T, b broker.Broker, q string, n int64, msgAndArgs ...any) {
	t.Helper()
	var last int64
	var err error
	if !assert.Eventually(t, func() bool {
		var d sluice.QueueDepth
		d, err = b.QueueDepth(context.Background(), q)
		last = d.Ready
		return err == nil && last == n
	}, eventually, tick, msgAndArgs...) {
		t.Logf("queue %q: %d ready messages (error %v), want %d", q, last, err, n)
	}
}
