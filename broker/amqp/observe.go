package amqp

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice"
)

// Connected reports whether the broker's connection is up now (false while it
// reconnects, and after Close).
func (b *Broker) Connected() bool {
	if b.conn.isClosing() {
		return false
	}
	b.conn.mu.Lock()
	conn := b.conn.conn
	b.conn.mu.Unlock()
	return conn != nil && !conn.IsClosed()
}

// Reconnects is how many times the connection was re-established after a loss.
func (b *Broker) Reconnects() int64 { return b.conn.reconnects.Load() }

// QueueDepth returns the ready messages and the consumers of queue, with a passive
// queue.declare: it creates nothing, and needs no plugin. RabbitMQ does not say how many
// messages are delivered and unacknowledged this way (the management API does), so
// UnackedKnown is false. A queue that does not exist is sluice.ErrQueueNotFound. The
// signature is telemetry.DepthSource's: a Broker is one.
func (b *Broker) QueueDepth(ctx context.Context, queue string) (sluice.QueueDepth, error) {
	ch, err := b.conn.channel(ctx)
	if err != nil {
		return sluice.QueueDepth{}, err
	}
	// A passive declare of a missing queue closes its channel: this one is for that alone.
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		var amqpErr *amqp.Error
		if errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound {
			return sluice.QueueDepth{}, fmt.Errorf("queue %q: %w", queue, sluice.ErrQueueNotFound)
		}
		return sluice.QueueDepth{}, fmt.Errorf("read depth of queue %q: %w", queue, err)
	}
	return sluice.QueueDepth{Ready: int64(q.Messages), Consumers: int64(q.Consumers)}, nil
}
