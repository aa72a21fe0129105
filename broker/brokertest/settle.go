package brokertest

import (
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/topology"
)

// inARow is how many nacks in a row the settlement subtests time: five rejections in a row
// take at least pauseFloor (the first at once, then pauses that grow), five returns or
// hold-backs less.
const (
	inARow     = 5
	pauseFloor = 300 * time.Millisecond
)

// noSettlement nacks without saying how: the subscriber's default, SettleReject.
const noSettlement = broker.Settlement(255)

// nackInARow receives q's one message and nacks it n times in a row as how says, each time
// receiving it again, and returns how long the first inARow redeliveries took together and
// the last delivery; with deadLettered, the n-th nack leaves the message with the broker
// (its delivery limit) and the last delivery is nil.
func nackInARow(t *testing.T, sub *subscription, n int, how broker.Settlement, deadLettered bool) (time.Duration, *message.Message) {
	t.Helper()
	m := sub.next(t)
	var took time.Duration
	for i := range n {
		if how != noSettlement {
			broker.DeliveryFrom(m.Context()).Settle(how)
		}
		start := time.Now()
		require.True(t, m.Nack())
		if i == n-1 && deadLettered {
			return took, nil
		}
		again := sub.next(t)
		require.Equal(t, m.UUID, again.UUID, "nack %d: the same message comes back", i+1)
		if i < inARow {
			took += time.Since(start)
		}
		m = again
	}
	return took, m
}

// settlement checks how a nacked message leaves its consumer (broker.Settlement): on a
// broker with a delivery limit (Features.DeliveryLimit), a failure is counted and the
// message moves to its dead-letter queue after the limit; a return is not counted.
func (s *suite) settlement(t *testing.T) {
	limit := s.has.DeliveryLimit
	if limit > 0 {
		require.GreaterOrEqual(t, limit, inARow, "the suite nacks %d times in a row below the delivery limit", inARow)
	}
	// counted nacks a message limit+1 times, the last of which dead-letters it, on a broker
	// with a limit; a broker without one redelivers it after inARow nacks, acked then.
	counted := func(t *testing.T, how broker.Settlement) time.Duration {
		b := s.broker(t)
		q := queue(t, b)
		m := newMessage(t.Name())
		publish(t, b, q, m)
		sub := subscribe(t, b, q, broker.SubscribeOptions{})
		if limit == 0 {
			took, last := nackInARow(t, sub, inARow, how, false)
			sameMessage(t, m, last)
			last.Ack()
			sub.none(t, "acked at last")
			return took
		}
		took, last := nackInARow(t, sub, limit+1, how, true)
		require.Nil(t, last)
		eventuallyReady(t, b, topology.DLQ(q), 1, "a message failed %d times is dead-lettered by the broker's delivery limit %d", limit+1, limit)
		sub.none(t, "no longer delivered from its queue")
		dead := subscribe(t, b, topology.DLQ(q), broker.SubscribeOptions{}).next(t)
		sameMessage(t, m, dead)
		dead.Ack()
		return took
	}

	// SettleReject, what a nack without a settlement means, is a failure: the message is
	// requeued after a pause that grows with the subscriber's consecutive rejections (five
	// in a row take at least 300 ms), so a hand-off that keeps failing does not spin, and
	// it counts toward the delivery limit.
	t.Run("Reject", func(t *testing.T) {
		took := counted(t, noSettlement)
		assert.GreaterOrEqual(t, took, pauseFloor, "%d rejections in a row pause", inARow)
	})
	// SettleHoldBack rejects the message for its queue to hold back (NativeRetrier): at
	// once, with none of a rejection's pauses (five in a row take less than 300 ms), and
	// counted toward the delivery limit. On a queue without native retry it comes back at
	// once.
	t.Run("HoldBack", func(t *testing.T) {
		took := counted(t, broker.SettleHoldBack)
		assert.Less(t, took, pauseFloor, "%d hold-backs in a row take no rejection's pause", inARow)
	})
	// SettleReturn returns the message unprocessed: at once (five in a row take less than
	// 300 ms), and not counted: returned more times than the delivery limit, it is still
	// delivered from its queue, and acked at last.
	t.Run("Return", func(t *testing.T) {
		b := s.broker(t)
		q := queue(t, b)
		m := newMessage("returned")
		publish(t, b, q, m)
		sub := subscribe(t, b, q, broker.SubscribeOptions{})
		took, last := nackInARow(t, sub, max(inARow, limit+1), broker.SettleReturn, false)
		assert.Less(t, took, pauseFloor, "%d returns in a row take no rejection's pause", inARow)
		require.NotNil(t, last, "a returned message is still delivered")
		sameMessage(t, m, last)
		last.Ack()
		sub.none(t, "acked at last")
		eventuallyReady(t, b, topology.DLQ(q), 0, "returns are not counted toward the delivery limit")
	})
}

// HoldAck holds a delivery's ack until the held wait returns: the handler's slot takes the
// next delivery meanwhile; a wait returning nil acks the message, one returning an error
// returns it to its queue. Every delivery's context carries a Delivery, which holds one
// ack at most.
func (s *suite) holdAck(t *testing.T) {
	b := s.broker(t)
	q := queue(t, b)
	first, second := newMessage("first"), newMessage("second")
	publish(t, b, q, first, second)
	sub := subscribe(t, b, q, broker.SubscribeOptions{Concurrency: 1, Prefetch: 4})
	release := map[string]chan error{first.UUID: make(chan error, 1), second.UUID: make(chan error, 1)}
	for _, want := range []*message.Message{first, second} {
		m := sub.next(t)
		require.Equal(t, want.UUID, m.UUID, "handed out while the previous ack is held")
		d := broker.DeliveryFrom(m.Context())
		require.NotNil(t, d, "every delivery carries a broker.Delivery")
		wait := release[m.UUID]
		require.True(t, d.HoldAck(func(<-chan struct{}) error { return <-wait }))
		assert.False(t, d.HoldAck(func(<-chan struct{}) error { return nil }), "one hold a delivery")
		require.True(t, m.Ack())
	}
	sub.none(t, "held acks are not returns")
	release[first.UUID] <- nil                                 // confirmed: acked
	release[second.UUID] <- errors.New("record not confirmed") // returned
	again := sub.next(t)
	assert.Equal(t, second.UUID, again.UUID, "the message whose held wait failed is delivered again")
	again.Ack()
	sub.none(t, "the message whose held wait returned nil is done")
	eventuallyReady(t, b, q, 0)
}

// A held wait that does not end by itself is stopped (its stop channel closed) once its
// subscriber closes and the drain timeout has passed: Close returns, and the message, not
// acked, goes back to its queue.
func (s *suite) holdAckStopped(t *testing.T) {
	b := s.broker(t)
	q := queue(t, b)
	m := newMessage("held")
	publish(t, b, q, m)
	sub := subscribe(t, b, q, broker.SubscribeOptions{Concurrency: 1, Prefetch: 4})
	got := sub.next(t)
	stopped := make(chan struct{})
	require.True(t, broker.DeliveryFrom(got.Context()).HoldAck(func(stop <-chan struct{}) error {
		<-stop
		close(stopped)
		return errors.New("stopped waiting")
	}))
	require.True(t, got.Ack())
	closed := make(chan error, 1)
	go func() { closed <- sub.sub.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(eventually):
		require.FailNow(t, "Close waited for a held ack that never ends")
	}
	select {
	case <-stopped:
	default:
		require.FailNow(t, "Close returned before stopping the held wait")
	}
	again := subscribe(t, b, q, broker.SubscribeOptions{}).next(t)
	sameMessage(t, m, again)
	again.Ack()
}

// Once the subscriber settles a delivery (acked or nacked), HoldAck on it is refused: an
// attempt abandoned at its handler timeout and returning late waits in place instead of
// holding an ack nobody runs.
func (s *suite) holdAckAfterSettlement(t *testing.T) {
	b := s.broker(t)
	q := queue(t, b)
	publish(t, b, q, newMessage("acked"), newMessage("next"))
	sub := subscribe(t, b, q, broker.SubscribeOptions{Concurrency: 1, Prefetch: 4})
	acked := sub.next(t)
	require.True(t, acked.Ack())
	next := sub.next(t) // one handler slot: the first delivery is settled
	assert.False(t, broker.DeliveryFrom(acked.Context()).HoldAck(func(<-chan struct{}) error { return nil }), "after its ack")

	broker.DeliveryFrom(next.Context()).Settle(broker.SettleReturn)
	require.True(t, next.Nack())
	again := sub.next(t)
	require.Equal(t, next.UUID, again.UUID)
	assert.False(t, broker.DeliveryFrom(next.Context()).HoldAck(func(<-chan struct{}) error { return nil }), "after its nack")
	again.Ack()
	eventuallyReady(t, b, q, 0)
}
