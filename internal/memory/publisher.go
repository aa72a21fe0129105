package memory

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Publish puts copies of messages at the end of the queue named topic.
func (b *Broker) Publish(topic string, messages ...*message.Message) error {
	if b.closed() {
		return ErrClosed
	}
	if b.parts.count(topic) > 0 {
		return fmt.Errorf("publish to queue %q: %w", topic, ErrPartitioned)
	}
	q := b.queue(topic)
	for _, m := range messages {
		q.push(copyMessage(m), false)
	}
	return nil
}

// Publisher returns the broker itself, which implements message.Publisher.
func (b *Broker) Publisher() message.Publisher { return publisher{b} }

type publisher struct{ b *Broker }

func (p publisher) Publish(topic string, messages ...*message.Message) error {
	return p.b.Publish(topic, messages...)
}
func (p publisher) Close() error { return nil }
