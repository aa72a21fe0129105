package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/handlers/example_order"
	"github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/retrystats"
	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry"
	"github.com/sluice-go/sluice/telemetry/otelsetup"
)

// hooks lets the demo watch outcomes; the service itself only logs them.
type hooks struct {
	onRetry      func(retry.Event)
	onDeadLetter func(disposition.Outcome)
	onDuplicate  func(key string)
	// spans also receives every span the service records (the demo's waterfalls).
	spans sdktrace.SpanProcessor
	// orders are the order side's hooks (with config.orders).
	orders example_order.Options
}

// service is the payment consumer: queue payments.requested, successes to
// payments.succeeded, dead letters to payments.requested.dlq.
type service struct {
	broker router.Broker
	stack  *router.Stack
	// secondary consumes the cluster AMQP_SECONDARY_URL names, nil without it.
	secondary *secondary
	gateway   *example_payment.Gateway
	// orders is the order side of the saga, nil without config.orders.
	orders *example_order.Handler
	// telemetry are the OpenTelemetry providers: the span exporter and the metrics address.
	telemetry *otelsetup.Providers
	closers   []func() error
}

// errStarting is the readiness reason until Operate watches the stack.
var errStarting = errors.New("starting")

func newService(ctx context.Context, cfg config, logger *slog.Logger, h hooks) (*service, error) {
	b, err := connectBroker(ctx, cfg, logger)
	if err != nil {
		return nil, fmt.Errorf("connect to the broker: %w", err)
	}
	// The simulated gateway is a remote system living in this process: bound what it
	// remembers so that a long run's memory stays flat.
	svc := &service{broker: b, gateway: &example_payment.Gateway{LedgerLimit: 20_000}}
	svc.closers = append(svc.closers, b.Close)

	// Traces go to OTEL_EXPORTER_OTLP_ENDPOINT when it is set; metrics are served on
	// METRICS_ADDR when it is set, with the queue depths (read from the broker, or from
	// RABBITMQ_MANAGEMENT_URL) once Operate watches the stack.
	// /readyz answers from the moment Setup returns: the startup check is in place
	// before, so the service is not ready until Operate's checks take over (consuming,
	// connected, nothing paused).
	var operated atomic.Bool
	health := &telemetry.Health{}
	health.AddReadyCheck("startup", func() error {
		if !operated.Load() {
			return errStarting
		}
		return nil
	})
	ocfg := otelsetup.Config{ServiceName: cfg.serviceName, MetricsAddr: cfg.metricsAddr, Health: health,
		ManagementURL: cfg.managementURL, DepthInterval: cfg.depthInterval, Logger: logger}
	if h.spans != nil {
		ocfg.SpanProcessors = []sdktrace.SpanProcessor{h.spans}
	}
	providers, err := otelsetup.Setup(ctx, ocfg)
	if err != nil {
		_ = b.Close()
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	svc.telemetry = providers
	svc.closers = append(svc.closers, func() error {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return providers.Shutdown(sctx)
	})

	rcfg := cfg.retry
	rcfg.OnRetry = h.onRetry
	if h.onDeadLetter != nil {
		dead := disposition.ObserverFunc(func(_ context.Context, o disposition.Outcome) {
			if o.Disposition.Kind == disposition.DeadLetter {
				h.onDeadLetter(o)
			}
		})
		if rcfg.Observer != nil {
			rcfg.Observer = disposition.Observers{rcfg.Observer, dead}
		} else {
			rcfg.Observer = dead
		}
	}
	// Retry outcomes per error type over the last hour, served on METRICS_ADDR at
	// /debug/sluice/retries (sluice retries reads them); RETRY_LEARNED=on also lets the
	// learned policy stop retrying the types that never recover.
	stats, err := retrystats.New(retrystats.Config{Window: cfg.retryStatsWindow})
	if err != nil {
		_ = svc.close()
		return nil, fmt.Errorf("retry statistics: %w", err)
	}
	rcfg.Stats = stats
	// The example's gateway declines and times out per payment, which says nothing about
	// its health; only an outage-like rate at volume (95% of at least 200 calls in 30s)
	// opens the breaker. Then calls stop for 5s and 10 probes test the way back.
	breakers, err := breaker.New(breaker.Config{
		FailureRatio:   0.95,
		MinRequests:    200,
		Interval:       30 * time.Second,
		OpenTimeout:    5 * time.Second,
		HalfOpenProbes: 10,
		Logger:         logger,
	})
	if err != nil {
		_ = svc.close()
		return nil, err
	}
	// Requests are idempotent by payment_id (the handler's key function). On RabbitMQ the
	// done keys are journaled on a stream (sluice.idempotency.<queue>) and restored at
	// start, so a crash or another instance forgets none; IDEMPOTENCY_JOURNAL=off keeps
	// them in this process only (IDEMPOTENCY_SNAPSHOT then survives a graceful restart).
	guard, err := idempotency.New(idempotency.Config{
		DisableJournal:   cfg.noJournal,
		Logger:           logger,
		SnapshotPath:     cfg.idempotencySnapshot,
		SnapshotInterval: cfg.snapshotEvery,
		MaxKeys:          cfg.maxKeys,
		OnDuplicate: func(_ *message.Message, key string) {
			if h.onDuplicate != nil {
				h.onDuplicate(key)
			}
		},
	})
	if err != nil {
		_ = svc.close()
		return nil, fmt.Errorf("idempotency: %w", err)
	}
	// Closed after the stack (closers run in reverse), so the snapshot holds every completion.
	svc.closers = append(svc.closers, guard.Close)
	// One stack per cluster, built alike and sharing the guard, the breaker and the
	// gateway: a request the producer failed over with is settled on the cluster it is on,
	// and a copy on both clusters (its primary confirm lost) is charged once.
	newStack := func(b router.Broker) (*router.Stack, error) {
		stack, err := router.New(b, router.Config{
			Telemetry:   &telemetry.Config{EventLog: logger}, // on the providers Setup installed
			Guard:       guard,
			Logger:      logger,
			Retry:       rcfg,
			Concurrency: cfg.concurrency,
			Prefetch:    cfg.concurrency * 4,
			Breakers:    breakers,
			// PAYMENTS_STOP_WHEN_IDLE: Run returns nil once the queues were empty that long.
			StopWhenIdle: cfg.stopWhenIdle,
		})
		if err != nil {
			return nil, err
		}
		handler := example_payment.NewHandler(svc.gateway)
		output, exchangeOpts := cfg.exchangeOptions()
		opts := append([]router.HandlerOption{
			router.WithIdempotencyKey(example_payment.KeyFunc),
			router.WithBreaker("payment-gateway"),
			router.WithPartitions(cfg.partitions),
		}, exchangeOpts...)
		if cfg.orders {
			// A payment that finally fails tells its order: payment.failed, published with
			// the dead letter, both confirmed before the request is acked.
			opts = append(opts, router.WithCompensation(router.Compensation{Queue: cfg.failedQueue, Build: example_payment.BuildFailed}))
		}
		if err := stack.HandleWithOutput("payments", cfg.queue, output, handler.Handle, opts...); err != nil {
			return nil, err
		}
		return stack, nil
	}
	stack, err := newStack(b)
	if err != nil {
		_ = svc.close()
		return nil, err
	}
	svc.stack = stack
	if cfg.orders {
		if svc.orders, err = addOrders(stack, cfg, h.orders); err != nil {
			_ = svc.close()
			return nil, err
		}
		svc.closers = append(svc.closers, svc.orders.Book().Close)
	}
	// What the dashboard and alerts read beside the stack's own metrics (the broker
	// connection, the queue depths, the idempotency journal), a readiness that follows
	// the stack, and the retry statistics and decision matrix (sluice retries, sluice
	// policy); Shutdown (a closer above) stops it. After every handler is registered:
	// Operate reads their queues once.
	if err := providers.Operate(stack); err != nil {
		_ = svc.close()
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	operated.Store(true)
	if cfg.consumeSecondary && cfg.secondaryURL != "" {
		svc.secondary, err = newSecondary(cfg, logger, newStack)
		if err != nil {
			_ = svc.close()
			return nil, err
		}
	}
	return svc, nil
}

// addOrders adds the order side of the saga to stack (see package example_order): order.created
// to payment requests, then payment.succeeded and payment.failed to the order's end state.
func addOrders(stack *router.Stack, cfg config, opts example_order.Options) (*example_order.Handler, error) {
	book := example_order.NewBook()
	if cfg.ordersBook != "" {
		var err error
		if book, err = example_order.OpenBook(cfg.ordersBook); err != nil {
			return nil, err
		}
	}
	h := example_order.NewHandler(book, opts)
	// With PAYMENTS_OUTPUT_EXCHANGE the successes go to the exchange: a queue of the
	// order side's own subscribes to them.
	succeeded, subscribe := cfg.output, []router.HandlerOption(nil)
	if cfg.outputExchange != "" {
		succeeded = cfg.outputExchange + ".orders"
		subscribe = append(subscribe, router.WithSubscription(router.Binding{Exchange: cfg.outputExchange, Kind: broker.Topic, Keys: []string{succeededRoutingKey}}))
	}
	for _, add := range []struct {
		name, queue, output string
		handle              func(*message.Message) ([]*message.Message, error)
		opts                []router.HandlerOption
	}{
		{"orders", cfg.ordersQueue, cfg.queue, h.Create, nil},
		{"orders-paid", succeeded, cfg.outcomesQueue, h.Paid, subscribe},
		{"orders-cancelled", cfg.failedQueue, cfg.outcomesQueue, h.Cancel, nil},
	} {
		if err := stack.HandleWithOutput(add.name, add.queue, add.output, add.handle, add.opts...); err != nil {
			_ = book.Close()
			return nil, err
		}
	}
	return h, nil
}

// run consumes until ctx is done, ready (for /readyz) once every handler consumes.
func (s *service) run(ctx context.Context) error {
	var secondaryDone <-chan error
	if s.secondary != nil {
		secondaryDone = s.secondary.start(ctx)
	}
	err := s.stack.Run(ctx)
	if secondaryDone != nil {
		// The primary's stack stopped (Close, or ctx): the secondary's stops with it.
		s.secondary.stop()
		if serr := <-secondaryDone; err == nil {
			err = serr
		}
	}
	return err
}

// close stops consuming (in-flight payments finish) and closes the broker.
func (s *service) close() error {
	var err error
	if s.stack != nil {
		err = s.stack.Close()
	}
	if s.secondary != nil {
		if serr := s.secondary.close(); err == nil {
			err = serr
		}
	}
	for i := len(s.closers) - 1; i >= 0; i-- {
		if cerr := s.closers[i](); cerr != nil && err == nil {
			err = cerr
		}
	}
	return err
}
