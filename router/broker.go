package router

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/broker/memory"
)

// Broker is what the stack needs from a broker. FromAMQP and FromMemory adapt sluice's two.
type Broker interface {
	// Name is the messaging system ("rabbitmq", "memory").
	Name() string
	// DeclareQueue declares a consumed queue with its dead-letter queue and delay route.
	DeclareQueue(ctx context.Context, queue string) error
	// DeclarePartitioned declares queue as partitions key-partitioned queues (see
	// WithPartitions) with their shared dead-letter queue and delay routes.
	DeclarePartitioned(ctx context.Context, queue string, partitions int) error
	// Delay delivers a copy of msg to queue after d; it returns once the copy is confirmed.
	Delay(ctx context.Context, queue string, d time.Duration, msg *message.Message) error
	// DeadLetter publishes msg to queue's dead-letter queue; it returns once confirmed.
	DeadLetter(ctx context.Context, queue string, msg *message.Message) error
	// Publisher publishes handler output to the queue named by the topic, confirmed.
	Publisher() message.Publisher
	// Subscriber consumes with up to concurrency messages in flight and the given prefetch.
	Subscriber(concurrency, prefetch int) message.Subscriber
	// Close closes the broker.
	Close() error
}

// FromAMQP adapts a RabbitMQ broker.
func FromAMQP(b *amqp.Broker) Broker { return amqpBroker{b} }

type amqpBroker struct{ *amqp.Broker }

func (a amqpBroker) Publisher() message.Publisher { return a.Broker.Publisher() }
func (a amqpBroker) Subscriber(concurrency, prefetch int) message.Subscriber {
	return a.Broker.Subscriber(amqp.SubscribeOptions{Concurrency: concurrency, Prefetch: prefetch})
}

// FromMemory adapts the embedded broker.
func FromMemory(b *memory.Broker) Broker { return memoryBroker{b} }

type memoryBroker struct{ *memory.Broker }

func (m memoryBroker) Subscriber(concurrency, _ int) message.Subscriber {
	return m.Broker.Subscriber(memory.SubscribeOptions{Concurrency: concurrency})
}

// Connect returns the RabbitMQ broker when AMQP_URL is set, else the embedded broker.
func Connect(ctx context.Context, logger *slog.Logger) (Broker, error) {
	if logger == nil {
		logger = slog.Default()
	}
	if os.Getenv("AMQP_URL") == "" {
		logger.Info("AMQP_URL is not set: using the embedded in-memory broker")
		return FromMemory(memory.New(memory.Config{Logger: logger})), nil
	}
	b, err := amqp.New(ctx, amqp.Config{Logger: logger})
	if err != nil {
		return nil, err
	}
	return FromAMQP(b), nil
}
