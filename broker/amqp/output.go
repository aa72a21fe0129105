package amqp

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/internal/topology"
)

// DeclareOutputQueue declares queue for a stack that only publishes to it: durable, with the
// arguments DeclareQueue gives a consumed queue (so the consumer's own declaration, from
// this process or another, agrees with it), but without Q.dlq and the route back from the
// delay cascade, which only a consumer needs and its DeclareQueue adds. A queue that exists
// is left as it is.
func (b *Broker) DeclareOutputQueue(ctx context.Context, queue string) error {
	found, err := b.passive(ctx, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err
	})
	if err != nil || found {
		if err != nil {
			return fmt.Errorf("check output queue %q: %w", queue, err)
		}
		return nil
	}
	ch, err := b.conn.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	extra := amqp.Table{
		"x-dead-letter-exchange":    topology.DeadLetterExchange,
		"x-dead-letter-routing-key": queue,
	}
	if b.cfg.QueueType == QueueQuorum && b.cfg.DeliveryLimit > 0 {
		extra["x-delivery-limit"] = int64(b.cfg.DeliveryLimit)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, queueArgs(b.cfg.QueueType, extra)); err != nil {
		return fmt.Errorf("declare output queue %q (type %s): %w", queue, b.cfg.QueueType, inequivalent(err, "queue", queue))
	}
	return nil
}
