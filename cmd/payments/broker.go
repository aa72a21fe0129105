package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/amqpurl"
	"github.com/sluice-go/sluice/router"
)

// connectBroker is router.Connect with AMQP_URL and the queue type of AMQP_QUEUE_TYPE
// (quorum on a cluster, so the queues survive a node). Without AMQP_URL it is the embedded
// broker when cfg.embeddedFallback says so (the demo), and an error otherwise (serve).
func connectBroker(ctx context.Context, cfg config, logger *slog.Logger) (router.Broker, error) {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		if !cfg.embeddedFallback {
			return nil, fmt.Errorf("%w; set AMQP_URL ('payments demo' runs on the embedded broker without it)", router.ErrNoAMQPURL)
		}
		return router.ConnectOrEmbedded(ctx, "", logger)
	}
	if cfg.queueType == "" {
		return router.Connect(ctx, url, logger)
	}
	b, err := amqp.New(ctx, amqp.Config{URLs: amqpurl.Split(url), Logger: logger, QueueType: amqp.QueueType(cfg.queueType)})
	if err != nil {
		return nil, err
	}
	return router.FromAMQP(b), nil
}

// publishRequest publishes a payment request: to the queue, or, when the service runs
// partitioned, to the partition its payment_id hashes to, which is how a producer must
// publish so that one instance sees every request of a payment.
func publishRequest(ctx context.Context, b router.Broker, pub message.Publisher, cfg config, m *message.Message) error {
	if cfg.exchange != "" {
		eb, ok := b.(router.ExchangeBroker)
		if !ok {
			return fmt.Errorf("the %s broker cannot publish to exchanges", b.Name())
		}
		return eb.PublishToExchange(ctx, cfg.exchange, cfg.bindingKey, m)
	}
	if cfg.partitions == 0 {
		return pub.Publish(cfg.queue, m)
	}
	pp, ok := b.(router.PartitionPublisher)
	if !ok {
		return fmt.Errorf("the %s broker cannot publish to partitions", b.Name())
	}
	key, err := example_payment.KeyFunc(m)
	if err != nil || key == "" {
		key = m.UUID // a body without a payment_id is dead-lettered whichever partition it is in
	}
	return pp.PublishPartitioned(ctx, cfg.queue, key, m)
}

// watchSuccesses returns the queue the demo reads success events from: the output queue,
// or, with PAYMENTS_OUTPUT_EXCHANGE, the queue "<exchange>.demo" bound to it with the
// success routing key (declared here, before any request is sent).
func watchSuccesses(ctx context.Context, b router.Broker, cfg config) (string, error) {
	if cfg.outputExchange == "" {
		return cfg.output, nil
	}
	eb, ok := b.(router.ExchangeBroker)
	if !ok {
		return "", fmt.Errorf("the %s broker cannot subscribe to exchanges", b.Name())
	}
	queue := cfg.outputExchange + ".demo"
	err := eb.DeclareSubscription(ctx, queue, []router.Binding{{Exchange: cfg.outputExchange, Kind: router.Topic, Keys: []string{succeededRoutingKey}}}, false)
	return queue, err
}
