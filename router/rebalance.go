package router

import (
	"fmt"
	"time"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/router/internal/handover"
	"github.com/sluice-go/sluice/router/internal/rebalance"
)

// WithRebalancing makes the instances of a partitioned handler (WithPartitions) share its
// partitions fairly and move them when an instance joins or leaves, on a broker that
// keeps a membership (broker.Joiner: RabbitMQ's amqp.Broker.Join says how instances hear
// of each other;
// heartbeat is its interval, zero meaning 500 ms). All instances compute the same
// assignment from the member list (rendezvous hashing with bounded loads) and each
// consumes only its own partitions. An instance gives a partition up between messages: it
// cancels its consumer, hands the router what was already delivered or gives it back,
// waits for the handlers of what it holds, and lets the partition pass to its new owner,
// which subscribed as soon as it computed the assignment (how RabbitMQ passes it: package
// package amqp, "Partitioned queues"). The rebalancing itself is package
// router/internal/rebalance's; the hand-over of done keys, router/internal/handover's.
//
// A join is followed within about a heartbeat, a graceful leave (Close) at once, and an
// instance killed (connection lost, no goodbye) within three heartbeats and one more.
// With Config.Idempotency an idempotency.Guard, an instance giving a partition up
// broadcasts its done keys to the others (before cancelling its consumer and again once
// what it held settled), so the new owner knows them; a killed instance hands nothing
// over: see docs/scaling.md (Scaling out). It needs WithPartitions; it replaces the start-up
// claiming of WithPartitions.
func WithRebalancing(heartbeat time.Duration) HandlerOption {
	return func(c *handlerConfig) { c.rebalance, c.heartbeat = true, heartbeat }
}

// newRebalancer returns the rebalancer of a WithRebalancing registration; s.mu is held.
func (s *Stack) newRebalancer(name, queue string, hc handlerConfig) (*rebalance.Rebalancer, error) {
	j, ok := s.broker.(broker.Joiner)
	if !ok {
		return nil, fmt.Errorf("%w: handler %q sets WithRebalancing but broker %q keeps no membership", ErrInvalidOption, name, s.broker.Name())
	}
	var keys rebalance.Handover // nil without an idempotency store
	if ks, ok := s.cfg.Idempotency.(keyStore); ok {
		keys = handover.New(ks.Store(), s.logger)
	}
	r := rebalance.New(queue, hc.partitions, j, hc.heartbeat, keys, s.logger)
	s.parts = append(s.parts, part{handler: name, held: r.Held})
	return r, nil
}

// keyStore is the idempotency step that keeps its keys in an idempotency.Store (the
// idempotency.Guard), whose done keys a rebalanced handler hands over.
type keyStore interface {
	Store() *idempotency.Store
}
