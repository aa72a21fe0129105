package dlq_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/topology"
)

// TestCompensatedDeadLetters: a dead letter whose compensation event was published is
// named so by its record; a replay or an edit of it is refused with ErrCompensated (it
// stays in its place, the rest of a selection moves) until Options.Compensated confirms
// it, and the audit trail records the confirmation and how many such messages moved.
func TestCompensatedDeadLetters(t *testing.T) {
	for _, qt := range queueTypes {
		t.Run(string(qt), func(t *testing.T) {
			fx := newFixture(t, qt)
			archive := topology.Archive(fx.queue)
			t.Cleanup(func() { fx.rabbit.DeleteQueues(archive) })
			fx.deadLetter(t, failure{id: "pay-a", err: invalidAmount()})
			fx.deadLetter(t, failure{id: "pay-b", err: invalidAmount(), record: map[string]string{
				headers.CompensationID: "ev-b", headers.CompensationTo: "queue orders.cancel"}})
			fx.deadLetter(t, failure{id: "pay-c", err: invalidAmount(), record: map[string]string{
				headers.CompensationError: "no order id"}})
			o := auditedOperator(t, fx, "alice@ops")
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()

			t.Run("the record names the compensation", func(t *testing.T) {
				tests := []struct {
					id, wantID, wantTo, wantErr string
				}{
					{id: "pay-a"},
					{id: "pay-b", wantID: "ev-b", wantTo: "queue orders.cancel"},
					{id: "pay-c", wantErr: "no order id"},
				}
				for _, tt := range tests {
					recs, err := dlq.Inspector{Conn: fx.conn}.Show(ctx, fx.queue, tt.id)
					require.NoError(t, err)
					assert.Equal(t, tt.wantID, recs[0].CompensationID, tt.id)
					assert.Equal(t, tt.wantTo, recs[0].CompensationTo, tt.id)
					assert.Equal(t, tt.wantErr, recs[0].CompensationError, tt.id)
				}
			})

			refusals := []struct {
				name   string
				act    func() (dlq.Result, error)
				moved  int
				failed []string
			}{
				{"replay by id", func() (dlq.Result, error) {
					return o.Replay(ctx, fx.queue, dlq.Selector{IDs: []string{"pay-b"}}, dlq.Options{})
				}, 0, []string{"pay-b"}},
				{"edit", func() (dlq.Result, error) {
					res, err := o.Edit(ctx, fx.queue, dlq.Edit{ID: "pay-b", Payload: []byte(`{"id":"pay-b","amount":1}`)}, dlq.Options{})
					return res.Result, err
				}, 0, nil},
				{"dry run of everything", func() (dlq.Result, error) {
					return o.Replay(ctx, fx.queue, dlq.Selector{All: true}, dlq.Options{DryRun: true})
				}, 2, []string{"pay-b"}},
			}
			for _, tc := range refusals {
				t.Run("refused: "+tc.name, func(t *testing.T) {
					res, err := tc.act()
					require.ErrorIs(t, err, dlq.ErrCompensated)
					assert.Contains(t, err.Error(), `"pay-b"`)
					assert.Contains(t, err.Error(), "ev-b")
					assert.Equal(t, tc.moved, res.Moved)
					var failed []string
					for _, f := range res.Failed {
						failed = append(failed, f.ID)
					}
					assert.Equal(t, tc.failed, failed)
					assert.Equal(t, []string{"pay-a", "pay-b", "pay-c"}, fx.peek(t, fx.dlq), "nothing moved, nothing reordered")
					assert.Zero(t, fx.rabbit.Count(fx.queue))
					assert.LessOrEqual(t, fx.rabbit.Count(archive), 0, "nothing archived (-1: no archive)")
				})
			}

			t.Run("a selection moves all but the compensated", func(t *testing.T) {
				res, err := o.Replay(ctx, fx.queue, dlq.Selector{All: true}, dlq.Options{})
				require.ErrorIs(t, err, dlq.ErrCompensated)
				assert.Equal(t, 3, res.Matched)
				assert.Equal(t, 2, res.Moved)
				assert.Zero(t, res.Compensated)
				assert.Equal(t, []string{"pay-a", "pay-c"}, fx.peek(t, fx.queue))
				assert.Equal(t, []string{"pay-b"}, fx.peek(t, fx.dlq))
				fx.take(t, fx.queue)
			})

			t.Run("confirmed", func(t *testing.T) {
				res, err := o.Replay(ctx, fx.queue, dlq.Selector{IDs: []string{"pay-b"}}, dlq.Options{Compensated: true})
				require.NoError(t, err)
				assert.Equal(t, 1, res.Moved)
				assert.Equal(t, 1, res.Compensated)
				assert.Empty(t, res.Failed)
				assert.Equal(t, []string{"pay-b"}, fx.peek(t, fx.queue))
				assert.Zero(t, fx.rabbit.Count(fx.dlq))
			})

			t.Run("the audit trail records the confirmation", func(t *testing.T) {
				events, err := dlq.ReadAudit(ctx, fx.conn, dlq.AuditQuery{Exchange: o.AuditExchange})
				require.NoError(t, err)
				type row struct {
					Action, Selector, Result string
					Count, Compensated       int
					Confirmed                bool
				}
				var got []row
				for _, ev := range events {
					got = append(got, row{ev.Action, ev.Selector, ev.Result, ev.Count, ev.Compensated, ev.ConfirmedCompensated})
				}
				assert.Equal(t, []row{
					{Action: "replay", Selector: "--id pay-b", Result: "failed"},
					{Action: "edit", Selector: "--id pay-b", Result: "failed"},
					// The dry run is not an action: not recorded.
					{Action: "replay", Selector: "--all", Result: "failed", Count: 2},
					{Action: "replay", Selector: "--id pay-b", Result: "ok", Count: 1, Compensated: 1, Confirmed: true},
				}, got)
				assert.Contains(t, events[0].Error, "compensation")
			})
		})
	}
}
