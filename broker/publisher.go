package broker

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/lifecycle"
)

// QueuePublisher returns a Watermill publisher whose topic is a queue and whose Publish
// returns once every message is confirmed: the stack's output publisher, and a producer's
// on any Broker. Publish is bounded by the first message's deadline, not its cancellation
// (a handler's context ends right after it returns, while its output may still be
// confirming); PublishContext by ctx. Close does nothing: the broker's owner closes it.
func QueuePublisher(p Broker) sluice.ContextPublisher { return queuePublisher{p} }

type queuePublisher struct{ p Broker }

func (q queuePublisher) Publish(queue string, messages ...*message.Message) error {
	if len(messages) == 0 {
		return nil
	}
	ctx, cancel := lifecycle.MessageDeadline(messages[0])
	defer cancel()
	return q.p.PublishConfirmed(ctx, queue, messages...)
}

func (q queuePublisher) PublishContext(ctx context.Context, queue string, messages ...*message.Message) error {
	return q.p.PublishConfirmed(ctx, queue, messages...)
}

func (queuePublisher) Close() error { return nil }
