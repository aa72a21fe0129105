package broker

import (
	"context"
	"sync"
)

// Settlement is how a delivery leaves its consumer: what the subscriber tells the broker
// once the message is acked or nacked. A step that nacks a message says which settlement it
// wants (Delivery.Settle); a nack without one is SettleReject. The broker conformance suite
// (package broker/brokertest) states what each one does on a broker.
type Settlement uint8

// The settlements.
const (
	// SettleAck is an acknowledged delivery: done, removed from its queue.
	SettleAck Settlement = iota
	// SettleReturn returns the message unprocessed, at once: no fault of the message (a
	// paused handler, a stopping consumer), so not a failure. RabbitMQ: basic.nack with
	// requeue, which RabbitMQ 4.x does not count toward a quorum queue's delivery limit.
	SettleReturn
	// SettleHoldBack rejects the message for its queue's own delayed retry
	// (NativeRetrier), at once: the queue holds it back, and counts it as a failed
	// delivery. RabbitMQ: basic.reject with requeue.
	SettleHoldBack
	// SettleReject rejects the message as a failure: requeued after a pause that grows with
	// the subscriber's consecutive rejections, so a hand-off that keeps failing does not
	// spin, and counted toward a delivery limit. RabbitMQ: basic.reject with requeue. It is
	// what a nack without a settlement means.
	SettleReject
)

// Delivery is what a subscriber and the steps handling one of its deliveries tell each
// other beside the ack or nack: how a nacked message is to be settled (Settle), and an
// ack held until work a step started after the handler succeeded is confirmed (HoldAck).
//
// A subscriber that supports it gives each delivery's message context one (WithDelivery);
// a step reaches it with DeliveryFrom. A plain Watermill subscriber gives none: DeliveryFrom
// returns nil, whose methods are safe and do nothing (HoldAck reports false, Settlement is
// SettleReject), so every step works the same on it, with a nack's default settlement.
type Delivery struct {
	mu         sync.Mutex
	settlement Settlement
	settled    bool // Settle was called
	wait       func(stop <-chan struct{}) error
	sealed     bool // HeldAck was called: the delivery is being settled
}

type deliveryKey struct{}

// deliveryCtx is a context carrying its Delivery in one allocation: every delivery gets
// one.
type deliveryCtx struct {
	context.Context
	d Delivery
}

func (c *deliveryCtx) Value(key any) any {
	if key == (deliveryKey{}) {
		return &c.d
	}
	return c.Context.Value(key)
}

// WithDelivery returns ctx carrying a new Delivery, for a delivery's message context.
func WithDelivery(ctx context.Context) (context.Context, *Delivery) {
	c := &deliveryCtx{Context: ctx}
	return c, &c.d
}

// DeliveryFrom returns the Delivery of the message whose context is ctx, or nil outside a
// subscriber that gives them (every method of a nil Delivery is safe).
func DeliveryFrom(ctx context.Context) *Delivery {
	d, _ := ctx.Value(deliveryKey{}).(*Delivery)
	return d
}

// Settle says how the subscriber settles the message if it is nacked; the last call
// before the nack wins. It does nothing on a nil Delivery, and an ack ignores it.
func (d *Delivery) Settle(s Settlement) {
	if d == nil {
		return
	}
	d.mu.Lock()
	d.settlement, d.settled = s, true
	d.mu.Unlock()
}

// Settlement is how the subscriber settles the message when it is nacked: what Settle
// said, or SettleReject when nothing did (and on a nil Delivery).
func (d *Delivery) Settlement() Settlement {
	if d == nil {
		return SettleReject
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.settled {
		return SettleReject
	}
	return d.settlement
}

// HoldAck asks the subscriber to acknowledge the message only once wait returned nil, and
// to return it to its queue (SettleReturn) when wait returns an error; the handler's slot
// takes the next delivery meanwhile. The idempotency step holds the ack for its journal
// record's confirm. wait runs once, off the handler's goroutine, whether the message was
// acked or nacked (a nack stands whatever wait returns); it must return once stop is
// closed, which the subscriber does when it closes and the wait has outlasted its drain
// timeout. The RabbitMQ subscriber runs the waits of one consumer one after the other, in
// the order their messages were handled, so a wait that blocks longer than its own
// condition needs holds back the acks of the messages handled after it.
//
// HoldAck reports false, holding nothing, on a nil Delivery, when an ack is held already,
// or once the subscriber is settling the delivery (HeldAck was called: an attempt
// abandoned at its handler timeout returning late): the caller then waits in place.
func (d *Delivery) HoldAck(wait func(stop <-chan struct{}) error) bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.wait != nil || d.sealed {
		return false
	}
	d.wait = wait
	return true
}

// HeldAck returns the wait a step holds the ack with, or nil. The subscriber calls it when
// the message is acked or nacked, to settle the delivery: no HoldAck succeeds after it.
func (d *Delivery) HeldAck() func(stop <-chan struct{}) error {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sealed = true
	return d.wait
}
