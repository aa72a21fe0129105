package amqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/amqpurl"
)

// The RabbitMQ broker is everything the stack requires, and the two capabilities only a
// broker shared between processes has.
var (
	_ broker.Broker          = (*Broker)(nil)
	_ broker.ConsumerCounter = (*Broker)(nil)
	_ broker.Joiner          = (*Broker)(nil)
	_ broker.Subscriber      = (*Subscriber)(nil)
)

// Connect returns the RabbitMQ broker at url: one URL or a comma-separated list of a
// cluster's nodes (see Config.URLs). An empty url is ErrNoURL: sluice reads no
// environment, the program passes what it read (the demo and the examples read
// AMQP_URL). A nil logger means slog.Default().
func Connect(ctx context.Context, url string, logger *slog.Logger) (*Broker, error) {
	if logger == nil {
		logger = slog.Default()
	}
	return New(ctx, Config{URLs: amqpurl.Nodes(url), Logger: logger})
}

// PublishConfirmed publishes messages to the queue named queue (through the default
// exchange) within ctx and returns once RabbitMQ confirmed every one. A queue not yet
// declared is ErrUnroutable, with a hint to declare it first.
func (b *Broker) PublishConfirmed(ctx context.Context, queue string, messages ...*message.Message) error {
	return withQueueHint(b.pub.PublishTo(ctx, "", queue, messages...), queue)
}

// withQueueHint says, on a publish to a queue that was unroutable, what to declare.
func withQueueHint(err error, queue string) error {
	if errors.Is(err, ErrUnroutable) {
		// The usual cause: publishing before the consumer declared its queue.
		return fmt.Errorf("%w (no queue %q: declare it first with Broker.DeclareQueue or router.Stack.Declare; Stack.Run declares its handlers' queues)", err, queue)
	}
	return err
}
