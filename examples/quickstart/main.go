// Command quickstart is the README's first example, compiled and tested: a payment
// consumer on RabbitMQ (AMQP_URL) with broker-side retries, dead letters, idempotency, a
// circuit breaker, OpenTelemetry traces (OTEL_EXPORTER_OTLP_ENDPOINT), and /metrics,
// /healthz and /readyz on METRICS_ADDR for the dashboard and alerts in deploy/.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

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
		log.Fatalf("quickstart stopped: %v", err)
	}
}

// run handles exchange orders' payment.requested events on queue, publishing to output.
func run(ctx context.Context, metricsAddr, orders, queue, output string) error {
	broker, err := amqp.Connect(ctx, os.Getenv("AMQP_URL"), nil) // RabbitMQ at AMQP_URL
	if err != nil {
		return fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	defer broker.Close()
	stack, err := router.New(broker, router.Config{
		Retry:       retry.Config{MaxRetries: 5, InitialDelay: time.Second, MaxDelay: time.Minute},
		Telemetry:   &telemetry.Config{},                     // traces and metrics through what otelsetup installs
		Idempotency: &idempotency.Config{KeyFunc: paymentID}, // a payment requested twice is charged once
		// The breaker opens when half the gateway calls of at least 20 in a minute fail.
		Breaker: &breaker.Config{FailureRatio: 0.5, MinRequests: 20, Interval: time.Minute},
	})
	if err != nil {
		return err
	}
	defer stack.Close()
	err = stack.HandleWithOutput("payments", queue, output, handle,
		router.WithBreaker("gateway"), // handlers calling the gateway share its breaker
		router.WithConcurrency(8),
		router.WithSubscription(router.Binding{Exchange: orders, Keys: []string{"payment.requested"}}))
	if err != nil {
		return err
	}
	// Traces, /metrics, /healthz and /readyz around stack.Run, which consumes until ctx ends.
	return otelsetup.Run(ctx, stack, otelsetup.Config{ServiceName: "quickstart", MetricsAddr: metricsAddr})
}

type request struct {
	PaymentID   string `json:"payment_id"`
	AmountCents int64  `json:"amount_cents"`
}

// paymentID is the idempotency key; without one, a request goes to the DLQ, unretried.
func paymentID(msg *message.Message) (string, error) {
	var req request
	err := json.Unmarshal(msg.Payload, &req)
	if err == nil && (req.PaymentID == "" || req.AmountCents <= 0) {
		err = fmt.Errorf("invalid payment request %s", msg.Payload)
	}
	return req.PaymentID, err
}

func handle(msg *message.Message) ([]*message.Message, error) {
	var req request
	_ = json.Unmarshal(msg.Payload, &req) // paymentID ran first and dead-lettered what does not decode
	if req.AmountCents > 1_000_000 {      // the gateway's rate limit says when to come back
		return nil, sluice.RetryAfter(2*time.Second, fmt.Errorf("gateway rate limit for %s", req.PaymentID))
	}
	// The gateway call goes here: its error is retried with backoff, then dead-lettered.
	event, _ := json.Marshal(map[string]any{"payment_id": req.PaymentID, "status": "succeeded"})
	return []*message.Message{message.NewMessage(msg.UUID+".succeeded", event)}, nil // confirmed, then acked
}
