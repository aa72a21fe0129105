package memory

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/topology"
)

// DeclareQueue creates queue and its dead-letter queue.
func (b *Broker) DeclareQueue(_ context.Context, queue string) error {
	if b.closed() {
		return broker.ErrClosed
	}
	b.queue(queue)
	b.queue(topology.DLQ(queue))
	return nil
}

// DeadLetter puts a copy of msg in queue's dead-letter queue (a partition's is the one its
// partitioned queue's partitions share).
func (b *Broker) DeadLetter(_ context.Context, queue string, msg *message.Message) error {
	if b.closed() {
		return broker.ErrClosed
	}
	b.queue(b.parts.dlq(queue)).push(copyMessage(msg), false)
	return nil
}
