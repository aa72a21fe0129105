package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/amqpurl"
	"github.com/sluice-go/sluice/router"
)

// connectBroker is amqp.Connect with AMQP_URL and the queue type of AMQP_QUEUE_TYPE
// (quorum on a cluster, so the queues survive a node). Without AMQP_URL it is the embedded
// broker when cfg.embeddedFallback says so (the demo), and an error otherwise (serve).
func connectBroker(ctx context.Context, cfg config, logger *slog.Logger) (router.Broker, error) {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		if !cfg.embeddedFallback {
			return nil, fmt.Errorf("%w; set AMQP_URL ('payments demo' runs on the embedded broker without it)", amqp.ErrNoURL)
		}
		logger.Info("no RabbitMQ URL given: using the embedded in-memory broker")
		return memory.New(memory.Config{Logger: logger}), nil
	}
	if cfg.queueType == "" {
		return amqp.Connect(ctx, url, logger)
	}
	b, err := amqp.New(ctx, amqp.Config{URLs: amqpurl.Split(url), Logger: logger, QueueType: amqp.QueueType(cfg.queueType)})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// publishRequest publishes a payment request: to the queue, or, when the service runs
// partitioned, to the partition its payment_id hashes to, which is how a producer must
// publish so that one instance sees every request of a payment.
func publishRequest(ctx context.Context, b router.Broker, pub message.Publisher, cfg config, m *message.Message) error {
	if cfg.exchange != "" {
		return b.PublishToExchange(ctx, cfg.exchange, cfg.bindingKey, m)
	}
	if cfg.partitions == 0 {
		return pub.Publish(cfg.queue, m)
	}
	key, err := example_payment.KeyFunc(m)
	if err != nil || key == "" {
		key = m.UUID // a body without a payment_id is dead-lettered whichever partition it is in
	}
	return b.PublishPartitioned(ctx, cfg.queue, key, m)
}

// watchSuccesses returns the queue the demo reads success events from: the output queue,
// or, with PAYMENTS_OUTPUT_EXCHANGE, the queue "<exchange>.demo" bound to it with the
// success routing key (declared here, before any request is sent).
func watchSuccesses(ctx context.Context, b router.Broker, cfg config) (string, error) {
	if cfg.outputExchange == "" {
		return cfg.output, nil
	}
	queue := cfg.outputExchange + ".demo"
	err := b.DeclareSubscription(ctx, queue, []router.Binding{{Exchange: cfg.outputExchange, Kind: router.Topic, Keys: []string{succeededRoutingKey}}}, false)
	return queue, err
}
