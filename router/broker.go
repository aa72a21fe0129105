package router

import (
	"math"
	"time"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/lifecycle"
)

// Broker is what the stack requires of a broker: package broker's contract, one capability
// per interface. sluice's RabbitMQ broker (amqp.Connect, amqp.New) and its embedded one
// (memory.New) are Brokers as they are; the stack never asks which one it has.
type Broker = broker.Broker

// subscriber returns a subscriber with the handler's concurrency and prefetch, and the
// bound within which the stack settles each of its deliveries (settleBound), so that the
// broker does not take a delivery back while the stack still decides about it (RabbitMQ's
// consumer timeout). name is the handler's registration name, under which Describe shows
// the bound; s.mu is held.
func (s *Stack) subscriber(name string, hc handlerConfig) broker.Subscriber {
	within := settleBound(s.cfg.HandlerTimeout, s.cfg.AbandonGrace, hc.concurrency, hc.prefetch)
	if s.settle == nil {
		s.settle = map[string]time.Duration{}
	}
	s.settle[name] = within
	return s.broker.Subscriber(broker.SubscribeOptions{Concurrency: hc.concurrency, Prefetch: hc.prefetch, SettleWithin: within})
}

// settleMargin is added once to a settle bound: the subscriber's requeue backoff after a
// failed hand-off (amqp.Config.NackBackoffMax, 10 s by default) and the ack's own delays.
const settleMargin = 10 * time.Second

// settleBound is how long after its delivery the stack settles (acks or gives back) a
// delivery of a handler with concurrency and prefetch (zero: as many as concurrency), the
// stack's timeout and grace in force:
//
//	ceil(prefetch / concurrency) × (timeout + grace + 2 × lifecycle.HandoffTimeout) + settleMargin
//
// A delivery may wait in the prefetch buffer while every slot is busy, a slot's turn at
// most: the attempt, abandoned at timeout + grace, or, when the handler returned, once
// sluice's own work inside the attempt (its outputs' publish, its journal record) has had
// a HandoffTimeout more; then the retry copy's or dead letter's hand-off, bounded by a
// HandoffTimeout of its own. A bound too large to count is math.MaxInt64.
func settleBound(timeout, grace time.Duration, concurrency, prefetch int) time.Duration {
	concurrency = max(concurrency, 1)
	prefetch = max(prefetch, concurrency)
	turns := time.Duration((prefetch + concurrency - 1) / concurrency)
	turn := timeout + grace + 2*lifecycle.HandoffTimeout
	if turn <= 0 || turn > (math.MaxInt64-settleMargin)/turns {
		return math.MaxInt64
	}
	return turns*turn + settleMargin
}
