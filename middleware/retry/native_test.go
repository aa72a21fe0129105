package retry_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/headers"
)

// native is the queue's schedule in these tests: 200 ms × n, at most 1 s.
var native = broker.NativeRetry{Min: 200 * time.Millisecond, Max: time.Second}

// redelivered is the metadata of a delivery RabbitMQ redelivered after n rejections.
func redelivered(n int) message.Metadata {
	return message.Metadata{headers.Redelivered: "true", "x-delivery-count": strconv.Itoa(n)}
}

func TestNativeFor(t *testing.T) {
	tests := []struct {
		name string
		md   message.Metadata
		err  error
		// wantRequeue: given back rejected for the queue to hold; else handed to the
		// Delayer (wantHandOff) or dead-lettered.
		wantRequeue bool
		wantHandOff bool
		wantKind    disposition.Kind
		wantDelay   time.Duration
		wantAttempt int
	}{
		{name: "first failure: the queue holds it Min", md: message.Metadata{}, err: errBoom,
			wantRequeue: true, wantKind: disposition.Retry, wantDelay: 200 * time.Millisecond, wantAttempt: 1},
		{name: "after 2 rejections: Min × 3", md: redelivered(2), err: errBoom,
			wantRequeue: true, wantKind: disposition.Retry, wantDelay: 600 * time.Millisecond, wantAttempt: 3},
		{name: "capped at Max", md: redelivered(4), err: errBoom,
			wantRequeue: true, wantKind: disposition.Retry, wantDelay: time.Second, wantAttempt: 5},
		{name: "a producer's x-delivery-count on a first delivery is not read", md: message.Metadata{"x-delivery-count": "4"}, err: errBoom,
			wantRequeue: true, wantKind: disposition.Retry, wantDelay: 200 * time.Millisecond, wantAttempt: 1},
		{name: "RetryAfter goes through the Delayer, exact", md: message.Metadata{}, err: sluice.RetryAfter(3*time.Second, errBoom),
			wantHandOff: true, wantKind: disposition.Retry, wantDelay: 3 * time.Second, wantAttempt: 1},
		{name: "Defer goes through the Delayer", md: redelivered(1), err: sluice.Defer(2*time.Second, errBoom),
			wantHandOff: true, wantKind: disposition.Defer, wantDelay: 2 * time.Second, wantAttempt: 2},
		{name: "after a retry through the Delayer the schedule stays there", md: message.Metadata{sluice.HeaderRetryCount: "1"}, err: errBoom,
			wantHandOff: true, wantKind: disposition.Retry, wantDelay: 400 * time.Millisecond, wantAttempt: 2},
		{name: "retries used up: dead-lettered with the count", md: redelivered(5), err: errBoom,
			wantKind: disposition.DeadLetter, wantAttempt: 6},
		{name: "permanent: dead-lettered at once", md: message.Metadata{}, err: sluice.Permanent(errBoom),
			wantKind: disposition.DeadLetter, wantAttempt: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, delayer, _ := newStep(t, testPolicy(), nil)
			res := run(t, r.NativeFor("", native), failing(tt.err), tt.md)

			require.True(t, res.reported)
			assert.Equal(t, tt.wantKind, res.report.Outcome)
			assert.Equal(t, tt.wantAttempt, res.report.Attempt)
			if tt.wantKind != disposition.DeadLetter {
				assert.Equal(t, tt.wantDelay, res.report.Delay)
			}
			all := observed.All()
			require.NotEmpty(t, all)
			assert.Equal(t, tt.wantRequeue, all[len(all)-1].Disposition.HeldBack, "observers are told whether the queue holds the retry back")
			switch {
			case tt.wantRequeue:
				// Returned to be rejected (not Unprocessed, which would be a nack the
				// queue does not delay), unchanged, and nothing published.
				require.Error(t, res.err)
				require.True(t, isGiveBack(res.err), "given back to be rejected: %v", res.err)
				assert.Equal(t, broker.SettleHoldBack, res.settlement, "rejected at once, without the requeue backoff")
				assert.ErrorIs(t, res.err, errBoom)
				assert.Empty(t, delayer.Calls())
				assert.Empty(t, dead.calls.All())
				assert.Empty(t, res.msg.Metadata.Get(sluice.HeaderRetryCount), "the message goes back as it came")
			case tt.wantHandOff:
				require.NoError(t, res.err)
				calls := delayer.Calls()
				require.Len(t, calls, 1)
				assert.Equal(t, tt.wantDelay, calls[0].d)
			default:
				require.NoError(t, res.err)
				assert.Empty(t, delayer.Calls())
				copies := dead.calls.All()
				require.Len(t, copies, 1)
				assert.Equal(t, strconv.Itoa(tt.wantAttempt-1), copies[0].Metadata.Get(sluice.HeaderRetryCount),
					"the dead letter counts the queue's retries")
			}
		})
	}
}

func TestNativeFor_ExhaustedReasonCountsTheQueuesRetries(t *testing.T) {
	r, _, _ := newStep(t, testPolicy(), nil)
	res := run(t, r.NativeFor("", native), failing(errBoom), redelivered(5))
	require.ErrorIs(t, res.dead, disposition.ErrRetriesExhausted)
	assert.Contains(t, res.dead.Error(), "after 5 retries")
}

func TestNativeFor_SucceedsAfterRedelivery(t *testing.T) {
	r, delayer, _ := newStep(t, testPolicy(), nil)
	res := run(t, r.NativeFor("", native), func(*message.Message) ([]*message.Message, error) { return nil, nil }, redelivered(3))
	require.NoError(t, res.err)
	assert.False(t, res.reported, "a success is an ack")
	assert.Empty(t, delayer.Calls())
}
