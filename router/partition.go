package router

import (
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/router/internal/partition"
	"github.com/sluice-go/sluice/router/internal/parts"
)

// WithPartitions consumes the handler's queue Q as p key-partitioned queues Q.p0 …
// Q.p(p-1) instead of Q itself, so that every message of one idempotency key is handled by
// one instance at a time, and in-memory idempotency holds when the service runs as several
// instances.
//
// The stack registers one Watermill handler per partition, named "<name>#<k>" and
// consuming Q.p<k> with the handler's concurrency and prefetch, and Run declares the
// partitions through the broker (Broker.DeclarePartitioned). How RabbitMQ routes keys to
// partitions, and where retries and dead letters of a partition go, is told once, in
// package broker/amqp's documentation ("Partitioned queues").
//
// RabbitMQ (3.10) gives a partition to the consumer that subscribed to it first and moves
// it only when that consumer goes away. So that instances started together share the
// partitions rather than the fastest taking them all, an instance on a broker that reports
// consumer counts (RabbitMQ) claims the partitions nobody consumes one at a time, every
// half second, while it holds no more than the other instances together; it subscribes at
// once, as a standby, to partitions another instance holds. A lone instance so takes all
// of p partitions within (p-1)/2 seconds. Partitions are not rebalanced later: an instance
// started after the others are settled, or restarted, stays a standby until a partition
// moves.
//
// The handlers of one WithPartitions registration share one breaker (named after the
// handler unless WithBreaker says otherwise). Zero means no partitions.
func WithPartitions(p int) HandlerOption { return func(c *handlerConfig) { c.partitions = p } }

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
// With Config.Idempotency (or Config.Guard), an instance giving a partition up
// broadcasts its done keys to the others (before cancelling its consumer and again once
// what it held settled), so the new owner knows them; a killed instance hands nothing
// over: see docs/scaling.md (Scaling out). It needs WithPartitions; it replaces the start-up
// claiming of WithPartitions.
func WithRebalancing(heartbeat time.Duration) HandlerOption {
	return func(c *handlerConfig) { c.rebalance, c.heartbeat = true, heartbeat }
}

// addPartitioned registers one handler per partition (package internal/partition); s.mu
// is held.
func (s *Stack) addPartitioned(name, queue, outputTopic string, h message.HandlerFunc, hc handlerConfig, comp *carry.Compensation) error {
	set, err := partition.New(partition.Config{Name: name, Queue: queue, Partitions: hc.partitions, Rebalance: hc.rebalance,
		Heartbeat: hc.heartbeat, Broker: s.broker, Keys: s.guardStore(), Logger: s.logger})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	handlers := set.Handlers()
	for _, ph := range handlers {
		if s.names[ph.Name] {
			return fmt.Errorf("%w: %q", ErrDuplicateHandler, ph.Name)
		}
	}
	s.names[name] = true
	if outputTopic != "" {
		s.plan.Output(outputTopic)
	}
	s.plan.Partitioned(queue, hc.partitions)
	if held := set.Held(); held != nil {
		s.parts.Add(parts.Part{Handler: name, Held: held})
	}
	for _, ph := range handlers {
		s.names[ph.Name] = true
		hc.journal = ph.Queue
		stack := withCompensation(s.compose(h, outputTopic, hc), comp)
		s.consumes(ph.Name, ph.Queue)
		s.router.AddConsumerHandler(ph.Name, ph.Queue, set.Subscriber(s.subscriber(name, hc), ph.K), func(m *message.Message) error {
			_, err := stack(m)
			return err
		})
	}
	return nil
}

// HeldPartitions returns the partitions of the rebalanced handler name (WithRebalancing)
// that this instance consumes now, sorted; nil for another handler.
func (s *Stack) HeldPartitions(name string) []int { return slices.Clone(s.parts.Held(name)) }
