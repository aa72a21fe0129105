package broker_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
)

type ctxKey struct{}

// A delivery's context carries its Delivery and everything its parent carried; a step
// finds it through any child context (telemetry's span, the handler's deadline).
func TestWithDelivery_FoundThroughChildContexts(t *testing.T) {
	parent := context.WithValue(context.Background(), ctxKey{}, "parent's value")
	ctx, d := broker.WithDelivery(parent)
	require.NotNil(t, d)
	child, cancel := context.WithCancel(context.WithValue(ctx, ctxKey{}, "child's value"))
	defer cancel()
	assert.Same(t, d, broker.DeliveryFrom(child))
	assert.Equal(t, "parent's value", ctx.Value(ctxKey{}), "the parent's values stay reachable")
	assert.Nil(t, broker.DeliveryFrom(parent), "the parent has none")
}

// A nack without a settlement is a failure (SettleReject); the last Settle before the nack
// wins.
func TestDelivery_Settlement(t *testing.T) {
	tests := []struct {
		name   string
		settle []broker.Settlement
		want   broker.Settlement
	}{
		{name: "never settled: a failure", want: broker.SettleReject},
		{name: "returned unprocessed", settle: []broker.Settlement{broker.SettleReturn}, want: broker.SettleReturn},
		{name: "held back", settle: []broker.Settlement{broker.SettleHoldBack}, want: broker.SettleHoldBack},
		{name: "rejected", settle: []broker.Settlement{broker.SettleReject}, want: broker.SettleReject},
		{name: "ack", settle: []broker.Settlement{broker.SettleAck}, want: broker.SettleAck},
		{name: "the last one wins", settle: []broker.Settlement{broker.SettleReturn, broker.SettleHoldBack}, want: broker.SettleHoldBack},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, d := broker.WithDelivery(context.Background())
			for _, s := range tt.settle {
				d.Settle(s)
			}
			assert.Equal(t, tt.want, d.Settlement())
		})
	}
}

// One ack hold per delivery, and none once the subscriber settles it (HeldAck): an attempt
// abandoned at its handler timeout and returning late waits in place instead of holding
// an ack nobody will run.
func TestDelivery_HoldAck(t *testing.T) {
	_, d := broker.WithDelivery(context.Background())
	errWait := errors.New("record not confirmed")
	require.True(t, d.HoldAck(func(<-chan struct{}) error { return errWait }))
	assert.False(t, d.HoldAck(func(<-chan struct{}) error { return nil }), "one hold a delivery")
	wait := d.HeldAck()
	require.NotNil(t, wait)
	assert.ErrorIs(t, wait(nil), errWait, "the first hold is the one the subscriber runs")

	_, d = broker.WithDelivery(context.Background())
	assert.Nil(t, d.HeldAck(), "nothing held")
	assert.False(t, d.HoldAck(func(<-chan struct{}) error { return nil }), "refused once the subscriber settles the delivery")
	assert.Nil(t, d.HeldAck(), "and nothing held after")
}

// Outside a subscriber that gives deliveries one (a plain Watermill subscriber) every method
// is safe: nothing is held, a nack is a failure.
func TestDelivery_Nil(t *testing.T) {
	d := broker.DeliveryFrom(context.Background())
	require.Nil(t, d)
	d.Settle(broker.SettleReturn)
	assert.Equal(t, broker.SettleReject, d.Settlement())
	assert.False(t, d.HoldAck(func(<-chan struct{}) error { return nil }))
	assert.Nil(t, d.HeldAck())
}

// Every delivery gets a Delivery: it costs one allocation, its context and itself together.
func TestWithDelivery_OneAllocation(t *testing.T) {
	parent := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		ctx, d := broker.WithDelivery(parent)
		d.Settle(broker.SettleReturn)
		_ = broker.DeliveryFrom(ctx)
	})
	assert.Equal(t, 1.0, allocs)
}
