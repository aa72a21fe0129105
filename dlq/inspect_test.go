package dlq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/dlq"
)

func TestInspectorLeavesDLQUntouched(t *testing.T) {
	for _, qt := range queueTypes {
		t.Run(string(qt), func(t *testing.T) {
			fx := newFixture(t, qt)
			old := time.Now().Add(-3 * time.Hour)
			fx.deadLetter(t, failure{id: "m-1", err: invalidAmount(), failed: old})
			fx.deadLetter(t, failure{id: "m-2", err: gatewayDown(), retries: 1})
			fx.deadLetter(t, failure{id: "m-3", err: invalidAmount()})
			fx.deadLetter(t, failure{id: "m-4", err: gatewayDown(), retries: 1})
			fx.waitCount(t, fx.dlq, 4)
			before := fx.peek(t, fx.dlq)
			require.Equal(t, []string{"m-1", "m-2", "m-3", "m-4"}, before)
			in := dlq.Inspector{Conn: fx.conn}
			ctx := context.Background()

			steps := []struct {
				name string
				run  func(t *testing.T)
			}{
				{name: "list", run: func(t *testing.T) {
					l, err := list(ctx, in, fx.queue, 0)
					require.NoError(t, err)
					assert.Equal(t, 4, l.Total)
					require.Len(t, l.Records, 4)
					r := l.Records[0]
					assert.Equal(t, "m-1", r.ID)
					assert.Equal(t, 1, r.Position)
					assert.Equal(t, "invalid_amount", r.ErrorType)
					assert.Equal(t, "permanent", r.ErrorClass)
					assert.Contains(t, r.ErrorMessage, "amount must be positive")
					assert.Equal(t, fx.queue, r.OriginalQueue)
					assert.Equal(t, "payments", r.Handler)
					assert.InDelta(t, 3*time.Hour, r.Age, float64(time.Minute))
					assert.Equal(t, "gateway_down", l.Records[1].ErrorType)
					assert.Equal(t, 1, l.Records[1].Retries)
				}},
				{name: "list with a limit", run: func(t *testing.T) {
					l, err := list(ctx, in, fx.queue, 2)
					require.NoError(t, err)
					assert.Equal(t, 4, l.Total)
					assert.Equal(t, []string{"m-1", "m-2"}, ids(l.Records))
				}},
				{name: "show", run: func(t *testing.T) {
					recs, err := in.Show(ctx, fx.queue, "m-3")
					require.NoError(t, err)
					require.Len(t, recs, 1)
					r := recs[0]
					assert.Empty(t, r.SameID, "one message holds the id")
					assert.Equal(t, 3, r.Position)
					assert.Equal(t, `{"id":"m-3"}`, string(r.Payload))
					assert.Equal(t, "application/json", r.Properties.ContentType)
					assert.Equal(t, "corr-m-3", r.Properties.CorrelationID)
					assert.Equal(t, "acme", r.Headers["tenant"])
					assert.Equal(t, "worker-1", r.FailedHost)
					require.Len(t, r.History, 1)
					assert.Equal(t, "invalid_amount", r.History[0].Type)
				}},
				{name: "stats", run: func(t *testing.T) {
					s, err := in.Stats(ctx, fx.queue)
					require.NoError(t, err)
					assert.Equal(t, 4, s.Total)
					require.Len(t, s.ByErrorType, 2)
					assert.Equal(t, "gateway_down", s.ByErrorType[0].ErrorType, "equal counts sort by name")
					assert.Equal(t, 2, s.ByErrorType[0].Count)
					assert.Equal(t, "invalid_amount", s.ByErrorType[1].ErrorType)
					assert.Equal(t, 2, s.ByErrorType[1].Count)
					assert.InDelta(t, 3*time.Hour, s.Oldest, float64(time.Minute))
					assert.InDelta(t, 3*time.Hour, s.ByErrorType[1].Oldest, float64(time.Minute))
					assert.Less(t, s.ByErrorType[0].Oldest, time.Minute)
				}},
				{name: "dry-run replay", run: func(t *testing.T) {
					res, err := dlq.NewReplayer(fx.conn).DryRun(ctx, fx.queue, dlq.Selector{All: true})
					require.NoError(t, err)
					assert.Equal(t, []string{"m-1", "m-2", "m-3", "m-4"}, replayedIDs(res))
					assert.Equal(t, 0, fx.rabbit.Count(fx.queue), "nothing reached the queue")
				}},
			}
			for _, s := range steps {
				t.Run(s.name, func(t *testing.T) {
					s.run(t)
					fx.waitCount(t, fx.dlq, 4)
					assert.Equal(t, before, fx.peek(t, fx.dlq), "same messages in the same order")
				})
			}
		})
	}
}

func TestInspectorNotFound(t *testing.T) {
	fx := newFixture(t, amqp.QueueClassic)
	fx.deadLetter(t, failure{id: "m-1", err: invalidAmount()})
	fx.waitCount(t, fx.dlq, 1)
	in := dlq.Inspector{Conn: fx.conn}
	ctx := context.Background()
	cases := []struct {
		name string
		run  func() error
		want error
	}{
		{name: "list of a queue without a DLQ", run: func() error { _, err := list(ctx, in, "no.such.queue", 0); return err }, want: sluice.ErrQueueNotFound},
		{name: "stats of a queue without a DLQ", run: func() error { _, err := in.Stats(ctx, "no.such.queue"); return err }, want: sluice.ErrQueueNotFound},
		{name: "show of a queue without a DLQ", run: func() error { _, err := in.Show(ctx, "no.such.queue", "m-1"); return err }, want: sluice.ErrQueueNotFound},
		{name: "show of an unknown id", run: func() error { _, err := in.Show(ctx, fx.queue, "nope"); return err }, want: dlq.ErrMessageNotFound},
		{name: "purge of a queue without a DLQ", run: func() error { _, err := dlq.Purge(ctx, fx.conn, "no.such.queue"); return err }, want: sluice.ErrQueueNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			require.ErrorIs(t, err, tc.want)
		})
	}
	assert.Equal(t, []string{"m-1"}, fx.peek(t, fx.dlq))
}

func TestPurge(t *testing.T) {
	fx := newFixture(t, amqp.QueueClassic)
	for i := range 3 {
		fx.deadLetter(t, failure{id: fmt.Sprintf("m-%d", i), err: invalidAmount()})
	}
	fx.waitCount(t, fx.dlq, 3)
	n, err := dlq.Purge(context.Background(), fx.conn, fx.queue)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	assert.Equal(t, 0, fx.rabbit.Count(fx.dlq))
}

func ids(rs []dlq.Record) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}

func replayedIDs(res dlq.ReplayResult) []string {
	out := make([]string, len(res.Replayed))
	for i, r := range res.Replayed {
		out[i] = r.ID
	}
	return out
}
