package jaeger_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/jaeger"
	"github.com/sluice-go/sluice/internal/otelstep"
	"github.com/sluice-go/sluice/telemetry/otelsetup"
)

// liveJaeger returns a client for the Jaeger at JAEGER_QUERY_URL (default
// jaeger.DefaultQueryURL). If it does not answer, the test is skipped, or fails when
// SLUICE_REQUIRE_JAEGER=1. Start one with scripts/jaeger-start.sh.
func liveJaeger(t *testing.T) *jaeger.Client {
	t.Helper()
	base := os.Getenv("JAEGER_QUERY_URL")
	if base == "" {
		base = jaeger.DefaultQueryURL
	}
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	c := &jaeger.Client{BaseURL: base, HTTPClient: &http.Client{Transport: transport, Timeout: 5 * time.Second}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := c.Services(ctx); err != nil {
		if os.Getenv("SLUICE_REQUIRE_JAEGER") == "1" {
			t.Fatalf("Jaeger required (SLUICE_REQUIRE_JAEGER=1) but not reachable: %v", err)
		}
		t.Skipf("Jaeger not reachable at %s (start it with scripts/jaeger-start.sh): %v", base, err)
	}
	return c
}

type nopPublisher struct{}

func (nopPublisher) Publish(string, ...*message.Message) error { return nil }
func (nopPublisher) Close() error                              { return nil }

type nopDelayer struct{}

func (nopDelayer) Delay(context.Context, string, time.Duration, *message.Message) error { return nil }

// TestLive_RetriedMessageIsOneTrace exports, through Setup and OTLP/HTTP, the spans of a
// message that is published, fails once, is handed to the delay and succeeds on the
// second attempt, and reads the trace back from Jaeger.
func TestLive_RetriedMessageIsOneTrace(t *testing.T) {
	c := liveJaeger(t)
	endpoint := os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	if endpoint == "" {
		endpoint = "http://127.0.0.1:4318"
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED", "OTEL_SERVICE_NAME"} {
		t.Setenv(name, "")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	service := "sluice-jaeger-test-" + hex.EncodeToString(suffix)

	p, err := otelsetup.Setup(context.Background(), otelsetup.Config{ServiceName: service})
	require.NoError(t, err)
	require.Equal(t, "otlp/http", p.TracesExporter())
	in, err := otelstep.New(otelstep.Config{TracerProvider: p.TracerProvider, MeterProvider: p.MeterProvider, Propagator: p.Propagator})
	require.NoError(t, err)

	first := message.NewMessage("live-1", []byte("{}"))
	require.NoError(t, in.WrapPublisher(nopPublisher{}).Publish("orders", first))
	delayer := in.WrapDelayer(nopDelayer{})
	var delayed *message.Message
	handle := in.Middleware(func(m *message.Message) ([]*message.Message, error) {
		if sluice.RetryCount(m.Metadata) > 0 {
			return nil, nil
		}
		retry := m.Copy()
		retry.Metadata.Set(sluice.HeaderRetryCount, strconv.Itoa(1))
		if err := delayer.Delay(m.Context(), "orders", 100*time.Millisecond, retry); err != nil {
			return nil, err
		}
		in.Observe(m.Context(), disposition.Outcome{Disposition: disposition.Disposition{Kind: disposition.Retry, Delay: 100 * time.Millisecond,
			Reason: errors.New("gateway timeout")}})
		delayed = retry
		return nil, nil
	})
	_, err = handle(first)
	require.NoError(t, err)
	require.NotNil(t, delayed)
	_, err = handle(delayed.Copy()) // headers and payload, no context: what the broker delivers
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, p.Shutdown(ctx), "spans flushed to %s", endpoint)

	traceID := first.Metadata.Get(headers.TraceParent)[3:35]
	var tr jaeger.Trace
	require.Eventually(t, func() bool {
		tr, err = c.GetTrace(context.Background(), traceID)
		return err == nil && len(tr.Spans) == 4
	}, 15*time.Second, 100*time.Millisecond, "trace %s with 4 spans in Jaeger (last error: %v)", traceID, err)

	send := tr.Named("send orders")
	delay := tr.Named("send sluice.delay")
	process := tr.Named("process")
	require.Len(t, send, 1)
	require.Len(t, delay, 1)
	require.Len(t, process, 2)
	assert.Equal(t, []jaeger.Span{send[0]}, tr.Roots())
	assert.Equal(t, send[0].SpanID, process[0].ParentSpanID)
	assert.Equal(t, process[0].SpanID, delay[0].ParentSpanID)
	assert.Equal(t, delay[0].SpanID, process[1].ParentSpanID, "attempt 2 is a child of attempt 1's hand-off")

	assert.Equal(t, service, process[0].Service)
	assert.Equal(t, "producer", send[0].Kind())
	assert.Equal(t, "consumer", process[0].Kind())
	assert.Equal(t, int64(1), process[0].Tags["sluice.attempt"])
	assert.Equal(t, int64(2), process[1].Tags["sluice.attempt"])
	assert.Equal(t, "retry", process[0].TagString("sluice.outcome"))
	assert.Equal(t, "ack", process[1].TagString("sluice.outcome"))
	assert.Equal(t, int64(100), process[0].Tags["sluice.retry.delay_ms"])
	assert.True(t, process[0].Failed())
	assert.False(t, process[1].Failed())
	require.Len(t, process[0].Logs, 1)
	assert.Equal(t, "gateway timeout", process[0].Logs[0].Fields["exception.message"])

	found, err := c.FindTraces(context.Background(), service, map[string]string{"sluice.outcome": "retry"}, time.Hour)
	require.NoError(t, err)
	require.Len(t, found, 1)
	assert.Equal(t, traceID, found[0].TraceID)
	none, err := c.FindTraces(context.Background(), service, map[string]string{"sluice.outcome": "dead_letter"}, time.Hour)
	require.NoError(t, err)
	assert.Empty(t, none)

	_, err = c.GetTrace(context.Background(), "00000000000000000000000000000001")
	assert.ErrorIs(t, err, jaeger.ErrNotFound)
}
