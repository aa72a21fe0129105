package router

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/amqpurl"
	"github.com/sluice-go/sluice/internal/memory"
)

// Broker is what the stack needs from a broker. FromAMQP and Embedded adapt sluice's two.
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

// fromMemory adapts the embedded broker; Embedded builds one.
func fromMemory(b *memory.Broker) Broker { return memoryBroker{b} }

type memoryBroker struct{ *memory.Broker }

func (m memoryBroker) Subscriber(concurrency, _ int) message.Subscriber {
	return m.Broker.Subscriber(memory.SubscribeOptions{Concurrency: concurrency})
}

// ErrNoAMQPURL is returned by Connect when it is given no URL: a service deployed without
// one must fail to start, not consume from an in-process broker nobody publishes to.
var ErrNoAMQPURL = errors.New("router: no RabbitMQ URL given (pass the URL, e.g. amqp://guest:guest@localhost:5672/, usually read from AMQP_URL by the program; or use router.ConnectOrEmbedded or router.Embedded for the embedded broker)")

// Connect returns the RabbitMQ broker at url (a comma-separated list of a cluster's nodes,
// see amqp.Config.URLs); an empty url is ErrNoAMQPURL. The library reads no environment:
// the program passes what it read (the demo and the examples read AMQP_URL).
func Connect(ctx context.Context, url string, logger *slog.Logger) (Broker, error) {
	urls := amqpurl.Nodes(url)
	if len(urls) == 0 {
		return nil, ErrNoAMQPURL
	}
	if logger == nil {
		logger = slog.Default()
	}
	b, err := amqp.New(ctx, amqp.Config{URLs: urls, Logger: logger})
	if err != nil {
		return nil, err
	}
	return FromAMQP(b), nil
}

// ConnectOrEmbedded is Connect when url is not empty, else the embedded broker (Embedded),
// saying so in the log: for demos and tests, which ask for the fallback by calling it.
func ConnectOrEmbedded(ctx context.Context, url string, logger *slog.Logger) (Broker, error) {
	if len(amqpurl.Nodes(url)) > 0 {
		return Connect(ctx, url, logger)
	}
	if logger == nil {
		logger = slog.Default()
	}
	logger.Info("no RabbitMQ URL given: using the embedded in-memory broker")
	return Embedded(logger), nil
}

// Embedded returns the embedded in-process broker (internal/memory): nothing outside the
// process can publish to it, and its messages die with the process.
func Embedded(logger *slog.Logger) Broker {
	if logger == nil {
		logger = slog.Default()
	}
	return fromMemory(memory.New(memory.Config{Logger: logger}))
}
