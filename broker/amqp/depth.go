package amqp

import (
	"context"
	"fmt"
)

// QueueDepth returns the number of messages ready in queue, as RabbitMQ reports it to a
// passive declare (unacked deliveries are not counted). The retry step's adaptive policy
// reads it as the queue's backlog.
func (b *Broker) QueueDepth(ctx context.Context, queue string) (int, error) {
	ch, err := b.conn.channel(ctx)
	if err != nil {
		return 0, err
	}
	// A passive declare of a missing queue closes its channel: this one is for that alone.
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("read depth of queue %q: %w", queue, err)
	}
	return q.Messages, nil
}
