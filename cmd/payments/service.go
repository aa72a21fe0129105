package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sluice-go/sluice/disposition"
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
}

// service is the payment consumer: queue payments.requested, successes to
// payments.succeeded, dead letters to payments.requested.dlq.
type service struct {
	broker router.Broker
	stack  *router.Stack
	// secondary consumes the cluster AMQP_SECONDARY_URL names, nil without it.
	secondary *secondary
	gateway   *example_payment.Gateway
	// telemetry are the OpenTelemetry providers: the span exporter and the metrics address.
	telemetry *otelsetup.Providers
	closers   []func() error
	// consuming is true while the stack consumes: /readyz reads it.
	consuming atomic.Bool
}

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
	// METRICS_ADDR when it is set.
	// /readyz answers from the moment Setup returns: the consumer check is in place
	// before, so the service is not ready until it consumes.
	health := &telemetry.Health{}
	health.AddReadyCheck("consumer", func() error {
		if !svc.consuming.Load() {
			return errNotConsuming
		}
		return nil
	})
	ocfg := otelsetup.Config{ServiceName: cfg.serviceName, MetricsAddr: cfg.metricsAddr, Health: health}
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
	inst, err := providers.Instrumentation(telemetry.WithEventLog(logger, telemetry.DefaultLogLimit))
	if err != nil {
		_ = svc.close()
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	closers, err := observe(cfg, logger, b, providers, inst)
	svc.closers = append(svc.closers, closers...)
	if err != nil {
		_ = svc.close()
		return nil, fmt.Errorf("telemetry: %w", err)
	}

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
			Telemetry:   inst,
			Idempotency: guard,
			Logger:      logger,
			Retry:       rcfg,
			Concurrency: cfg.concurrency,
			Prefetch:    cfg.concurrency * 4,
			Breakers:    breakers,
			Health:      health,
		})
		if err != nil {
			return nil, err
		}
		handler := example_payment.NewHandler(svc.gateway)
		output, exchangeOpts := cfg.exchangeOptions()
		if err := stack.HandleWithOutput("payments", cfg.queue, output, handler.Handle, append([]router.HandlerOption{
			router.WithIdempotencyKey(example_payment.KeyFunc),
			router.WithBreaker("payment-gateway"),
			router.WithPartitions(cfg.partitions),
		}, exchangeOpts...)...); err != nil {
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
	// The idempotency journal's metrics (the dashboard's journal row), read through the
	// stack as otelsetup.Operate reads them.
	jreg, err := inst.RegisterJournal(func() telemetry.JournalState {
		st, _ := stack.JournalState()
		return st
	})
	if err != nil {
		_ = svc.close()
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	svc.closers = append(svc.closers, jreg.Unregister)
	// The retry statistics and the retry decision matrix (sluice retries, sluice policy).
	providers.ServeStack(stack)
	if cfg.consumeSecondary && cfg.secondaryURL != "" {
		svc.secondary, err = newSecondary(cfg, logger, newStack)
		if err != nil {
			_ = svc.close()
			return nil, err
		}
	}
	return svc, nil
}

// run consumes until ctx is done, ready (for /readyz) once every handler consumes.
func (s *service) run(ctx context.Context) error {
	done, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-s.stack.Running():
			s.consuming.Store(true)
		case <-done:
		}
	}()
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
	close(done)
	<-watched
	s.consuming.Store(false)
	return err
}

// close stops consuming (in-flight payments finish) and closes the broker.
func (s *service) close() error {
	s.consuming.Store(false)
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
