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
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/markers"
	"github.com/sluice-go/sluice/internal/testkit/steptest"
)

var (
	errBoom   = errors.New("boom")
	errBroker = errors.New("broker unreachable")
)

// Every fate is carried out with at most one hand-off and told to the observer exactly
// once; a failed hand-off is observed (and returned) as a GiveBack, never as what was meant.
func TestCarry_OneHandOffOneObservation(t *testing.T) {
	policy := decide.Policy{MaxRetries: 3, MaxTotalAge: time.Hour, MaxRetryAfter: time.Hour, Backoff: func(int) time.Duration { return time.Second }}
	tests := []struct {
		name       string
		in         decide.Input
		failWith   error
		wantDelays int
		wantDead   int
		wantKind   disposition.Kind
		wantNack   bool
		// wantSettle is how the subscriber settles a nacked message; wantHeld: the
		// observers hear of a retry the queue holds back.
		wantSettle broker.Settlement
		wantHeld   bool
	}{
		{name: "ack", in: decide.Input{}, wantKind: disposition.Ack},
		{name: "retry", in: decide.Input{Err: errBoom}, wantDelays: 1, wantKind: disposition.Retry},
		{name: "defer", in: decide.Input{Err: sluice.Defer(time.Second, errBoom)}, wantDelays: 1, wantKind: disposition.Defer},
		{name: "dead letter", in: decide.Input{Err: sluice.Permanent(errBoom)}, wantDead: 1, wantKind: disposition.DeadLetter},
		{name: "discard", in: decide.Input{Err: sluice.Discard(errBoom)}, wantKind: disposition.Discard},
		{name: "returned unprocessed", in: decide.Input{Err: markers.ReturnUnprocessed(errBoom)}, wantKind: disposition.GiveBack, wantNack: true, wantSettle: broker.SettleReturn},
		{name: "held back by the queue", in: decide.Input{Err: errBoom, Native: &decide.Native{Delay: time.Second}}, wantKind: disposition.Retry, wantNack: true, wantSettle: broker.SettleHoldBack, wantHeld: true},
		{name: "retry hand-off fails", in: decide.Input{Err: errBoom}, failWith: errBroker, wantDelays: 1, wantKind: disposition.GiveBack, wantNack: true, wantSettle: broker.SettleReject},
		{name: "dead letter fails", in: decide.Input{Err: sluice.Permanent(errBoom)}, failWith: errBroker, wantDead: 1, wantKind: disposition.GiveBack, wantNack: true, wantSettle: broker.SettleReject},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var delays, dead int
			obs := &steptest.Observer{}
			c := carry.New(carry.Carrier{
				Delayer: steptest.DelayerFunc(func(context.Context, string, time.Duration, *message.Message) error {
					delays++
					return tt.failWith
				}),
				DeadLetterer: deadLettererFunc(func(context.Context, string, *message.Message) error {
					dead++
					return tt.failWith
				}),
				Observer: obs,
				Logger:   slog.New(slog.DiscardHandler),
			})
			msg := message.NewMessage("m-1", []byte("x"))
			ctx, delivery := broker.WithDelivery(context.Background())
			msg.SetContext(ctx)
			now := time.Now()
			in := tt.in
			in.Policy, in.History.Now = policy, now
			err := c.Carry(ctx, carry.Attempt{Msg: msg, Queue: "orders", Number: 1, First: now, Now: now, Dependency: "gateway"}, in)
			if tt.wantNack {
				var gb *carry.GiveBack
				require.ErrorAs(t, err, &gb)
			} else {
				require.NoError(t, err)
			}
			if tt.wantNack {
				// Returned unprocessed: a basic.nack, at once and not counted; held back: a
				// basic.reject at once; a failed hand-off: a basic.reject after a pause.
				assert.Equal(t, tt.wantSettle, delivery.Settlement(), "how the subscriber settles the nack")
			}
			assert.Equal(t, message.Metadata{}, msg.Metadata, "the message's metadata is left alone")
			assert.Equal(t, tt.wantDelays, delays)
			assert.Equal(t, tt.wantDead, dead)
			all := obs.All()
			require.Len(t, all, 1, "observed once")
			assert.Equal(t, tt.wantKind, all[0].Disposition.Kind)
			assert.Equal(t, tt.wantHeld, all[0].Disposition.HeldBack)
			assert.Equal(t, "gateway", all[0].Dependency)
			assert.Equal(t, "m-1", all[0].MessageID)
			if tt.failWith != nil {
				assert.ErrorIs(t, all[0].Disposition.Reason, tt.failWith)
			}
		})
	}
}

type deadLettererFunc func(ctx context.Context, queue string, msg *message.Message) error

func (f deadLettererFunc) DeadLetter(ctx context.Context, queue string, msg *message.Message) error {
	return f(ctx, queue, msg)
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
			c := carry.New(carry.Carrier{Observer: obs, Logger: slog.New(slog.DiscardHandler)})
			msg := message.NewMessage("m-1", []byte("x"))
			msg.Metadata.Set(sluice.HeaderLastError, tt.last)
			require.NoError(t, c.Carry(context.Background(), carry.Attempt{Msg: msg, Queue: "orders", Number: tt.number}, decide.Input{}))
			require.Len(t, obs.All(), 1)
			assert.Equal(t, tt.want, obs.All()[0].RetriedErrorType)
		})
	}
}

// A final dead letter with the handler's compensation: the dead letter and the event are
// both published, confirmed, before the ack; the event's id is the same on every
// redelivery and new after a replay; the record names it; either publish failing gives the
// message back; a builder that fails leaves the dead letter alone, its record saying why.
func TestCarry_Compensation(t *testing.T) {
	errBuild := errors.New("no order id")
	tests := []struct {
		name                     string
		deadErr, eventErr, build error
		wantGiveBack             bool
		wantEvents               int
	}{
		{name: "both confirmed", wantEvents: 1},
		{name: "the dead letter fails", deadErr: errBroker, wantGiveBack: true, wantEvents: 1},
		{name: "the event fails", eventErr: errBroker, wantGiveBack: true, wantEvents: 1},
		{name: "the builder fails", build: errBuild, wantEvents: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var dead, events []*message.Message
			c := carry.New(carry.Carrier{
				DeadLetterer: deadLettererFunc(func(_ context.Context, _ string, m *message.Message) error {
					dead = append(dead, m)
					return tt.deadErr
				}),
				Logger: slog.New(slog.DiscardHandler),
			})
			comp := &carry.Compensation{
				Build: func(msg, record *message.Message) (*message.Message, error) {
					if tt.build != nil {
						return nil, tt.build
					}
					return message.NewMessage("ignored", []byte(`{"cancel":"`+msg.UUID+`","because":"`+record.Metadata.Get(sluice.HeaderErrorType)+`"}`)), nil
				},
				Publish: func(_ context.Context, ev *message.Message) error {
					events = append(events, ev)
					return tt.eventErr
				},
				To: "exchange orders, key payment.failed",
			}
			msg := message.NewMessage("pay-1", []byte("x"))
			msg.Metadata.Set(headers.WatermillCorrelationID, "order-7")
			now := time.Now()
			a := carry.Attempt{Msg: msg, Queue: "payments", Number: 1, First: now, Now: now, Compensation: comp}
			err := c.Carry(context.Background(), a, decide.Input{Err: sluice.Permanent(errBoom), Compensation: true, History: decide.History{Now: now}})
			if tt.wantGiveBack {
				var gb *carry.GiveBack
				require.ErrorAs(t, err, &gb, "the original is given back: both go again on its redelivery")
			} else {
				require.NoError(t, err)
			}
			require.Len(t, dead, 1)
			require.Len(t, events, tt.wantEvents)
			rec := dead[0].Metadata
			if tt.build != nil {
				assert.Empty(t, rec.Get(headers.CompensationID))
				assert.Equal(t, "no order id", rec.Get(headers.CompensationError), "the record says why no event went")
				return
			}
			ev := events[0]
			assert.Equal(t, carry.CompensationID(msg), ev.UUID)
			assert.Equal(t, ev.UUID, rec.Get(headers.CompensationID), "the record names the event")
			assert.Equal(t, "exchange orders, key payment.failed", rec.Get(headers.CompensationTo))
			assert.Equal(t, "order-7", ev.Metadata.Get(headers.WatermillCorrelationID), "it carries the correlation")
			assert.Equal(t, "pay-1", ev.Metadata.Get(headers.CompensationOf))
			assert.JSONEq(t, `{"cancel":"pay-1","because":"error"}`, string(ev.Payload), "built from the message and its record")
		})
	}
}

func TestCompensationID(t *testing.T) {
	msg := message.NewMessage("pay-1", nil)
	id := carry.CompensationID(msg)
	assert.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, id, "a UUID")
	again := message.NewMessage("pay-1", nil)
	again.Metadata.Set("x-delivery-count", "3")
	again.Metadata.Set(sluice.HeaderRetryCount, "5")
	assert.Equal(t, id, carry.CompensationID(again), "stable across redeliveries and retries")
	replayed := message.NewMessage("pay-1", nil)
	replayed.Metadata.Set(headers.ReplayCount, "1")
	assert.NotEqual(t, id, carry.CompensationID(replayed), "a replay starts a new fate")
	assert.NotEqual(t, id, carry.CompensationID(message.NewMessage("pay-2", nil)))
}
