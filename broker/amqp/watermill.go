package amqp

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"
)

// errWatermillMarshaler is returned by NewWatermillSubscriber for a config whose
// Marshaler is not sluice's: watermill-amqp's DefaultMarshaler fails on the x-death table
// RabbitMQ adds when the delay cascade hands a retried message back, and watermill-amqp
// nacks with requeue a message it cannot unmarshal, so every retried message would loop
// between the broker and the consumer thousands of times a second.
var errWatermillMarshaler = errors.New("amqp: watermill-amqp's config must use sluice's marshaler on queues with sluice's retries (set Config.Marshaler = amqp.Marshaler{} from github.com/sluice-go/sluice/broker/amqp, or start from amqp.WatermillConfig)")

// WatermillConfig returns a watermill-amqp/v2 configuration for consuming queues that
// sluice declared (Broker.DeclareQueue, router.Stack.Run) with watermill-amqp's
// subscriber, behind sluice's steps in a Watermill router (router.Middlewares): queue
// name = topic through the default exchange, as sluice names them; sluice's Marshaler,
// which reads the x-death and typed headers retries carry; and a topology builder that
// declares nothing but checks, passively, that the queue exists, since its arguments
// (queue type, dead-lettering) are sluice's and a second declaration with other arguments
// is refused by RabbitMQ. Prefetch is watermill-amqp's default, 1.
func WatermillConfig(amqpURI string) wamqp.Config {
	cfg := wamqp.NewDurableQueueConfig(amqpURI)
	cfg.Marshaler = Marshaler{}
	cfg.TopologyBuilder = declaredTopology{}
	return cfg
}

// NewWatermillSubscriber returns watermill-amqp's subscriber for cfg after checking that
// cfg can consume sluice's retries: a Marshaler other than sluice's is refused, with an
// error saying how to set it.
func NewWatermillSubscriber(cfg wamqp.Config, logger watermill.LoggerAdapter) (*wamqp.Subscriber, error) {
	if err := checkWatermillConfig(cfg); err != nil {
		return nil, err
	}
	return wamqp.NewSubscriber(cfg, logger)
}

// checkWatermillConfig returns errWatermillMarshaler when cfg's Marshaler is not sluice's.
func checkWatermillConfig(cfg wamqp.Config) error {
	switch cfg.Marshaler.(type) {
	case Marshaler, *Marshaler:
		return nil
	default:
		return fmt.Errorf("%w; it is %T", errWatermillMarshaler, cfg.Marshaler)
	}
}

// declaredTopology is watermill-amqp's TopologyBuilder for queues sluice declared.
type declaredTopology struct{}

// ExchangeDeclare declares nothing: sluice's queues are reached through the default
// exchange.
func (declaredTopology) ExchangeDeclare(*amqp.Channel, string, wamqp.Config) error { return nil }

// BuildTopology checks that the queue exists.
func (declaredTopology) BuildTopology(ch *amqp.Channel, queue, _ string, _ wamqp.Config, _ watermill.LoggerAdapter) error {
	if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("queue %q is not declared (declare it with sluice's Broker.DeclareQueue first): %w", queue, err)
	}
	return nil
}
