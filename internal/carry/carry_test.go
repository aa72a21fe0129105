package carry_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/steptest"
)

var (
	errBoom   = errors.New("boom")
	errBroker = errors.New("broker unreachable")
)

// Every disposition is carried out with at most one hand-off and told to the observer
// exactly once; a failed hand-off is observed (and returned) as a GiveBack, never as what
// was meant.
func TestCarry_OneHandOffOneObservation(t *testing.T) {
	tests := []struct {
		name       string
		d          disposition.Disposition
		failWith   error
		wantDelays int
		wantDead   int
		wantKind   disposition.Kind
		wantNack   bool
		// wantMarked: returned unprocessed, with the subscriber's basic.nack mark.
		wantMarked bool
	}{
		{name: "ack", d: disposition.Disposition{Kind: disposition.Ack}, wantKind: disposition.Ack},
		{name: "retry", d: disposition.Disposition{Kind: disposition.Retry, Delay: time.Second, Reason: errBoom}, wantDelays: 1, wantKind: disposition.Retry},
		{name: "defer", d: disposition.Disposition{Kind: disposition.Defer, Delay: time.Second, Reason: errBoom}, wantDelays: 1, wantKind: disposition.Defer},
		{name: "dead letter", d: disposition.Disposition{Kind: disposition.DeadLetter, Reason: sluice.Permanent(errBoom)}, wantDead: 1, wantKind: disposition.DeadLetter},
		{name: "discard", d: disposition.Disposition{Kind: disposition.Discard, Reason: sluice.Discard(errBoom)}, wantKind: disposition.Discard},
		{name: "give back", d: disposition.Disposition{Kind: disposition.GiveBack, Reason: errBoom}, wantKind: disposition.GiveBack, wantNack: true},
		{name: "give back unprocessed", d: disposition.Disposition{Kind: disposition.GiveBack, Reason: errBoom, Unprocessed: true}, wantKind: disposition.GiveBack, wantNack: true, wantMarked: true},
		{name: "retry hand-off fails", d: disposition.Disposition{Kind: disposition.Retry, Delay: time.Second, Reason: errBoom}, failWith: errBroker, wantDelays: 1, wantKind: disposition.GiveBack, wantNack: true},
		{name: "dead letter fails", d: disposition.Disposition{Kind: disposition.DeadLetter, Reason: errBoom}, failWith: errBroker, wantDead: 1, wantKind: disposition.GiveBack, wantNack: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var delays, dead int
			obs := &steptest.Observer{}
			c := &carry.Carrier{
				Delayer: steptest.DelayerFunc(func(context.Context, string, time.Duration, *message.Message) error {
					delays++
					return tt.failWith
				}),
				DeadLetter: func(_ context.Context, msg *message.Message, _ string, _ error) (*message.Message, error) {
					dead++
					return msg, tt.failWith
				},
				Observer: obs,
				Logger:   slog.New(slog.DiscardHandler),
			}
			msg := message.NewMessage("m-1", []byte("x"))
			now := time.Now()
			err := c.Carry(context.Background(), carry.Attempt{Msg: msg, Queue: "orders", Number: 1, First: now, Now: now, Dependency: "gateway"}, tt.d)
			if tt.wantNack {
				require.Error(t, err)
				assert.True(t, disposition.IsGiveBack(err), "%v", err)
			} else {
				require.NoError(t, err)
			}
			if tt.wantMarked {
				assert.Equal(t, "1", msg.Metadata.Get(headers.GivenBack), "returned with basic.nack, not counted as a failed delivery")
			} else {
				assert.Empty(t, msg.Metadata.Get(headers.GivenBack), "a failure, or a failed hand-off, is a basic.reject")
			}
			assert.Equal(t, tt.wantDelays, delays)
			assert.Equal(t, tt.wantDead, dead)
			all := obs.All()
			require.Len(t, all, 1, "observed once")
			assert.Equal(t, tt.wantKind, all[0].Disposition.Kind)
			assert.Equal(t, "gateway", all[0].Dependency)
			assert.Equal(t, "m-1", all[0].MessageID)
			if tt.failWith != nil {
				assert.ErrorIs(t, all[0].Disposition.Reason, tt.failWith)
			}
		})
	}
}

// An attempt after a failure names the failure it was retried for; a first attempt reads
// nothing more.
func TestCarry_RetriedErrorType(t *testing.T) {
	tests := []struct {
		name   string
		number int
		last   string
		want   string
	}{
		{name: "first attempt", number: 1, last: "timeout", want: ""},
		{name: "retried attempt", number: 2, last: "timeout", want: "timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obs := &steptest.Observer{}
			c := &carry.Carrier{Observer: obs, Logger: slog.New(slog.DiscardHandler)}
			msg := message.NewMessage("m-1", []byte("x"))
			msg.Metadata.Set(sluice.HeaderLastError, tt.last)
			require.NoError(t, c.Carry(context.Background(), carry.Attempt{Msg: msg, Queue: "orders", Number: tt.number}, disposition.Disposition{Kind: disposition.Ack}))
			require.Len(t, obs.All(), 1)
			assert.Equal(t, tt.want, obs.All()[0].RetriedErrorType)
		})
	}
}
