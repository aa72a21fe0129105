package amqp

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Topology names. See docs/DESIGN.md: Q's dead letters go to Q.dlq through the direct exchange
// sluice.dlx; the delay cascade sluice.delay.* is shared by every queue of a vhost.
const (
	// DeadLetterExchange is the direct exchange that routes dead letters to Q.dlq by key Q.
	DeadLetterExchange = "sluice.dlx"
	// DelayExchangePrefix names the cascade's level exchanges and queues: sluice.delay.00 …
	DelayExchangePrefix = "sluice.delay."
	// DelayDeliveryExchange receives what leaves the cascade and routes it to its queue.
	DelayDeliveryExchange = "sluice.delay.deliver"

	// DelayLevels is the number of cascade levels; level k holds a message 2^k units.
	DelayLevels = 26
	// DelayResolution is the cascade's unit: delays are exact to this.
	DelayResolution = 10 * time.Millisecond
	// MaxDelay is the longest delay the cascade can give (about 7.8 days).
	MaxDelay = time.Duration(1<<DelayLevels-1) * DelayResolution
)

// DLQName returns the dead-letter queue of queue.
func DLQName(queue string) string { return queue + ".dlq" }

// ArchiveName returns the archive of queue's dead letters, Q.dlq.archive, where package dlq
// moves archived dead letters (kept for a retention period, see dlq.DefaultRetention).
func ArchiveName(queue string) string { return DLQName(queue) + ".archive" }

// NoDeliveryLimit is the x-delivery-limit sluice gives the quorum queues that hold dead
// letters (Q.dlq, Q.dlq.archive). Every read of such a queue returns its messages, and a
// quorum queue counts each return as a delivery: RabbitMQ 4.x's default limit of 20 would
// delete a dead letter read 20 times. -1, which 4.x reads as "no limit", makes RabbitMQ 3.x
// drop every message at its first return (measured on 3.10), so sluice uses the largest
// 32-bit value instead, which no number of reads reaches, on every version.
const NoDeliveryLimit = 1<<31 - 1

// DeadLetterQueueArgs returns the arguments of a queue of type qt that holds dead letters:
// quorum ones get NoDeliveryLimit.
func DeadLetterQueueArgs(qt QueueType, extra amqp.Table) amqp.Table {
	args := queueArgs(qt, extra)
	if qt == QueueQuorum {
		args["x-delivery-limit"] = int64(NoDeliveryLimit)
	}
	return args
}

// delayLevelName returns the exchange and queue name of cascade level k.
func delayLevelName(k int) string { return fmt.Sprintf("%s%02d", DelayExchangePrefix, k) }

// delayEntryExchange is where a delay of units enters the cascade: the level of its highest
// set bit. Every level above would only pass it on (its digit there is 0), and each
// exchange hop costs the broker; entering at the top made a retry cross all 26.
func delayEntryExchange(units uint64) string {
	return delayLevelName(max(bits.Len64(units)-1, 0))
}

// deliveryBindingKey matches a routing key of DelayLevels digit words followed by queue;
// the fixed count of `*` keeps "a.b" and "b" apart.
func deliveryBindingKey(queue string) string {
	return strings.Repeat("*.", DelayLevels) + queue
}

func queueArgs(qt QueueType, extra amqp.Table) amqp.Table {
	args := amqp.Table{"x-queue-type": string(qt)}
	for k, v := range extra {
		args[k] = v
	}
	return args
}

// declareQueue declares queue and everything its failure paths need: the dead-letter
// exchange and Q.dlq, and the binding that brings delayed copies back to Q. It is
// idempotent; a queue that exists with other arguments is an error naming them.
func (b *Broker) declareQueue(ctx context.Context, queue string) error {
	ch, err := b.conn.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := b.declareCascade(ctx); err != nil {
		return err
	}
	if err := ch.ExchangeDeclare(DeadLetterExchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %q: %w", DeadLetterExchange, err)
	}
	dlq := DLQName(queue)
	if ch, err = b.declareDLQ(ctx, ch, dlq); err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.QueueBind(dlq, queue, DeadLetterExchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %q to %q: %w", dlq, DeadLetterExchange, err)
	}
	// RabbitMQ's own dead-lettering (a quorum queue's delivery limit) also lands in Q.dlq,
	// so a message that keeps crashing its consumer stops looping.
	extra := amqp.Table{
		"x-dead-letter-exchange":    DeadLetterExchange,
		"x-dead-letter-routing-key": queue,
	}
	if b.cfg.QueueType == QueueQuorum && b.cfg.DeliveryLimit > 0 {
		extra["x-delivery-limit"] = int64(b.cfg.DeliveryLimit)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, queueArgs(b.cfg.QueueType, extra)); err != nil {
		return fmt.Errorf("declare queue %q (type %s): %w", queue, b.cfg.QueueType, err)
	}
	if err := ch.QueueBind(queue, deliveryBindingKey(queue), DelayDeliveryExchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %q to %q: %w", queue, DelayDeliveryExchange, err)
	}
	return nil
}

// declareDLQ declares the dead-letter queue dlq on ch (see DeadLetterQueueArgs). A quorum
// DLQ declared by an earlier sluice without the delivery-limit argument cannot take it
// (RabbitMQ refuses to change a queue's arguments and closes ch): it is kept as it is, on a
// new channel, and a warning says how to lift its limit with a policy. It returns the
// channel to go on with.
func (b *Broker) declareDLQ(ctx context.Context, ch *amqp.Channel, dlq string) (*amqp.Channel, error) {
	_, err := ch.QueueDeclare(dlq, true, false, false, false, DeadLetterQueueArgs(b.cfg.QueueType, nil))
	if err == nil {
		return ch, nil
	}
	var ae *amqp.Error
	if b.cfg.QueueType != QueueQuorum || !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed || !strings.Contains(ae.Reason, "x-delivery-limit") {
		return ch, fmt.Errorf("declare queue %q (type %s): %w", dlq, b.cfg.QueueType, err)
	}
	next, cerr := b.conn.channel(ctx)
	if cerr != nil {
		return ch, cerr
	}
	if _, perr := next.QueueDeclarePassive(dlq, true, false, false, false, nil); perr != nil {
		_ = next.Close()
		return ch, fmt.Errorf("declare queue %q (type %s): %w", dlq, b.cfg.QueueType, err)
	}
	b.cfg.Logger.Warn("dead-letter queue declared without a delivery limit argument by an earlier version; "+
		"on RabbitMQ 4.x set a policy with delivery-limit -1 on it so that reading it never deletes messages",
		"queue", dlq)
	return next, nil
}

// declareCascade declares the delay cascade once per broker (it is shared, and
// re-declaring the same thing is harmless, so a lost race costs nothing).
//
// Level k is a topic exchange and a queue with x-message-ttl 2^k units. A routing key is
// DelayLevels binary digits, highest level first, then the destination queue. Level k's
// exchange sends a key whose digit k is 1 to its queue, and one whose digit is 0 on to
// level k-1's exchange. Every message in a level queue has the same TTL, so messages expire
// in arrival order: a long delay never holds back a short one. An expired message is
// dead-lettered, keeping its routing key, to level k-1's exchange; level 0 dead-letters to
// the delivery exchange, which routes on the destination.
func (b *Broker) declareCascade(ctx context.Context) error {
	b.cascadeMu.Lock()
	defer b.cascadeMu.Unlock()
	if b.cascadeDeclared {
		return nil
	}
	ch, err := b.conn.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(DelayDeliveryExchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %q: %w", DelayDeliveryExchange, err)
	}
	for k := 0; k < DelayLevels; k++ {
		name := delayLevelName(k)
		next := DelayDeliveryExchange
		if k > 0 {
			next = delayLevelName(k - 1)
		}
		if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %q: %w", name, err)
		}
		ttl := int64(time.Duration(1<<k) * DelayResolution / time.Millisecond)
		extra := amqp.Table{
			"x-message-ttl":          ttl,
			"x-dead-letter-exchange": next,
		}
		if b.cfg.DelayQueueType == QueueQuorum {
			// At-least-once dead-lettering: the message leaves level k only once the next
			// hop confirmed it, so a node crash mid-cascade cannot drop it.
			extra["x-dead-letter-strategy"] = "at-least-once"
			extra["x-overflow"] = "reject-publish"
		}
		if _, err := ch.QueueDeclare(name, true, false, false, false, queueArgs(b.cfg.DelayQueueType, extra)); err != nil {
			return fmt.Errorf("declare delay queue %q (type %s): %w", name, b.cfg.DelayQueueType, err)
		}
		pos := DelayLevels - 1 - k // word index of level k's digit
		prefix := strings.Repeat("*.", pos)
		if err := ch.QueueBind(name, prefix+"1.#", name, false, nil); err != nil {
			return fmt.Errorf("bind delay queue %q: %w", name, err)
		}
		if err := ch.ExchangeBind(next, prefix+"0.#", name, false, nil); err != nil {
			return fmt.Errorf("bind exchange %q to %q: %w", name, next, err)
		}
	}
	b.cascadeDeclared = true
	return nil
}

// delayRoutingKey encodes units as DelayLevels binary digits, highest level first, then
// the destination queue.
func delayRoutingKey(units uint64, queue string) string {
	var sb strings.Builder
	sb.Grow(DelayLevels*2 + len(queue))
	for k := DelayLevels - 1; k >= 0; k-- {
		if units&(1<<k) != 0 {
			sb.WriteString("1.")
		} else {
			sb.WriteString("0.")
		}
	}
	sb.WriteString(queue)
	return sb.String()
}
