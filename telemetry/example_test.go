package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry"
)

// Telemetry wired into a stack on the embedded broker, with in-memory providers instead
// of exporters: a manual metric reader and a span recorder. A service leaves the providers
// out (&telemetry.Config{}) and runs the stack with otelsetup.Run, which installs exporting
// providers built from the OTEL_* variables.
func Example() {
	quiet := slog.New(slog.DiscardHandler)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))

	b := memory.New(memory.Config{Logger: quiet})
	defer b.Close()
	s, _ := router.New(b, router.Config{
		Logger: quiet,
		// Adds the tracing step and decorates every hand-off.
		Telemetry: &telemetry.Config{
			MeterProvider:  mp,
			TracerProvider: tp,
			// The trace travels in the message's traceparent header; the global propagator
			// is a no-op until otelsetup.Setup (or otel.SetTextMapPropagator) installs one.
			Propagator:      propagation.TraceContext{},
			MessagingSystem: "memory",
			EventLog:        quiet,
		},
		Retry: retry.Config{InitialDelay: 10 * time.Millisecond, Jitter: retry.NoJitter},
	})
	done := make(chan struct{})
	_ = s.Handle("charge", "payments", func(msg *message.Message) error {
		if sluice.RetryCount(msg.Metadata) == 0 {
			return errors.New("gateway timeout")
		}
		close(done)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = s.Run(ctx) }()
	<-s.Running()
	_ = b.Publish("payments", message.NewMessage("pay-1", []byte("{}")))
	<-done
	_ = s.Close() // waits for the attempt in flight, so its span and duration are recorded

	// Both attempts and the retry hand-off between them form one trace.
	var names []string
	traces := map[string]bool{}
	for _, sp := range spans.Ended() {
		names = append(names, sp.Name())
		traces[sp.SpanContext().TraceID().String()] = true
	}
	slices.Sort(names)
	fmt.Println("spans:", names, "traces:", len(traces))

	var rm metricdata.ResourceMetrics
	_ = reader.Collect(context.Background(), &rm)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == "sluice.handler.duration" {
				var outcomes []string
				for _, dp := range h.DataPoints {
					o, _ := dp.Attributes.Value("outcome")
					outcomes = append(outcomes, fmt.Sprintf("%s=%d", o.AsString(), dp.Count))
				}
				slices.Sort(outcomes)
				fmt.Println(m.Name, outcomes)
			}
		}
	}
	// Output:
	// spans: [process payments process payments send sluice.delay] traces: 1
	// sluice.handler.duration [ack=1 retry=1]
}
