package router_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// Issue 54 on the embedded broker: a handler with a compensation and MaxRetries 2 publishes
// one event beside a final dead letter (retries exhausted, permanent), none beside a
// discard; a builder that fails leaves the dead letter alone, its record saying why.
func TestWithCompensation_EmbeddedBroker(t *testing.T) {
	errDeclined := errors.New("card declined")
	errNoOrder := errors.New("no order id in the payment")
	tests := []struct {
		name       string
		fail       error
		build      error
		partitions int
		wantCalls  int64
		wantDead   bool
		wantEvent  bool
	}{
		{name: "retries exhausted", fail: errDeclined, wantCalls: 3, wantDead: true, wantEvent: true},
		{name: "permanent", fail: sluice.Permanent(errDeclined), wantCalls: 1, wantDead: true, wantEvent: true},
		{name: "partitioned", fail: sluice.Permanent(errDeclined), partitions: 2, wantCalls: 1, wantDead: true, wantEvent: true},
		{name: "discard", fail: sluice.Discard(errDeclined), wantCalls: 1},
		{name: "the builder fails", fail: sluice.Permanent(errDeclined), build: errNoOrder, wantCalls: 1, wantDead: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := memory.New(memory.Config{Logger: silentLogger})
			t.Cleanup(func() { _ = b.Close() })
			s, err := router.New(b, router.Config{Logger: silentLogger, CloseTimeout: time.Second,
				Retry: retry.Config{MaxRetries: 2, InitialDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond, Jitter: retry.NoJitter}})
			require.NoError(t, err)
			var calls atomic.Int64
			opts := []router.HandlerOption{router.WithCompensation(router.Compensation{Queue: "payments.failed",
				Build: func(msg, record *message.Message) (*message.Message, error) {
					if tc.build != nil {
						return nil, tc.build
					}
					return message.NewMessage("", []byte("cancel "+msg.UUID+": "+record.Metadata.Get(sluice.HeaderErrorMessage))), nil
				}})}
			if tc.partitions > 0 {
				opts = append(opts, router.WithPartitions(tc.partitions))
			}
			require.NoError(t, s.Handle("payments", "payments", func(*message.Message) error {
				calls.Add(1)
				return tc.fail
			}, opts...))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			<-s.Running()

			msg := message.NewMessage("pay-1", []byte("x"))
			msg.Metadata.Set(headers.CorrelationID, "order-7")
			if tc.partitions > 0 {
				require.NoError(t, b.PublishPartitioned(ctx, "payments", "order-7", msg))
			} else {
				require.NoError(t, b.Publish("payments", msg))
			}
			require.Eventually(t, func() bool {
				return calls.Load() >= tc.wantCalls && (!tc.wantDead || b.Len(topology.DLQ("payments")) == 1)
			}, 10*time.Second, 5*time.Millisecond)
			require.NoError(t, s.Close())
			cancel()
			require.NoError(t, <-done)

			assert.Equal(t, tc.wantCalls, calls.Load())
			dead, events := b.Peek(topology.DLQ("payments")), b.Peek("payments.failed")
			if !tc.wantDead {
				assert.Empty(t, dead)
				assert.Empty(t, events, "a discard does not compensate")
				return
			}
			require.Len(t, dead, 1)
			rec := dead[0].Metadata
			if !tc.wantEvent {
				assert.Empty(t, events)
				assert.Empty(t, rec.Get(headers.CompensationID))
				assert.Equal(t, errNoOrder.Error(), rec.Get(headers.CompensationError), "the record says why no event went")
				return
			}
			require.Len(t, events, 1, "exactly one event")
			ev := events[0]
			assert.Equal(t, carry.CompensationID(message.NewMessage("pay-1", nil)), ev.UUID)
			assert.Equal(t, ev.UUID, rec.Get(headers.CompensationID))
			assert.Equal(t, "queue payments.failed", rec.Get(headers.CompensationTo))
			assert.Equal(t, "order-7", ev.Metadata.Get(headers.CorrelationID))
			assert.Equal(t, "pay-1", ev.Metadata.Get(headers.CompensationOf))
			assert.Regexp(t, `^cancel pay-1: .*card declined$`, string(ev.Payload), "built from the message and its record")
		})
	}
}

func TestWithCompensation_Invalid(t *testing.T) {
	build := func(msg, _ *message.Message) (*message.Message, error) { return msg, nil }
	tests := []struct {
		name string
		c    router.Compensation
		want string
	}{
		{name: "no builder", c: router.Compensation{Queue: "q.failed"}, want: "without a Build function"},
		{name: "nowhere to publish", c: router.Compensation{Build: build}, want: "without an Exchange or a Queue"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := memory.New(memory.Config{Logger: silentLogger})
			t.Cleanup(func() { _ = b.Close() })
			s, err := router.New(b, router.Config{Logger: silentLogger})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			err = s.Handle("payments", "payments", func(*message.Message) error { return nil }, router.WithCompensation(tc.c))
			require.ErrorIs(t, err, router.ErrInvalidOption)
			assert.ErrorContains(t, err, tc.want)
			assert.ErrorContains(t, err, `"payments"`, "names the handler")
		})
	}
}
