package dlq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/dlq"
	ifailure "github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
)

func TestReplay(t *testing.T) {
	cases := []struct {
		name     string
		sel      dlq.Selector
		want     []string // replayed, in DLQ order
		wantLeft []string // still in the DLQ, in order
	}{
		{name: "one id", sel: dlq.Selector{IDs: []string{"m-3"}}, want: []string{"m-3"}, wantLeft: []string{"m-1", "m-2", "m-4", "m-5"}},
		{name: "error type", sel: dlq.Selector{ErrorType: "gateway_down"}, want: []string{"m-2", "m-4"}, wantLeft: []string{"m-1", "m-3", "m-5"}},
		{name: "older than", sel: dlq.Selector{OlderThan: time.Hour}, want: []string{"m-1", "m-5"}, wantLeft: []string{"m-2", "m-3", "m-4"}},
		{name: "error type and age", sel: dlq.Selector{ErrorType: "invalid_amount", OlderThan: time.Hour}, want: []string{"m-1", "m-5"}, wantLeft: []string{"m-2", "m-3", "m-4"}},
		{name: "all", sel: dlq.Selector{All: true}, want: []string{"m-1", "m-2", "m-3", "m-4", "m-5"}, wantLeft: nil},
	}
	for _, qt := range queueTypes {
		t.Run(string(qt), func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					fx := newFixture(t, qt)
					old := time.Now().Add(-2 * time.Hour)
					fx.deadLetter(t, failure{id: "m-1", err: invalidAmount(), failed: old})
					fx.deadLetter(t, failure{id: "m-2", err: gatewayDown(), retries: 1})
					fx.deadLetter(t, failure{id: "m-3", err: invalidAmount(), md: map[string]string{headers.ReplayCount: "1"}})
					fx.deadLetter(t, failure{id: "m-4", err: gatewayDown(), retries: 1})
					fx.deadLetter(t, failure{id: "m-5", err: invalidAmount(), failed: old})
					fx.waitCount(t, fx.dlq, 5)
					var progress []string
					r := dlq.NewReplayer(fx.conn)
					r.OnReplay = func(m dlq.Replayed) { progress = append(progress, m.ID) }

					res, err := r.Replay(context.Background(), fx.queue, tc.sel)
					require.NoError(t, err)
					assert.Equal(t, tc.want, replayedIDs(res))
					assert.Equal(t, tc.want, progress)
					assert.Equal(t, 5, res.Scanned)
					fx.waitCount(t, fx.dlq, len(tc.wantLeft))
					assert.Equal(t, tc.wantLeft, fx.peek(t, fx.dlq), "the rest stays in the DLQ, in order")

					got := fx.take(t, fx.queue)
					require.Len(t, got, len(tc.want))
					for i, d := range got {
						assert.Equal(t, tc.want[i], idOf(d))
						assertReplayed(t, d)
					}
				})
			}
		})
	}
}

// assertReplayed checks what a replayed copy carries: the retry state gone but for the
// first failure time and the history (which ends with the replay), the id, payload,
// properties, trace context and other headers kept, x-replay-count incremented.
func assertReplayed(t *testing.T, d amqp091.Delivery) {
	t.Helper()
	id := idOf(d)
	for _, k := range []string{
		sluice.HeaderRetryCount, headers.LastFailureTime, headers.TripAttempts, headers.ArrivedRetryCount,
		sluice.HeaderLastError, sluice.HeaderLastErrorMessage, sluice.HeaderErrorType, sluice.HeaderErrorMessage,
		headers.ErrorClass, headers.Handler, headers.FailedAt, headers.FailedHost, headers.FailedPID,
	} {
		assert.NotContains(t, d.Headers, k, "message %s", id)
	}
	assert.Contains(t, d.Headers, headers.FirstFailureTime, "message %s: the first failure survives the replay", id)
	assert.Contains(t, d.Headers, headers.ReplayedAt, "message %s", id)
	history := ifailure.History(message.Metadata{sluice.HeaderRetryHistory: fmt.Sprint(d.Headers[sluice.HeaderRetryHistory])})
	if assert.GreaterOrEqual(t, len(history), 2, "message %s: the failure and the replay", id) {
		assert.Equal(t, "replay", history[len(history)-1].Type)
		assert.NotEqual(t, "replay", history[0].Type)
	}
	wantReplays := "1"
	if id == "m-3" {
		wantReplays = "2"
	}
	assert.Equal(t, wantReplays, d.Headers[headers.ReplayCount], "message %s", id)
	assert.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", d.Headers[headers.TraceParent])
	assert.Equal(t, "vendor=1", d.Headers[headers.TraceState])
	assert.Equal(t, "acme", d.Headers["tenant"])
	assert.Equal(t, id, d.MessageId)
	assert.Equal(t, `{"id":"`+id+`"}`, string(d.Body))
	assert.Equal(t, "application/json", d.ContentType)
	assert.Equal(t, "corr-"+id, d.CorrelationId)
	assert.Equal(t, uint8(amqp091.Persistent), d.DeliveryMode)
	// The consumer reads the copy as a first attempt.
	msg, err := amqp.Marshaler{}.Unmarshal(d)
	require.NoError(t, err)
	assert.Equal(t, 0, sluice.RetryCount(msg.Metadata))
	assert.Equal(t, id, msg.UUID)
}

func TestReplayDestinationMissing(t *testing.T) {
	cases := []struct {
		name string
		hook func(*dlq.Replayer)
	}{
		{name: "found by the check before the publish"},
		{name: "returned at commit and put back", hook: dlq.SkipDestinationCheck},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t, amqp.QueueClassic)
			fx.deadLetter(t, failure{id: "m-1", err: invalidAmount()})
			// A partition of the queue that does not exist (any more).
			gone := fx.queue + ".p7"
			fx.deadLetter(t, failure{id: "m-2", err: invalidAmount(), record: map[string]string{sluice.HeaderOriginalQueue: gone}})
			fx.deadLetter(t, failure{id: "m-3", err: invalidAmount()})
			fx.waitCount(t, fx.dlq, 3)
			r := dlq.NewReplayer(fx.conn)
			if tc.hook != nil {
				tc.hook(r)
			}
			res, err := r.Replay(context.Background(), fx.queue, dlq.Selector{All: true})
			require.ErrorIs(t, err, dlq.ErrDestinationNotFound)
			assert.Contains(t, err.Error(), gone)
			assert.Equal(t, []string{"m-1", "m-3"}, replayedIDs(res), "the others are replayed")
			require.Len(t, res.Failed, 1)
			assert.Equal(t, "m-2", res.Failed[0].ID)
			assert.Equal(t, gone, res.Failed[0].Destination)

			fx.waitCount(t, fx.dlq, 1)
			left := fx.take(t, fx.dlq)
			require.Len(t, left, 1)
			assert.Equal(t, "m-2", idOf(left[0]))
			assert.Equal(t, "invalid_amount", left[0].Headers[sluice.HeaderErrorType], "the failure record is intact")
			assert.Equal(t, []string{"m-1", "m-3"}, idsOf(fx.take(t, fx.queue)))
		})
	}
}

func TestReplayUnknownIDs(t *testing.T) {
	fx := newFixture(t, amqp.QueueClassic)
	fx.deadLetter(t, failure{id: "m-1", err: invalidAmount()})
	fx.deadLetter(t, failure{id: "m-2", err: invalidAmount()})
	fx.waitCount(t, fx.dlq, 2)
	cases := []struct {
		name        string
		ids         []string
		wantMissing []string
		wantMoved   []string
	}{
		{name: "unknown id only", ids: []string{"nope"}, wantMissing: []string{"nope"}, wantMoved: []string{}},
		{name: "a known and an unknown id", ids: []string{"m-2", "nope"}, wantMissing: []string{"nope"}, wantMoved: []string{"m-2"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := dlq.NewReplayer(fx.conn).Replay(context.Background(), fx.queue, dlq.Selector{IDs: tc.ids})
			require.ErrorIs(t, err, dlq.ErrMessageNotFound)
			assert.Equal(t, tc.wantMissing, res.MissingIDs)
			assert.Equal(t, tc.wantMoved, replayedIDs(res))
		})
	}
	fx.waitCount(t, fx.dlq, 1)
	assert.Equal(t, []string{"m-1"}, fx.peek(t, fx.dlq))
}

func TestReplayRejectsBadSelector(t *testing.T) {
	cases := []struct {
		name string
		sel  dlq.Selector
	}{
		{name: "nothing selected", sel: dlq.Selector{}},
		{name: "all and a filter", sel: dlq.Selector{All: true, IDs: []string{"a"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// No connection is needed to refuse: the selector is checked first.
			_, err := dlq.NewReplayer(nil).Replay(context.Background(), "q", tc.sel)
			require.Error(t, err)
			assert.NotErrorIs(t, err, dlq.ErrNoConnection)
		})
	}
}

func idsOf(ds []amqp091.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = idOf(d)
	}
	return out
}

// Issue 33: a dead letter whose x-original-queue names another service's queue goes back to
// Q, never there, and the result counts it; --to still wins.
func TestReplayIgnoresAForeignOrigin(t *testing.T) {
	fx := newFixture(t, amqp.QueueClassic)
	victim := fx.queue + ".victim"
	ch, err := fx.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(victim, true, true, false, false, nil) // durable: 4.3 denies transient non-exclusive queues
	require.NoError(t, err)
	require.NoError(t, ch.Close())
	t.Cleanup(func() { fx.rabbit.DeleteQueues(victim) })
	fx.deadLetter(t, failure{id: "m-1", err: invalidAmount(), record: map[string]string{sluice.HeaderOriginalQueue: victim}})
	fx.deadLetter(t, failure{id: "m-2", err: invalidAmount()})
	fx.waitCount(t, fx.dlq, 2)

	var moved []dlq.Moved
	o := dlq.Operator{Conn: fx.conn}
	o.OnMoved = func(m dlq.Moved) { moved = append(moved, m) }
	res, err := o.Replay(context.Background(), fx.queue, dlq.Selector{All: true}, dlq.Options{})
	require.NoError(t, err)
	assert.Equal(t, 2, res.Moved)
	assert.Equal(t, 1, res.IgnoredOrigins)
	require.Len(t, moved, 2)
	assert.Equal(t, dlq.Moved{ID: "m-1", Destination: fx.queue, ErrorType: moved[0].ErrorType, GroupID: moved[0].GroupID, ReplayCount: 1, IgnoredOrigin: true}, moved[0])
	assert.False(t, moved[1].IgnoredOrigin)
	assert.Equal(t, []string{"m-1", "m-2"}, idsOf(fx.take(t, fx.queue)))
	assert.Zero(t, fx.rabbit.Count(victim), "nothing reaches the queue the header named")
}
