// Command quickstart is the README's first example, compiled and tested: a payment
// consumer on RabbitMQ (AMQP_URL) with broker-side retries, dead letters, idempotency, a
// circuit breaker, OpenTelemetry traces (OTEL_EXPORTER_OTLP_ENDPOINT), and /metrics,
// /healthz and /readyz on METRICS_ADDR for the dashboard and alerts in deploy/.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry"
	"github.com/sluice-go/sluice/telemetry/otelsetup"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv("METRICS_ADDR"), "orders", "payments.requested", "payments.succeeded"); err != nil {
		slog.Error("quickstart stopped", "error", err)
		os.Exit(1)
	}
}

// run consumes queue, bound to the topic exchange orders for payment.requested events, until
// ctx ends, publishing a succeeded event per payment to output, and serves the metrics and
// health endpoints on metricsAddr ("" for none).
func run(ctx context.Context, metricsAddr, orders, queue, output string) error {
	broker, err := amqp.Connect(ctx, os.Getenv("AMQP_URL"), nil) // RabbitMQ at AMQP_URL
	if err != nil {
		return fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	defer func() { _ = broker.Close() }()

	guard, err := idempotency.New(idempotency.Config{MaxKeys: 1_000_000, TTL: 24 * time.Hour})
	if err != nil {
		return err
	}
	defer func() { _ = guard.Close() }()
	// The breaker opens when half the gateway calls of at least 20 in a minute fail.
	breakers, err := breaker.New(breaker.Config{FailureRatio: 0.5, MinRequests: 20, Interval: time.Minute})
	if err != nil {
		return err
	}

	stack, err := router.New(broker, router.Config{
		Retry:       retry.Config{MaxRetries: 5, InitialDelay: time.Second, MaxDelay: time.Minute},
		Telemetry:   &telemetry.Config{}, // traces and metrics through the providers otelsetup installs
		Idempotency: guard,
		Breakers:    breakers,
	})
	if err != nil {
		return err
	}
	defer func() { _ = stack.Close() }()
	err = stack.HandleWithOutput("payments", queue, output, handle,
		router.WithIdempotencyKey(paymentID), // a payment requested twice is charged once
		router.WithBreaker("gateway"),        // handlers calling the gateway share its breaker
		router.WithConcurrency(8),
		// a subscriber: every payment.requested event published to orders reaches queue
		router.WithSubscription(router.Binding{Exchange: orders, Keys: []string{"payment.requested"}}))
	if err != nil {
		return err
	}
	// Installs the OpenTelemetry SDK, serves /metrics, /healthz and /readyz (following
	// consumption, pauses and the connection), reports queue depths, and consumes until
	// ctx ends; the spans are flushed on the way out.
	return otelsetup.Run(ctx, stack, otelsetup.Config{ServiceName: "quickstart", MetricsAddr: metricsAddr})
}

type request struct {
	PaymentID   string `json:"payment_id"`
	AmountCents int64  `json:"amount_cents"`
}

func decode(payload []byte) (request, error) {
	var req request
	if err := json.Unmarshal(payload, &req); err != nil {
		// Straight to the DLQ, no retry; its error type is "json.SyntaxError".
		return request{}, sluice.Permanent(fmt.Errorf("decode payment request: %w", err))
	}
	if req.PaymentID == "" || req.AmountCents <= 0 {
		return request{}, sluice.Permanent(fmt.Errorf("invalid payment request %s", payload))
	}
	return req, nil
}

func paymentID(msg *message.Message) (string, error) {
	req, err := decode(msg.Payload)
	return req.PaymentID, err
}

func handle(msg *message.Message) ([]*message.Message, error) {
	req, err := decode(msg.Payload)
	if err != nil {
		return nil, err
	}
	if err := charge(msg.Context(), req); err != nil {
		var limited *rateLimitedError
		if errors.As(err, &limited) {
			return nil, sluice.RetryAfter(limited.after, err) // next attempt exactly then
		}
		return nil, err // retried with backoff, then dead-lettered
	}
	event, _ := json.Marshal(map[string]any{"payment_id": req.PaymentID, "status": "succeeded"})
	return []*message.Message{message.NewMessage(watermill.NewUUID(), event)}, nil // confirmed, then acked
}

// rateLimitedError is what the payment gateway returns with a Retry-After.
type rateLimitedError struct{ after time.Duration }

func (e *rateLimitedError) Error() string {
	return fmt.Sprintf("gateway rate limit, retry after %s", e.after)
}

// charge stands for the call to a payment gateway.
func charge(ctx context.Context, req request) error {
	if req.AmountCents > 1_000_000 {
		return &rateLimitedError{after: 2 * time.Second}
	}
	return ctx.Err()
}
