package broker

import (
	"context"
	"sync"
)

// AckGate holds a delivery's acknowledgement until work a step started after the handler
// succeeded is confirmed, without keeping a handler slot meanwhile. The idempotency step
// uses it for its journal record: the handler's slot takes the next delivery while the
// record's confirm is on its way, and the delivery is acknowledged once it arrived.
//
// A subscriber that supports gates gives each delivery's context one (WithAckGate) and,
// once the message is acked or nacked, runs the held wait (Settle) off the handler's
// goroutine; a step holds the ack with HoldAck. A subscriber without gates (the embedded
// broker, a plain Watermill subscriber) makes HoldAck report false, and the step waits in
// place as before.
type AckGate struct {
	mu     sync.Mutex
	wait   func(stop <-chan struct{}) error
	sealed bool // Held was called: the delivery is being settled
}

type ackGateKey struct{}

// gateCtx is a context carrying its gate in one allocation: every delivery gets one.
type gateCtx struct {
	context.Context
	gate AckGate
}

func (c *gateCtx) Value(key any) any {
	if key == (ackGateKey{}) {
		return &c.gate
	}
	return c.Context.Value(key)
}

// WithAckGate returns ctx carrying a new gate, for a delivery's message context.
func WithAckGate(ctx context.Context) (context.Context, *AckGate) {
	c := &gateCtx{Context: ctx}
	return c, &c.gate
}

// HoldAck asks the subscriber of the message whose context is ctx to acknowledge it only
// once wait returned nil, and to give it back to its queue (nack with requeue) when wait
// returns an error. wait runs once, off the handler's goroutine, whether the message was
// acked or nacked; it must return once stop is closed, which the subscriber does when it
// closes and the wait has outlasted its drain timeout. HoldAck reports false, holding
// nothing, when the subscriber has no gate, the gate is held already, or the delivery is
// already being settled (an attempt abandoned at its handler timeout returning late): the
// caller then waits in place.
func HoldAck(ctx context.Context, wait func(stop <-chan struct{}) error) bool {
	g, ok := ctx.Value(ackGateKey{}).(*AckGate)
	if !ok {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.wait != nil || g.sealed {
		return false
	}
	g.wait = wait
	return true
}

// Held returns the wait a step holds the ack with, or nil. The subscriber calls it when it
// settles the delivery: no HoldAck succeeds after it.
func (g *AckGate) Held() func(stop <-chan struct{}) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sealed = true
	return g.wait
}
