package telemetry

import (
	"context"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/otelnames"
	"github.com/sluice-go/sluice/internal/retrystats"
)

// recoveryAttemptBuckets are the attempts a recovery histogram tells apart: the retry
// policies sluice ships stop after 5 retries (attempt 6) by default.
var recoveryAttemptBuckets = []float64{2, 3, 4, 5, 6, 8, 10, 15, 20}

// The "outcome" labels of sluice.retry.outcomes that are not a retrystats.RetryEnd.
const (
	retryOutcomeFailed  = "failed"
	retryOutcomeRetried = "retried"
)

// retryOutcomes are the instruments of retry outcome statistics.
type retryOutcomes struct {
	outcomes metric.Int64Counter
	recovery metric.Int64Histogram
	// attrs caches the measurement option of each (handler, error type, outcome): a
	// handful per error type, bounded by the error type cap.
	attrs sync.Map // retryKey -> metric.MeasurementOption
}

type retryKey struct{ handler, errType, outcome string }

func (in *Instrumentation) createRetryOutcomeInstruments() error {
	var err error
	in.ro.outcomes, err = in.meter.Int64Counter(otelnames.MetricRetryOutcomes, metric.WithUnit("{message}"),
		metric.WithDescription("Per handler and error type: messages that failed with it (failed), retries spent on it (retried), and how retried messages ended (recovered, exhausted, permanent, discarded, dead_lettered, retry_unlikely)."))
	if err != nil {
		return fmt.Errorf("create counter %s: %w", otelnames.MetricRetryOutcomes, err)
	}
	in.ro.recovery, err = in.meter.Int64Histogram(otelnames.MetricRetryRecoveryAttempt, metric.WithUnit("{attempt}"),
		metric.WithDescription("The attempt at which a retried message recovered, by handler and the error type it recovered from."),
		metric.WithExplicitBucketBoundaries(recoveryAttemptBuckets...))
	if err != nil {
		return fmt.Errorf("create histogram %s: %w", otelnames.MetricRetryRecoveryAttempt, err)
	}
	return nil
}

// observeRetry records what o tells the retry outcome metrics. A first attempt that
// succeeded records nothing and allocates nothing.
func (in *Instrumentation) observeRetry(ctx context.Context, o disposition.Outcome) {
	ev, ok := retrystats.RetryEventOf(o)
	if !ok {
		return
	}
	errType := in.errTypes.label(ev.ErrorType)
	if ev.NewMessage {
		in.ro.outcomes.Add(ctx, 1, in.retryAttrs(o.Handler, errType, retryOutcomeFailed))
	}
	if ev.Retried {
		in.ro.outcomes.Add(ctx, 1, in.retryAttrs(o.Handler, errType, retryOutcomeRetried))
	}
	if ev.End != retrystats.EndNone {
		opt := in.retryAttrs(o.Handler, errType, ev.End.String())
		in.ro.outcomes.Add(ctx, 1, opt)
		if ev.End == retrystats.Recovered {
			in.ro.recovery.Record(ctx, int64(ev.Attempt), in.retryAttrs(o.Handler, errType, ""))
		}
	}
}

// retryAttrs returns the measurement option of (handler, errType, outcome), built once;
// outcome "" means none (the histogram's).
func (in *Instrumentation) retryAttrs(handler, errType, outcome string) metric.MeasurementOption {
	k := retryKey{handler, errType, outcome}
	if opt, ok := in.ro.attrs.Load(k); ok {
		return opt.(metric.MeasurementOption)
	}
	kvs := []attribute.KeyValue{otelnames.MetricAttrHandler.String(handler), otelnames.MetricAttrErrorType.String(errType)}
	if outcome != "" {
		kvs = append(kvs, otelnames.MetricAttrOutcome.String(outcome))
	}
	opt, _ := in.ro.attrs.LoadOrStore(k, metric.WithAttributeSet(attribute.NewSet(kvs...)))
	return opt.(metric.MeasurementOption)
}
