package otelsetup_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry"
	"github.com/sluice-go/sluice/telemetry/otelsetup"
)

// The quick start's one otelsetup call: Run installs the SDK, makes readiness follow the
// stack (ready while it consumes, not once it stopped) and consumes until ctx ends, then
// flushes the spans. Here on the embedded broker, with the
// spans kept in memory and readiness read in-process; a service gives Config.MetricsAddr
// (for /metrics, /healthz and /readyz) and OTEL_EXPORTER_OTLP_ENDPOINT instead.
func ExampleRun() {
	// This example exports nowhere, whatever the environment says.
	if v, ok := os.LookupEnv("OTEL_TRACES_EXPORTER"); ok {
		defer os.Setenv("OTEL_TRACES_EXPORTER", v)
	} else {
		defer os.Unsetenv("OTEL_TRACES_EXPORTER")
	}
	_ = os.Setenv("OTEL_TRACES_EXPORTER", "none")

	quiet := slog.New(slog.DiscardHandler)
	b := memory.New(memory.Config{Logger: quiet})
	defer b.Close()
	stack, err := router.New(b, router.Config{
		Logger:    quiet,
		Telemetry: &telemetry.Config{}, // reports to the providers Run installs
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stack.Close()
	handled := make(chan string, 1)
	_ = stack.Handle("charge", "payments", func(m *message.Message) error {
		handled <- m.UUID
		return nil
	})

	health := &telemetry.Health{} // what /readyz answers from
	spans := tracetest.NewSpanRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- otelsetup.Run(ctx, stack, otelsetup.Config{
			ServiceName:    "payments",
			Health:         health,
			SpanProcessors: []sdktrace.SpanProcessor{spans},
			Logger:         quiet,
		})
	}()
	<-stack.Running()
	fmt.Println("readyz:", readyz(health, http.StatusOK))
	_ = b.Publish("payments", message.NewMessage("pay-1", []byte("{}")))
	fmt.Println("handled:", <-handled)

	cancel() // Run stops consuming, flushes the spans and returns
	fmt.Println("Run:", <-done)
	fmt.Println("readyz:", readyz(health, http.StatusServiceUnavailable))
	for _, sp := range spans.Ended() {
		fmt.Println("span:", sp.Name())
	}
	// Output:
	// readyz: 200 ready
	// handled: pay-1
	// Run: <nil>
	// readyz: 503 not ready; consumer: not consuming
	// span: process payments
}

// readyz waits up to 10s for h's readiness to answer want, and returns its last answer.
func readyz(h *telemetry.Health, want int) string {
	var rec *httptest.ResponseRecorder
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		rec = httptest.NewRecorder()
		h.ReadinessHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		if rec.Code == want {
			break
		}
	}
	return fmt.Sprintf("%d %s", rec.Code, strings.ReplaceAll(strings.TrimSpace(rec.Body.String()), "\n", "; "))
}
