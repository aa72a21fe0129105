package otelstep_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/otelnames"
)

// sluice.compensations counts a compensated handler's final dead letters per queue,
// handler and what became of the event; an outcome without a compensation is not counted.
func TestCompensationMetric(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	dead := disposition.Disposition{Kind: disposition.DeadLetter}
	for _, o := range []disposition.Outcome{
		{Queue: "payments", Handler: "pay", Disposition: dead, Compensation: disposition.CompensationSent},
		{Queue: "payments", Handler: "pay", Disposition: dead, Compensation: disposition.CompensationSent},
		{Queue: "payments", Handler: "pay", Disposition: dead, Compensation: disposition.CompensationBuildFailed},
		{Queue: "payments", Handler: "pay", Disposition: dead, Compensation: disposition.CompensationWithheld},
		{Queue: "payments", Handler: "pay", Disposition: dead},
		{Queue: "shipping", Handler: "ship", Disposition: dead, Compensation: disposition.CompensationSent},
	} {
		e.in.Observe(ctx, o)
	}
	data, ok := e.collect(t)[otelnames.MetricCompensations]
	require.True(t, ok, "%s recorded", otelnames.MetricCompensations)
	tests := []struct {
		queue, handler, outcome string
		want                    int64
	}{
		{"payments", "pay", "sent", 2},
		{"payments", "pay", "build_failed", 1},
		{"payments", "pay", "withheld", 1},
		{"shipping", "ship", "sent", 1},
	}
	for _, tt := range tests {
		t.Run(tt.handler+"/"+tt.outcome, func(t *testing.T) {
			assert.Equal(t, tt.want, sumPoint(t, data, otelnames.MetricAttrQueue.String(tt.queue),
				otelnames.MetricAttrHandler.String(tt.handler), otelnames.MetricAttrOutcome.String(tt.outcome)))
		})
	}
}
