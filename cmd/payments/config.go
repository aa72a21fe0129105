package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/handlers/example_order"
	"github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// config is the service's configuration, read from the environment (see docs/getting-started.md, The payment example).
type config struct {
	retry       retry.Config
	serviceName string
	concurrency int
	// queue and output are the consumed and success queues; tests rename them to run side
	// by side on one broker.
	queue, output string
	// metricsAddr serves Prometheus metrics, /healthz and /readyz when set (METRICS_ADDR).
	metricsAddr string
	// depthInterval is how often queue depths are read from the broker
	// (QUEUE_DEPTH_INTERVAL, default 15s); managementURL, when set, reads them from
	// RabbitMQ's management API, which also knows unacknowledged messages
	// (RABBITMQ_MANAGEMENT_URL, such as http://user:password@rabbit:15672).
	depthInterval time.Duration
	managementURL string
	// partitions consumes queue as that many key-partitioned queues (PAYMENTS_PARTITIONS;
	// 0: the plain queue); queueType is RabbitMQ's queue type (AMQP_QUEUE_TYPE).
	partitions int
	queueType  string
	// idempotencySnapshot is where the idempotency store is saved on a graceful stop and
	// loaded at start (IDEMPOTENCY_SNAPSHOT); empty keeps it in memory only.
	idempotencySnapshot string
	// snapshotEvery also writes it periodically (IDEMPOTENCY_SNAPSHOT_INTERVAL, default
	// 1s), so a crash forgets only the last interval.
	snapshotEvery time.Duration
	// exchange, when set, binds queue to this topic exchange with bindingKey
	// (PAYMENTS_EXCHANGE, PAYMENTS_BINDING_KEY); outputExchange, when set, sends success
	// events to this topic exchange with routing key succeededRoutingKey instead of to
	// output (PAYMENTS_OUTPUT_EXCHANGE).
	exchange, bindingKey, outputExchange string
	// maxKeys bounds the idempotency store (IDEMPOTENCY_MAX_KEYS; 0: the store's default,
	// 1,000,000 keys, some 41 MB).
	maxKeys int
	// noJournal turns the idempotency journal off (IDEMPOTENCY_JOURNAL=off): keys then
	// live in this process only, and a crash forgets them.
	noJournal bool
	// embeddedFallback runs on the embedded broker when AMQP_URL is unset (the demo);
	// serve turns it off, so a deployment missing AMQP_URL fails to start.
	embeddedFallback bool
	// outboxDir keeps the demo producer's unconfirmed requests on disk
	// (PAYMENTS_OUTBOX_DIR); secondaryURL names a second cluster it fails over to
	// (AMQP_SECONDARY_URL). See producer.go.
	outboxDir, secondaryURL string
	// consumeSecondary makes the service consume the secondaryURL cluster too (serve).
	consumeSecondary bool
	// retryStatsWindow is how far back the retry statistics reach (RETRY_STATS_WINDOW,
	// default 1h); RETRY_LEARNED=on sets retry.Learned (the learned retry policy, with its
	// defaults) in retry.
	retryStatsWindow time.Duration
	// stopWhenIdle is router.Config.StopWhenIdle (PAYMENTS_STOP_WHEN_IDLE; unset: serve
	// until SIGINT or SIGTERM): serve exits 0 once its queues have been empty and nothing
	// in flight that long, as a job or a pod KEDA scales to zero does (deploy/keda).
	stopWhenIdle time.Duration
	// orders runs the order side of the saga (package example_order) beside the payments
	// (ORDERS=on; the demo runs it unless PAYMENTS_PARTITIONS is set): order.created on
	// ordersQueue (ORDERS_QUEUE), payment.failed, the payments' compensation, on
	// failedQueue (PAYMENTS_FAILED_QUEUE), the orders' end states on outcomesQueue
	// (ORDERS_OUTCOMES_QUEUE), the order book in the file ordersBook (ORDERS_BOOK; empty:
	// in memory, forgotten with the process).
	orders                                  bool
	ordersQueue, failedQueue, outcomesQueue string
	ordersBook                              string
}

func loadConfig() (config, error) {
	c := config{
		embeddedFallback: true,
		serviceName:      envOr("OTEL_SERVICE_NAME", "payments"),
		queue:            envOr("PAYMENTS_QUEUE", example_payment.QueueRequested),
		output:           envOr("PAYMENTS_OUTPUT_QUEUE", example_payment.QueueSucceeded),
		metricsAddr:      os.Getenv("METRICS_ADDR"),

		exchange:       os.Getenv("PAYMENTS_EXCHANGE"),
		bindingKey:     envOr("PAYMENTS_BINDING_KEY", defaultBindingKey),
		outputExchange: os.Getenv("PAYMENTS_OUTPUT_EXCHANGE"),

		managementURL: os.Getenv("RABBITMQ_MANAGEMENT_URL"),

		idempotencySnapshot: os.Getenv("IDEMPOTENCY_SNAPSHOT"),
		noJournal:           strings.EqualFold(os.Getenv("IDEMPOTENCY_JOURNAL"), "off"),

		ordersQueue:   envOr("ORDERS_QUEUE", example_order.QueueCreated),
		failedQueue:   envOr("PAYMENTS_FAILED_QUEUE", example_payment.QueueFailed),
		outcomesQueue: envOr("ORDERS_OUTCOMES_QUEUE", example_order.QueueOutcomes),
		ordersBook:    os.Getenv("ORDERS_BOOK"),
	}
	var err error
	if c.retry.MaxRetries, err = envInt("RETRY_MAX_RETRIES", 5); err != nil {
		return c, err
	}
	if c.retry.MaxRetries == 0 {
		c.retry.MaxRetries = -1 // the variable says "no retries"; retry.Config reads 0 as its default
	}
	if c.retry.InitialDelay, err = envDuration("RETRY_INITIAL_DELAY", time.Second); err != nil {
		return c, err
	}
	if c.retry.MaxDelay, err = envDuration("RETRY_MAX_DELAY", time.Minute); err != nil {
		return c, err
	}
	if c.retry.Multiplier, err = envFloat("RETRY_MULTIPLIER", 2); err != nil {
		return c, err
	}
	if c.retry.Jitter, err = envFloat("RETRY_JITTER", 0.1); err != nil {
		return c, err
	}
	if c.retry.Jitter == 0 {
		c.retry.Jitter = retry.NoJitter // 0 in the environment means no jitter
	}
	if c.retryStatsWindow, err = envDuration("RETRY_STATS_WINDOW", time.Hour); err != nil {
		return c, err
	}
	switch v := strings.ToLower(os.Getenv("RETRY_LEARNED")); v {
	case "", "off", "0", "false":
	case "on", "1", "true":
		c.retry.Learned = &retry.Learned{}
	default:
		return c, fmt.Errorf("RETRY_LEARNED=%q: want on or off", v)
	}
	if c.snapshotEvery, err = envDuration("IDEMPOTENCY_SNAPSHOT_INTERVAL", time.Second); err != nil {
		return c, err
	}
	if c.stopWhenIdle, err = envDuration("PAYMENTS_STOP_WHEN_IDLE", 0); err != nil {
		return c, err
	}
	// Zero: otelsetup's default, 15s.
	if c.depthInterval, err = envDuration("QUEUE_DEPTH_INTERVAL", 0); err != nil {
		return c, err
	}
	if c.maxKeys, err = envInt("IDEMPOTENCY_MAX_KEYS", 0); err != nil {
		return c, err
	}
	if c.concurrency, err = envInt("PAYMENTS_CONCURRENCY", 8); err != nil {
		return c, err
	}
	if c.partitions, err = envInt("PAYMENTS_PARTITIONS", 0); err != nil {
		return c, err
	}
	if c.exchange != "" && c.partitions > 0 {
		return c, fmt.Errorf("PAYMENTS_EXCHANGE=%q with PAYMENTS_PARTITIONS=%d: a partitioned queue cannot subscribe to an exchange; set one", c.exchange, c.partitions)
	}
	if c.queueType = os.Getenv("AMQP_QUEUE_TYPE"); c.queueType != "" && c.queueType != "classic" && c.queueType != "quorum" {
		return c, fmt.Errorf("AMQP_QUEUE_TYPE=%q: want classic or quorum", c.queueType)
	}
	switch v := strings.ToLower(os.Getenv("ORDERS")); v {
	case "", "off", "0", "false":
	case "on", "1", "true":
		c.orders = true
	default:
		return c, fmt.Errorf("ORDERS=%q: want on or off", v)
	}
	if c.orders && c.partitions > 0 {
		return c, fmt.Errorf("ORDERS=on with PAYMENTS_PARTITIONS=%d: the order side publishes to the plain queue; set one", c.partitions)
	}
	if err := producerConfig(&c); err != nil {
		return c, err
	}
	if c.orders && c.secondaryURL != "" {
		// The compensation of a payment settled on the secondary would wait there for an
		// order side that only consumes the primary.
		return c, errors.New("ORDERS=on with AMQP_SECONDARY_URL: the order side runs on one cluster; unset one")
	}
	return c, nil
}

// Routing keys of the publish/subscribe set-up (docs/concepts.md, "Publish/subscribe").
const (
	// defaultBindingKey is PAYMENTS_BINDING_KEY's default: payment requests.
	defaultBindingKey = "payment.requested"
	// succeededRoutingKey is the routing key of a success event on PAYMENTS_OUTPUT_EXCHANGE.
	succeededRoutingKey = "payment.succeeded"
)

// exchangeOptions are the handler options of PAYMENTS_EXCHANGE and
// PAYMENTS_OUTPUT_EXCHANGE, and the output queue to give HandleWithOutput ("" when
// success events go to the exchange).
func (c config) exchangeOptions() (output string, opts []router.HandlerOption) {
	output = c.output
	if c.exchange != "" {
		opts = append(opts, router.WithSubscription(router.Binding{Exchange: c.exchange, Kind: broker.Topic, Keys: []string{c.bindingKey}}))
	}
	if c.outputExchange != "" {
		output = ""
		opts = append(opts, router.WithOutputExchange(router.Output{Exchange: c.outputExchange, Kind: broker.Topic, RoutingKey: succeededRoutingKey}))
	}
	return output, opts
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func envInt(key string, def int) (int, error) {
	v := os.Getenv(key)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s=%q: want a non-negative whole number", key, v)
	}
	return n, nil
}

func envFloat(key string, def float64) (float64, error) {
	v := os.Getenv(key)
	if v == "" {
		return def, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("%s=%q: want a non-negative number", key, v)
	}
	return f, nil
}

func envDuration(key string, def time.Duration) (time.Duration, error) {
	v := os.Getenv(key)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s=%q: want a positive duration such as 500ms or 2s", key, v)
	}
	return d, nil
}
