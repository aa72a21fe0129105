package brokertest

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
)

// An acked message is done: removed from its queue and never delivered again, whatever
// settlement a step asked for (a settlement is for a nack).
func (s *suite) ack(t *testing.T) {
	b := s.broker(t)
	q := queue(t, b)
	m := newMessage("acked")
	publish(t, b, q, m)
	sub := subscribe(t, b, q, broker.SubscribeOptions{})
	got := sub.next(t)
	sameMessage(t, m, got)
	broker.DeliveryFrom(got.Context()).Settle(broker.SettleReturn)
	require.True(t, got.Ack())
	sub.none(t, "an acked message is not delivered again")
	sub.close(t)
	eventuallyReady(t, b, q, 0)
	subscribe(t, b, q, broker.SubscribeOptions{}).none(t, "nor to the next subscriber")
}

// A subscriber hands Concurrency messages out at once, each waiting for its own ack, and
// no more until one is settled.
func (s *suite) concurrency(t *testing.T) {
	b := s.broker(t)
	q := queue(t, b)
	publish(t, b, q, newMessage("1"), newMessage("2"), newMessage("3"), newMessage("4"), newMessage("5"))
	sub := subscribe(t, b, q, broker.SubscribeOptions{Concurrency: 3})
	held := []*message.Message{sub.next(t), sub.next(t), sub.next(t)}
	sub.none(t, "a fourth message while three are with their handlers")
	held[0].Ack()
	held = append(held[1:], sub.next(t))
	sub.none(t, "a fifth message while three are with their handlers")
	for _, m := range held {
		m.Ack()
	}
	sub.next(t).Ack()
	eventuallyReady(t, b, q, 0)
}

// With Features.Prefetch, a subscriber takes up to Prefetch deliveries from the queue
// ahead of its handlers (they are no longer ready); without it, Prefetch is ignored and
// only what the handlers hold leaves the queue.
func (s *suite) prefetch(t *testing.T) {
	b := s.broker(t)
	q := queue(t, b)
	publish(t, b, q, newMessage("1"), newMessage("2"), newMessage("3"), newMessage("4"), newMessage("5"))
	eventuallyReady(t, b, q, 5)
	sub := subscribe(t, b, q, broker.SubscribeOptions{Concurrency: 1, Prefetch: 3})
	first := sub.next(t)
	if s.has.Prefetch {
		eventuallyReady(t, b, q, 2, "one with its handler, two prefetched")
	} else {
		eventuallyReady(t, b, q, 4, "only the one with its handler left the queue")
	}
	first.Ack()
	for range 4 {
		sub.next(t).Ack()
	}
	eventuallyReady(t, b, q, 0)
}

// Closing a subscriber ends its subscriptions (their channels close) within its drain
// timeout, and a message a handler never settled goes back to its queue, for the next
// subscriber; cancelling a subscription's context ends it too.
func (s *suite) subscriberClose(t *testing.T) {
	b := s.broker(t)
	q := queue(t, b)
	m := newMessage("unsettled")
	publish(t, b, q, m)
	sub := subscribe(t, b, q, broker.SubscribeOptions{})
	sameMessage(t, m, sub.next(t)) // never settled
	closed := make(chan error, 1)
	go func() { closed <- sub.sub.Close() }()
	select {
	case err := <-closed:
		assert.NoError(t, err)
	case <-time.After(eventually):
		require.FailNow(t, "Close waited for a handler that never settles")
	}
	_, open := <-sub.msgs
	assert.False(t, open, "the subscription ended with its subscriber")
	next := subscribe(t, b, q, broker.SubscribeOptions{})
	again := next.next(t)
	sameMessage(t, m, again)
	again.Ack()

	c, cancel := context.WithCancel(context.Background())
	msgs, err := b.Subscriber(broker.SubscribeOptions{}).Subscribe(c, q)
	require.NoError(t, err)
	cancel()
	select {
	case _, open := <-msgs:
		assert.False(t, open, "nothing delivered once the context ended")
	case <-time.After(eventually):
		assert.Fail(t, "the subscription did not end with its context")
	}
}

// Pause stops a subscriber taking deliveries (Paused reports it) and lets the messages
// with a handler finish as usual; Resume with a limit hands out only that many at once,
// Resume(0) as many as Concurrency.
func (s *suite) pause(t *testing.T) {
	b := s.broker(t)
	q := queue(t, b)
	sub := subscribe(t, b, q, broker.SubscribeOptions{Concurrency: 2})
	publish(t, b, q, newMessage("before"))
	running := sub.next(t)
	sub.sub.Pause()
	assert.True(t, sub.sub.Paused())
	require.True(t, running.Ack(), "a message with its handler finishes")

	publish(t, b, q, newMessage("paused 1"), newMessage("paused 2"))
	sub.none(t, "paused")
	sub.sub.Resume(1)
	assert.False(t, sub.sub.Paused())
	one := sub.next(t)
	sub.none(t, "Resume(1) hands out one message at once")
	one.Ack()
	sub.next(t).Ack()

	sub.sub.Resume(0)
	publish(t, b, q, newMessage("resumed 1"), newMessage("resumed 2"))
	both := []*message.Message{sub.next(t), sub.next(t)}
	for _, m := range both {
		m.Ack()
	}
	sub.none(t, "the message acked while paused is not delivered again")
	eventuallyReady(t, b, q, 0)
}
