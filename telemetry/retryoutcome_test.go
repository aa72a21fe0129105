package telemetry_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/internal/otelnames"
	"github.com/sluice-go/sluice/telemetry"
)

type outcomeErr string

func (e outcomeErr) Error() string     { return string(e) }
func (e outcomeErr) ErrorType() string { return string(e) }

// The retry outcome metrics count a ledger of journeys: per handler and error type, the
// messages that failed, the retries spent and how the retried ones ended, and the attempt
// of each recovery.
func TestRetryOutcomeMetrics(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	obs := func(kind disposition.Kind, attempt int, prev string, reason error) {
		o := disposition.Outcome{Handler: "pay", Attempt: attempt, RetriedErrorType: prev, Disposition: disposition.Disposition{Kind: kind, Reason: reason}}
		if reason != nil {
			o.ErrorType = reason.(interface{ ErrorType() string }).ErrorType()
		}
		e.in.Observe(ctx, o)
	}
	timeout, upstream := outcomeErr("timeout"), outcomeErr("upstream")
	// 3 timeouts recover (at attempts 2, 2, 3); 2 upstream messages exhaust after 2 retries;
	// 1 upstream is stopped by the learned policy; 4 messages never fail.
	for _, n := range []int{2, 2, 3} {
		for a := 1; a < n; a++ {
			prev := ""
			if a > 1 {
				prev = "timeout"
			}
			obs(disposition.Retry, a, prev, timeout)
		}
		obs(disposition.Ack, n, "timeout", nil)
	}
	for range 2 {
		obs(disposition.Retry, 1, "", upstream)
		obs(disposition.Retry, 2, "upstream", upstream)
		e.in.Observe(ctx, disposition.Outcome{Handler: "pay", Attempt: 3, RetriedErrorType: "upstream", ErrorType: "upstream",
			Disposition: disposition.Disposition{Kind: disposition.DeadLetter, Reason: &decide.ExhaustedError{Retries: 2, Err: upstream}}})
	}
	e.in.Observe(ctx, disposition.Outcome{Handler: "pay", Attempt: 1, ErrorType: "upstream",
		Disposition: disposition.Disposition{Kind: disposition.DeadLetter, Reason: &decide.UnlikelyError{Err: upstream}}})
	for range 4 {
		obs(disposition.Ack, 1, "", nil)
	}

	m := e.collect(t)
	count := func(errType, outcome string) int64 {
		return sumPoint(t, m[otelnames.MetricRetryOutcomes], otelnames.MetricAttrHandler.String("pay"),
			otelnames.MetricAttrErrorType.String(errType), otelnames.MetricAttrOutcome.String(outcome))
	}
	tests := []struct {
		errType, outcome string
		want             int64
	}{
		{"timeout", "failed", 3}, {"timeout", "retried", 4}, {"timeout", "recovered", 3},
		{"upstream", "failed", 3}, {"upstream", "retried", 4}, {"upstream", "exhausted", 2}, {"upstream", "retry_unlikely", 1},
	}
	for _, tt := range tests {
		t.Run(tt.errType+"/"+tt.outcome, func(t *testing.T) {
			assert.Equal(t, tt.want, count(tt.errType, tt.outcome))
		})
	}
	for _, p := range m[otelnames.MetricRetryOutcomes].(metricdata.Sum[int64]).DataPoints {
		v, _ := p.Attributes.Value(otelnames.MetricAttrOutcome)
		assert.NotContains(t, []string{"permanent", "discarded", "dead_lettered"}, v.AsString(), "nothing ended so")
	}
	hist, ok := m[otelnames.MetricRetryRecoveryAttempt].(metricdata.Histogram[int64])
	require.True(t, ok, "recovery attempt is an int64 histogram, got %T", m[otelnames.MetricRetryRecoveryAttempt])
	require.Len(t, hist.DataPoints, 1)
	dp := hist.DataPoints[0]
	assert.Equal(t, uint64(3), dp.Count)
	assert.Equal(t, int64(7), dp.Sum, "attempts 2, 2 and 3")
	v, _ := dp.Attributes.Value(otelnames.MetricAttrErrorType)
	assert.Equal(t, "timeout", v.AsString())
}

// The error type label is capped like every other metric's.
func TestRetryOutcomeMetrics_ErrorTypeCapped(t *testing.T) {
	e := newEnv(t, telemetry.WithErrorTypeLimit(2))
	for _, typ := range []string{"a", "b", "c", "d"} {
		e.in.Observe(context.Background(), disposition.Outcome{Handler: "pay", Attempt: 1, ErrorType: typ,
			Disposition: disposition.Disposition{Kind: disposition.Retry, Reason: outcomeErr(typ)}})
	}
	m := e.collect(t)
	other := sumPoint(t, m[otelnames.MetricRetryOutcomes], otelnames.MetricAttrErrorType.String(telemetry.ErrorTypeOther),
		otelnames.MetricAttrOutcome.String("failed"))
	assert.Equal(t, int64(2), other)
}

// A first attempt that succeeded adds no allocation for the retry outcome metrics.
func TestRetryOutcomeMetrics_FirstSuccessAllocatesNothing(t *testing.T) {
	e := newEnv(t)
	o := disposition.Outcome{Handler: "pay", Attempt: 1, Disposition: disposition.Disposition{Kind: disposition.Ack}}
	ctx := context.Background()
	assert.Zero(t, testing.AllocsPerRun(1000, func() { e.in.Observe(ctx, o) }))
}
