package otelstep

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/otelnames"
)

// Operation names of the messaging metrics.
const (
	opProcess = "process"
	opSend    = "send"
)

// retryDelayBuckets cover what a retry policy gives: from the cascade's 10 ms resolution
// to an hour (longer delays land in +Inf).
var retryDelayBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}

// messagingMetrics are the convention instruments. Their attribute sets are the
// Instrumentation's (mmOpts): the options of each messagingKey, as the slices Add and
// Record take: boxing an attribute.Set into an option allocates (the conventions' AddSet
// and RecordSet do it per call), and so does a variadic slice built per call.
type messagingMetrics struct {
	processDuration messagingconv.ProcessDuration
	sent            messagingconv.ClientSentMessages
	opDuration      messagingconv.ClientOperationDuration
	retryDelay      metric.Float64Histogram
}

// messagingKey names one combination of convention attributes; errType "" means none.
type messagingKey struct{ op, destination, errType string }

// messagingOpts are one attribute set as counter and histogram options.
type messagingOpts struct {
	set metric.MeasurementOption
	add []metric.AddOption
	rec []metric.RecordOption
}

func (m *instruments) createMessagingInstruments() error {
	var err error
	mm := &m.mm
	if mm.processDuration, err = messagingconv.NewProcessDuration(m.meter,
		metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		return fmt.Errorf("create histogram %s: %w", otelnames.MetricProcessDuration, err)
	}
	if mm.sent, err = messagingconv.NewClientSentMessages(m.meter); err != nil {
		return fmt.Errorf("create counter %s: %w", otelnames.MetricSentMessages, err)
	}
	if mm.opDuration, err = messagingconv.NewClientOperationDuration(m.meter,
		metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		return fmt.Errorf("create histogram %s: %w", otelnames.MetricOperationDuration, err)
	}
	if mm.retryDelay, err = m.meter.Float64Histogram(otelnames.MetricRetryDelay,
		metric.WithDescription("Broker-side delay given to each retry."), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(retryDelayBuckets...)); err != nil {
		return fmt.Errorf("create histogram %s: %w", otelnames.MetricRetryDelay, err)
	}
	return nil
}

// messagingAttrs returns the convention attributes of k as a measurement option, built
// once per k: the keys are the stack's queues, two operations and the capped error types,
// a small set.
func (in *Instrumentation) messagingAttrs(k messagingKey) messagingOpts {
	if o, ok := in.mmOpts.Load(k); ok {
		return o.(messagingOpts)
	}
	kvs := []attribute.KeyValue{in.system, semconv.MessagingOperationName(k.op)}
	if k.destination != "" {
		kvs = append(kvs, semconv.MessagingDestinationName(k.destination))
	}
	if k.errType != "" {
		kvs = append(kvs, semconv.ErrorTypeKey.String(k.errType))
	}
	opt := metric.WithAttributeSet(attribute.NewSet(kvs...))
	o, _ := in.mmOpts.LoadOrStore(k, messagingOpts{set: opt, add: []metric.AddOption{opt}, rec: []metric.RecordOption{opt}})
	return o.(messagingOpts)
}

// recordProcessed records the duration in seconds of one attempt of flow f; errType is empty when it
// succeeded (whatever the outcome: a retry hand-off is a failed attempt).
func (in *Instrumentation) recordProcessed(ctx context.Context, m *instruments, f *flow, seconds float64, errType string) {
	opts := f.processed // the success's set, kept by the flow
	if errType != "" {
		opts = in.messagingAttrs(messagingKey{op: opProcess, destination: f.queue, errType: in.errTypes.label(errType)}).rec
	}
	m.mm.processDuration.Inst().Record(ctx, seconds, opts...)
}

// recordSent records one publish of n messages to destination that took d and failed
// with err (nil: confirmed).
func (in *Instrumentation) recordSent(ctx context.Context, m *instruments, destination string, n int, d time.Duration, err error) {
	opt := in.messagingAttrs(messagingKey{op: opSend, destination: destination, errType: in.errTypes.label(sluice.ErrorType(err))})
	m.mm.sent.Inst().Add(noExemplar, int64(n), opt.add...)
	m.mm.opDuration.Inst().Record(ctx, d.Seconds(), opt.rec...)
}
