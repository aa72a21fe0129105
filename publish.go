package sluice

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
)

// ContextPublisher is a Watermill publisher whose publish a context bounds and cancels:
// PublishContext returns once every message is confirmed, or with ctx's error when ctx
// ends first. sluice's RabbitMQ publisher (broker/amqp) and failover.Publisher are
// ContextPublishers; wrappers such as the outbox and failover publish through
// PublishContext so that their deadlines apply and Close need not wait out a publish.
type ContextPublisher interface {
	message.Publisher
	// PublishContext publishes messages to topic within ctx.
	PublishContext(ctx context.Context, topic string, messages ...*message.Message) error
}

// PublishContext publishes messages to topic through pub within ctx: through
// pub.PublishContext when pub is a ContextPublisher, else through pub.Publish with a copy
// of each message carrying ctx (Watermill's publishers read a message's context), so the
// caller's messages keep their own contexts.
func PublishContext(ctx context.Context, pub message.Publisher, topic string, messages ...*message.Message) error {
	if p, ok := pub.(ContextPublisher); ok {
		return p.PublishContext(ctx, topic, messages...)
	}
	copies := make([]*message.Message, len(messages))
	for i, m := range messages {
		c := m.Copy()
		c.SetContext(ctx)
		copies[i] = c
	}
	return pub.Publish(topic, copies...)
}
