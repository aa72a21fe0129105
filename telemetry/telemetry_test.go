package telemetry_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/telemetry"
)

// A plain Watermill router with the Instrumentation's Middleware, a producer publishing
// through WrapPublisher, and the retry outcome told through Observe: the attempt's span
// continues the producer's trace and says what became of it.
func TestInstrumentation_PlainRouter(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	e := newMeters(t)
	in, err := telemetry.New(telemetry.Config{TracerProvider: tp, MeterProvider: e.mp, Propagator: propagation.TraceContext{},
		MessagingSystem: "gochannel", EventLogLines: -1})
	require.NoError(t, err)

	logger := watermill.NopLogger{}
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, logger)
	require.NoError(t, err)
	r.AddMiddleware(in.Middleware)
	attempts := make(chan struct{}, 1)
	r.AddConsumerHandler("charge", "payments", ps, func(msg *message.Message) error {
		defer func() { attempts <- struct{}{} }()
		failure := errors.New("gateway timeout")
		// What the retry step tells its observer about an attempt it hands to the broker.
		in.Observe(msg.Context(), disposition.Outcome{Disposition: disposition.Disposition{Kind: disposition.Retry, Delay: time.Second, Reason: failure}})
		return nil
	})
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	<-r.Running()
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-done)
		require.NoError(t, ps.Close())
	})

	require.NoError(t, in.WrapPublisher(ps).Publish("payments", message.NewMessage("pay-1", []byte("{}"))))
	<-attempts
	require.Eventually(t, func() bool { return len(spans.Ended()) == 2 }, 5*time.Second, 5*time.Millisecond)
	// By name: the attempt may end before the publish that delivered it returns.
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, sp := range spans.Ended() {
		byName[sp.Name()] = sp
	}
	send, process := byName["send payments"], byName["process payments"]
	require.NotNil(t, send, "the producer's span")
	require.NotNil(t, process, "the attempt's span")
	assert.Equal(t, send.SpanContext().TraceID(), process.SpanContext().TraceID(), "one trace from the publish to the attempt")
	assert.Equal(t, send.SpanContext().SpanID(), process.Parent().SpanID())
	assert.Equal(t, codes.Error, process.Status().Code, "a retried attempt failed")
	got := map[attribute.Key]attribute.Value{}
	for _, kv := range process.Attributes() {
		got[kv.Key] = kv.Value
	}
	assert.Equal(t, "retry", got["sluice.outcome"].AsString())
	assert.Equal(t, "gochannel", got["messaging.system"].AsString())
	// Counted once the attempt's step returns, which may be after its span ended.
	assert.Eventually(t, func() bool {
		sum, ok := e.collect(t)["sluice.retries"].(metricdata.Sum[int64])
		return ok && len(sum.DataPoints) == 1 && sum.DataPoints[0].Value == 1
	}, 5*time.Second, 5*time.Millisecond,
		"the retry is counted")
}

func TestHealth_ChecksAndHandlers(t *testing.T) {
	var h telemetry.Health
	get := func(handler http.Handler) (int, string) {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		return rec.Code, rec.Body.String()
	}
	code, body := get(h.ReadinessHandler())
	assert.Equal(t, http.StatusOK, code, "the zero value is ready")
	assert.Equal(t, "ready\n", body)

	connected := false
	h.AddReadyCheck("broker", func() error {
		if !connected {
			return errors.New("not connected to RabbitMQ")
		}
		return nil
	})
	code, body = get(h.ReadinessHandler())
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Equal(t, "not ready\nbroker: not connected to RabbitMQ\n", body)
	code, body = get(h.LivenessHandler())
	assert.Equal(t, http.StatusOK, code, "liveness does not depend on readiness")
	assert.Equal(t, "ok\n", body)
	connected = true
	code, _ = get(h.ReadinessHandler())
	assert.Equal(t, http.StatusOK, code)
}
