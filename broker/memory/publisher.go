package memory

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
)

// Publish puts copies of messages at the end of the queue named topic.
func (b *Broker) Publish(topic string, messages ...*message.Message) error {
	if b.closed() {
		return broker.ErrClosed
	}
	if b.parts.count(topic) > 0 {
		return fmt.Errorf("publish to queue %q: %w", topic, errPartitioned)
	}
	q := b.queue(topic)
	for _, m := range messages {
		q.push(copyMessage(m), false)
	}
	return nil
}

// PublishConfirmed is Publish within ctx: an in-process push is confirmed once it is in
// the queue, so ctx only refuses a publish it has already ended.
func (b *Broker) PublishConfirmed(ctx context.Context, queue string, messages ...*message.Message) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("publish to queue %q: %w", queue, err)
	}
	return b.Publish(queue, messages...)
}

// Publisher returns the broker itself, which implements message.Publisher.
func (b *Broker) Publisher() message.Publisher { return publisher{b} }

type publisher struct{ b *Broker }

func (p publisher) Publish(topic string, messages ...*message.Message) error {
	return p.b.Publish(topic, messages...)
}
func (p publisher) Close() error { return nil }
