package otelstep_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/otelnames"
	"github.com/sluice-go/sluice/internal/otelstep"
)

// The counters of every attempt are observed at collection; sampled or not, they count the
// same, and an outcome that never happened has no point, as with a synchronous counter.
func TestMetrics_ObservedCounters(t *testing.T) {
	tests := []struct {
		name    string
		sampler sdktrace.Sampler
		spans   int
	}{
		{"sampled", sdktrace.AlwaysSample(), 3},
		{"unsampled", sdktrace.NeverSample(), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spans := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(tt.sampler), sdktrace.WithSpanProcessor(spans))
			t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
			e := newEnv(t, otelstep.Config{TracerProvider: tp})
			queue := uniqueQueue("observed")
			ps, results := e.runRouter(t, queue, func(msg *message.Message) ([]*message.Message, error) {
				if string(msg.Payload) == "retry" {
					reportTo(e.in, msg.Context(), testReport{Outcome: disposition.Retry, Delay: time.Second, Err: errors.New("timeout")})
				}
				return nil, nil
			}, routerOpts{})
			for _, kind := range []string{"ack", "retry", "ack"} {
				require.NoError(t, ps.Publish(queue, message.NewMessage(kind, []byte(kind))))
				next(t, results)
			}

			assert.Len(t, spans.Ended(), tt.spans)

			m := e.collect(t)
			labels := []attribute.KeyValue{otelnames.MetricAttrQueue.String(queue), otelnames.MetricAttrHandler.String("test-handler")}
			outcome := func(o disposition.Kind) []attribute.KeyValue {
				return append(labels[:2:2], otelnames.MetricAttrOutcome.String(o.String()))
			}
			assert.Equal(t, int64(2), sumPoint(t, m[otelnames.MetricMessages], outcome(disposition.Ack)...))
			assert.Equal(t, int64(1), sumPoint(t, m[otelnames.MetricMessages], outcome(disposition.Retry)...))
			assert.Equal(t, int64(0), sumPoint(t, m[otelnames.MetricInFlight], labels...))
			assert.Equal(t, int64(3), sumPoint(t, m[otelnames.MetricConsumedMessages], semconv.MessagingDestinationName(queue)))
			for _, data := range []metricdata.Aggregation{m[otelnames.MetricMessages], m[otelnames.MetricConsumedMessages]} {
				assert.True(t, data.(metricdata.Sum[int64]).IsMonotonic, "a counter")
			}
			assert.False(t, m[otelnames.MetricInFlight].(metricdata.Sum[int64]).IsMonotonic, "an up-down counter")
			for _, dp := range m[otelnames.MetricMessages].(metricdata.Sum[int64]).DataPoints {
				v, _ := dp.Attributes.Value(otelnames.MetricAttrOutcome)
				assert.Contains(t, []string{"ack", "retry"}, v.AsString(), "only outcomes that happened have a point")
			}
		})
	}
}
