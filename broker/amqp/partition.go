package amqp

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/mask"
	"github.com/sluice-go/sluice/internal/topology"
)

// Key-partitioned consumption (see the package documentation, "Partitioned queues").
const (
	// consistentHashExchangeType is the exchange type of RabbitMQ's consistent-hash plugin,
	// rabbitmq_consistent_hash_exchange, which routes a partitioned queue's messages.
	consistentHashExchangeType = "x-consistent-hash"
	// maxPartitionKeyBytes is the longest partition key: it travels as the routing key,
	// which AMQP 0-9-1 limits to 255 bytes.
	maxPartitionKeyBytes = 255
)

// Partition errors.
var (
	// ErrConsistentHashUnavailable means the node refused the x-consistent-hash exchange
	// type: the plugin is not enabled there.
	ErrConsistentHashUnavailable = errors.New("amqp: RabbitMQ's consistent-hash exchange is not available: " +
		"enable it with rabbitmq-plugins enable rabbitmq_consistent_hash_exchange (on every node of a cluster)")
)

// unknownExchangeType reports whether the broker refused an exchange type it does not
// know: 3.10 closes the connection with 503 COMMAND_INVALID "invalid exchange type", 4.3
// the channel with 406 PRECONDITION_FAILED "unknown exchange type".
func unknownExchangeType(e *amqp.Error) bool {
	switch e.Code {
	case amqp.CommandInvalid:
		return strings.Contains(e.Reason, "exchange type")
	case amqp.PreconditionFailed:
		return strings.Contains(e.Reason, "unknown exchange type")
	}
	return false
}

// consistentHashType is the exchange type DeclarePartitioned declares; tests point it at a
// type no broker has, to exercise the missing-plugin path on any RabbitMQ.
var consistentHashType = consistentHashExchangeType

// DeclarePartitioned declares queue as partitions key-partitioned queues: the
// consistent-hash exchange topology.PartitionExchange(queue); the queues topology.Partition(queue, 0 …
// partitions-1), each with single-active-consumer and bound to the exchange with weight 1;
// each partition's route back from the delay cascade; and one dead-letter queue
// topology.DLQ(queue) that every partition's dead letters go to. It is idempotent.
//
// The declarations run on a connection of their own: RabbitMQ answers an exchange type it
// does not know (the plugin is off) by closing the whole connection, which must not take
// the broker's consumers and publishes with it. That case is ErrConsistentHashUnavailable;
// a queue that exists with partition number partitions or above is a declaration
// inequivalent to the one before (broker.ErrInequivalent): the exchange would keep routing
// keys to partitions that nobody consumes.
func (b *Broker) DeclarePartitioned(ctx context.Context, queue string, partitions int) error {
	if partitions < 1 {
		return fmt.Errorf("amqp: partitions of queue %q: %d, want at least 1", queue, partitions)
	}
	if err := b.declareCascade(ctx); err != nil {
		return err
	}
	conn, url, err := b.conn.dialSide(ctx)
	if err != nil {
		return fmt.Errorf("declare partitioned queue %q: %w", queue, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("declare partitioned queue %q: open channel: %w", queue, err)
	}
	defer ch.Close()

	exchange := topology.PartitionExchange(queue)
	if err := ch.ExchangeDeclare(exchange, consistentHashType, true, false, false, false, nil); err != nil {
		var amqpErr *amqp.Error
		if errors.As(err, &amqpErr) && unknownExchangeType(amqpErr) {
			return fmt.Errorf("declare exchange %q of type %s on %s: %s: %w", exchange, consistentHashType, mask.URL(url), amqpErr.Reason, ErrConsistentHashUnavailable)
		}
		return fmt.Errorf("declare exchange %q of type %s (an exchange of that name with another type exists?): %w", exchange, consistentHashType, err)
	}
	if err := ch.ExchangeDeclare(topology.DeadLetterExchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %q: %w", topology.DeadLetterExchange, err)
	}
	if ch, err = b.declareDLQ(ctx, ch, topology.DLQ(queue)); err != nil {
		return err
	}
	// A refused partition declaration closes ch; the next attempt opens another.
	defer func() {
		if ch != nil {
			_ = ch.Close()
		}
	}()
	for k := 0; k < partitions; k++ {
		err := b.declareAgainIfCrashed(ctx, topology.Partition(queue, k), func() error {
			if ch == nil {
				var err error
				if ch, err = conn.Channel(); err != nil {
					return fmt.Errorf("declare partitioned queue %q: open channel: %w", queue, err)
				}
			}
			err := b.declarePartition(ch, queue, k)
			if err != nil {
				_ = ch.Close()
				ch = nil
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	return checkNoPartition(conn, queue, partitions)
}

func (b *Broker) declarePartition(ch *amqp.Channel, queue string, k int) error {
	part := topology.Partition(queue, k)
	dlq := topology.DLQ(queue)
	// The dead letters of every partition share Q.dlq; their x-original-queue names the
	// partition, so a replay goes back to the partition that owns the key.
	if err := ch.QueueBind(dlq, part, topology.DeadLetterExchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %q to %q with key %q: %w", dlq, topology.DeadLetterExchange, part, err)
	}
	extra := amqp.Table{
		// One consumer at a time gets the partition, so one instance's in-memory
		// idempotency sees every message of a key; RabbitMQ hands the partition to a
		// waiting consumer when the active one goes away.
		"x-single-active-consumer":  true,
		"x-dead-letter-exchange":    topology.DeadLetterExchange,
		"x-dead-letter-routing-key": part,
	}
	if b.cfg.QueueType == QueueQuorum && b.cfg.DeliveryLimit > 0 {
		extra["x-delivery-limit"] = int64(b.cfg.DeliveryLimit)
	}
	if _, err := ch.QueueDeclare(part, true, false, false, false, queueArgs(b.cfg.QueueType, extra)); err != nil {
		return fmt.Errorf("declare partition queue %q (type %s, single active consumer): %w", part, b.cfg.QueueType, err)
	}
	// The binding key of a consistent-hash exchange is the partition's weight: equal
	// weights give each partition an equal share of the keys.
	if err := ch.QueueBind(part, "1", topology.PartitionExchange(queue), false, nil); err != nil {
		return fmt.Errorf("bind partition queue %q to exchange %q: %w", part, topology.PartitionExchange(queue), err)
	}
	if err := ch.QueueBind(part, deliveryBindingKey(part), topology.DelayDeliveryExchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %q to %q: %w", part, topology.DelayDeliveryExchange, err)
	}
	return nil
}

// checkNoPartition fails when partition number partitions exists: it was declared by a
// configuration with more partitions, and stays bound to the exchange, which would route
// a share of the keys to it while nobody consumes it.
func checkNoPartition(conn *amqp.Connection, queue string, partitions int) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("check partitions of queue %q: open channel: %w", queue, err)
	}
	// A passive declare of a missing queue closes its channel: this one is for that alone.
	defer ch.Close()
	extra := topology.Partition(queue, partitions)
	_, err = ch.QueueDeclarePassive(extra, true, false, false, false, nil)
	if err == nil {
		return fmt.Errorf("queue %q exists beside the %d partitions declared for %q: %w; "+
			"move its messages and delete it (and any later partition) before running with fewer partitions",
			extra, partitions, queue, broker.ErrInequivalent)
	}
	var amqpErr *amqp.Error
	if errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound {
		return nil
	}
	return fmt.Errorf("check partitions of queue %q: %w", queue, err)
}

// PublishPartitioned publishes messages to the partitioned queue with key as partition key
// (routing key of its consistent-hash exchange), so every message of a key lands in the same
// partition, and waits for their confirms. Use the key the consumer's idempotency step uses.
func (b *Broker) PublishPartitioned(ctx context.Context, queue, key string, messages ...*message.Message) error {
	if key == "" || len(key) > maxPartitionKeyBytes {
		return fmt.Errorf("publish to partitioned queue %q: key of %d bytes: %w", queue, len(key), broker.ErrPartitionKey)
	}
	return b.pub.PublishTo(ctx, topology.PartitionExchange(queue), key, messages...)
}

// dialSide opens a short-lived connection of its own to the first node that answers, for
// declarations that could make RabbitMQ close their connection. It returns the URL used.
func (c *connection) dialSide(ctx context.Context) (*amqp.Connection, string, error) {
	var errs []error
	for _, u := range c.urls {
		if err := ctx.Err(); err != nil {
			return nil, "", err
		}
		conn, err := c.dial(u)
		if err == nil {
			return conn, u, nil
		}
		errs = append(errs, fmt.Errorf("connect to %s: %w", mask.URL(u), maskErr(err, c.urls)))
	}
	return nil, "", errors.Join(errs...)
}

// onEachNode runs fn on a channel of a short-lived connection of its own (as dialSide's),
// node after node in the URLs' order until fn succeeds: a node in a partition's minority
// answers connections but cannot commit a declaration, which its peers can. A refusal
// another node would repeat (the object is missing, or exists with other arguments; access
// refused) ends the walk: a passive check of a cascade not declared yet dials one node,
// not every one.
func (c *connection) onEachNode(ctx context.Context, fn func(*amqp.Channel) error) error {
	var errs []error
	for _, u := range c.urls {
		if err := ctx.Err(); err != nil {
			return errors.Join(append(errs, err)...)
		}
		conn, err := c.dial(u)
		if err != nil {
			errs = append(errs, fmt.Errorf("connect to %s: %w", mask.URL(u), maskErr(err, c.urls)))
			continue
		}
		err = func() error {
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				return err
			}
			defer ch.Close()
			return fn(ch)
		}()
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("on %s: %w", mask.URL(u), maskErr(err, c.urls)))
		var amqpErr *amqp.Error
		if errors.As(err, &amqpErr) && (amqpErr.Code == amqp.NotFound || amqpErr.Code == amqp.PreconditionFailed || amqpErr.Code == amqp.AccessRefused) {
			break
		}
	}
	return errors.Join(errs...)
}

// ConsumerCount returns how many consumers queue has, as RabbitMQ reports it: all of them
// on a classic queue; on a quorum queue with single-active-consumer only the active one,
// so 0 means nobody consumes it. The stack uses it to claim partitions (see
// router.WithPartitions).
func (b *Broker) ConsumerCount(ctx context.Context, queue string) (int, error) {
	ch, err := b.conn.channel(ctx)
	if err != nil {
		return 0, err
	}
	// A passive declare of a missing queue closes its channel: this one is for that alone.
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("count consumers of queue %q: %w", queue, err)
	}
	return q.Consumers, nil
}
