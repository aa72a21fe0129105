package router

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/router/internal/claim"
	"github.com/sluice-go/sluice/router/internal/rebalance"
)

// ErrPartitions is returned for a negative partition count.
var ErrPartitions = errors.New("router: partitions must be 1 or more")

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

// partitionHandlerName returns the name of the handler of partition k, "<name>#<k>".
func partitionHandlerName(name string, k int) string { return name + "#" + strconv.Itoa(k) }

// addPartitioned registers one handler per partition; s.mu is held.
func (s *Stack) addPartitioned(name, queue, outputTopic string, h message.HandlerFunc, hc handlerConfig, comp *carry.Compensation) error {
	if hc.partitions < 0 {
		return fmt.Errorf("%w: handler %q has %d", ErrPartitions, name, hc.partitions)
	}
	names := make([]string, hc.partitions)
	for k := range names {
		names[k] = partitionHandlerName(name, k)
		if s.names[names[k]] {
			return fmt.Errorf("%w: %q", ErrDuplicateHandler, names[k])
		}
	}
	s.names[name] = true
	if outputTopic != "" {
		s.plan.Output(outputTopic)
	}
	s.plan.Partitioned(queue, hc.partitions)
	var claimer *claim.Claimer
	var reb *rebalance.Rebalancer
	if hc.rebalance {
		r, err := s.newRebalancer(name, queue, hc)
		if err != nil {
			return err
		}
		reb = r
	} else if counter, ok := s.broker.(broker.ConsumerCounter); ok {
		claimer = claim.New(queue, hc.partitions, counter, claim.Interval, s.logger)
	}
	for k, hname := range names {
		s.names[hname] = true
		hc.journal = topology.Partition(queue, k)
		stack := withCompensation(s.compose(h, outputTopic, hc), comp)
		var sub message.Subscriber = s.subscriber(name, hc)
		if reb != nil {
			sub = reb.Subscriber(sub, k, s.logger)
		} else if claimer != nil {
			sub = claimer.Subscriber(sub, k, s.logger)
		}
		s.consumes(hname, topology.Partition(queue, k))
		s.router.AddConsumerHandler(hname, topology.Partition(queue, k), sub, func(m *message.Message) error {
			_, err := stack(m)
			return err
		})
	}
	return nil
}
