package dlq_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/dlq"
)

// TestDuplicateIDs dead-letters two messages with the same id: show names both by
// position, and a replay by id moves both and says so.
func TestDuplicateIDs(t *testing.T) {
	for _, qt := range queueTypes {
		t.Run(string(qt), func(t *testing.T) {
			fx := newFixture(t, qt)
			fx.deadLetter(t, failure{id: "dup", err: gatewayDown(), retries: 1})
			fx.deadLetter(t, failure{id: "other", err: gatewayDown(), retries: 1})
			fx.deadLetter(t, failure{id: "dup", err: invalidAmount()})
			fx.waitCount(t, fx.dlq, 3)
			ctx := context.Background()
			in := dlq.Inspector{Conn: fx.conn}

			all, err := in.Show(ctx, fx.queue, "dup")
			require.NoError(t, err)
			require.Len(t, all, 2)
			assert.Equal(t, 1, all[0].Position)
			assert.Equal(t, "gateway_down", all[0].ErrorType)
			assert.Equal(t, 3, all[1].Position)
			assert.Equal(t, "invalid_amount", all[1].ErrorType)
			assert.Equal(t, []int{3}, all[0].SameID, "each copy says where the other is")
			assert.Equal(t, []int{1}, all[1].SameID)
			b, err := json.Marshal(all[0])
			require.NoError(t, err)
			assert.Contains(t, string(b), `"same_id_positions":[3]`, "show --json says it too")

			one, err := in.Show(ctx, fx.queue, "other")
			require.NoError(t, err)
			require.Len(t, one, 1)
			assert.Empty(t, one[0].SameID)
			b, err = json.Marshal(one[0])
			require.NoError(t, err)
			assert.NotContains(t, string(b), "same_id_positions")
			assert.Equal(t, []string{"dup", "other", "dup"}, fx.peek(t, fx.dlq), "reads leave the DLQ as it was")

			op := dlq.Operator{Conn: fx.conn}
			dry, err := op.Replay(ctx, fx.queue, dlq.Selector{IDs: []string{"dup"}}, dlq.Options{DryRun: true})
			require.NoError(t, err)
			assert.Equal(t, map[string]int{"dup": 2}, dry.MovedByID)

			res, err := op.Replay(ctx, fx.queue, dlq.Selector{IDs: []string{"dup"}}, dlq.Options{})
			require.NoError(t, err)
			assert.Equal(t, 2, res.Moved)
			assert.Equal(t, map[string]int{"dup": 2}, res.MovedByID)
			fx.waitCount(t, fx.queue, 2)
			assert.Equal(t, []string{"other"}, fx.peek(t, fx.dlq))

			all2, err := op.Replay(ctx, fx.queue, dlq.Selector{All: true}, dlq.Options{})
			require.NoError(t, err)
			assert.Nil(t, all2.MovedByID, "only a selection by id counts by id")
		})
	}
}
