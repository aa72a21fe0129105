package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/failover"
	"github.com/sluice-go/sluice/internal/amqpurl"
	"github.com/sluice-go/sluice/outbox"
	"github.com/sluice-go/sluice/router"
)

// producerPublisher is the publisher the demo's producer publishes requests with: the
// broker's confirmed publisher; in front of it a failover to the cluster AMQP_SECONDARY_URL
// names, when set; and before both the outbox in PAYMENTS_OUTBOX_DIR, when set, so that a
// request the brokers cannot take is kept on disk instead of failing. closeFn releases
// what it opened (not b).
func producerPublisher(ctx context.Context, cfg config, b router.Broker, logger *slog.Logger) (pub message.Publisher, closeFn func(), err error) {
	pub = broker.QueuePublisher(b)
	var closers []func() error
	closeFn = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			_ = closers[i]()
		}
	}
	if cfg.secondaryURL != "" {
		// Connected in the background: the producer starts, publishing to the primary,
		// whether or not the secondary can be reached now.
		second, err := failover.Dial(failover.ClusterConfig{
			AMQP: amqp.Config{URLs: amqpurl.Split(cfg.secondaryURL), Logger: logger, QueueType: amqp.QueueType(cfg.queueType)},
			OnConnect: func(ctx context.Context, b *amqp.Broker) error {
				return b.DeclareQueue(ctx, cfg.queue)
			},
		})
		if err != nil {
			return nil, closeFn, fmt.Errorf("secondary cluster: %w", err)
		}
		closers = append(closers, second.Close)
		fp, err := failover.NewPublisher(pub, second.Publisher(), failover.Config{Logger: logger})
		if err != nil {
			closeFn()
			return nil, func() {}, err
		}
		pub = fp
	}
	if cfg.outboxDir != "" {
		ob, err := outbox.New(pub, outbox.Config{Dir: cfg.outboxDir, Logger: logger})
		if err != nil {
			closeFn()
			return nil, func() {}, err
		}
		closers = append(closers, ob.Close)
		pub = ob
	}
	return pub, closeFn, nil
}

// producerConfig reads the producer's variables into c.
func producerConfig(c *config) error {
	c.outboxDir = os.Getenv("PAYMENTS_OUTBOX_DIR")
	c.secondaryURL = os.Getenv("AMQP_SECONDARY_URL")
	if (c.outboxDir != "" || c.secondaryURL != "") && c.partitions > 0 {
		return errors.New("PAYMENTS_OUTBOX_DIR and AMQP_SECONDARY_URL publish to the plain queue: unset PAYMENTS_PARTITIONS")
	}
	if c.secondaryURL != "" && os.Getenv("AMQP_URL") == "" {
		return errors.New("AMQP_SECONDARY_URL needs AMQP_URL: the embedded broker has no second cluster")
	}
	return nil
}
