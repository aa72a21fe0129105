package dlq_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/dlqfill"
	"github.com/sluice-go/sluice/internal/topology"
)

// groupCase is one failure group of the mixed DLQ: how many messages, and the error of
// the i-th of them.
type groupCase struct {
	name      string
	errorType string
	count     int
	err       func(i int) error
	// override, when set, rewrites the record of the i-th message the way another sluice
	// version writes it.
	override func(i int) map[string]string
}

// mixedGroups are three error types whose texts differ only in ids and numbers, and two
// panic sites: five groups.
var mixedGroups = []groupCase{
	{name: "invalid", errorType: "invalid_amount", count: 6, err: func(i int) error {
		return sluice.Permanent(typedError{"invalid_amount", fmt.Sprintf("amount must be positive: pay-%d (got -%d.50)", 100+i, i)})
	}},
	{name: "gateway", errorType: "gateway_down", count: 5, err: func(i int) error {
		return typedError{"gateway_down", fmt.Sprintf("gateway: 503 after %dms", 900+i*37)}
	}},
	{name: "order", errorType: "order_missing", count: 4, err: func(i int) error {
		return typedError{"order_missing", "order " + uuid.NewString() + " not found"}
	}},
	{name: "account panic", errorType: "panic", count: 3, err: func(i int) error {
		return recovered(panicAccount, fmt.Sprintf("acct-%d", i))
	}, override: func(i int) map[string]string {
		if i == 0 { // a newer sluice writes only the panic's value as the message
			return map[string]string{sluice.HeaderErrorMessage: "no account for acct-0"}
		}
		return nil
	}},
	{name: "ledger panic", errorType: "panic", count: 2, err: func(i int) error {
		return recovered(panicLedger, fmt.Sprintf("led-%d", i))
	}},
}

// fillMixed dead-letters the messages of mixedGroups interleaved (id "<group>-<i>") and
// returns the ids in DLQ order and each id's group case.
func fillMixed(t *testing.T, fx *fixture) ([]string, map[string]string) {
	t.Helper()
	var fs []dlqfill.Failure
	groupOf := map[string]string{}
	for i := 0; ; i++ {
		added := false
		for _, g := range mixedGroups {
			if i >= g.count {
				continue
			}
			id := fmt.Sprintf("%s-%d", strings.ReplaceAll(g.name, " ", "-"), i)
			f := dlqfill.Failure{ID: id, Handler: "payments", Err: g.err(i), At: time.Now().Add(-time.Duration(i) * time.Minute)}
			if g.override != nil {
				f.Override = g.override(i)
			}
			fs = append(fs, f)
			groupOf[id] = g.name
			added = true
		}
		if !added {
			break
		}
	}
	dlqfill.Fill(t, fx.conn, fx.queue, len(fs), func(i int) dlqfill.Failure { return fs[i] })
	fx.waitCount(t, fx.dlq, len(fs))
	order := make([]string, len(fs))
	for i, f := range fs {
		order[i] = f.ID
	}
	return order, groupOf
}

func TestGroups(t *testing.T) {
	for _, qt := range queueTypes {
		t.Run(string(qt), func(t *testing.T) {
			fx := newFixture(t, qt)
			order, _ := fillMixed(t, fx)
			groups, err := dlq.Inspector{Conn: fx.conn}.Groups(context.Background(), fx.queue)
			require.NoError(t, err)
			require.Len(t, groups, 5, "three error types and two panic sites: %+v", groups)
			for i, g := range mixedGroups {
				got := groups[i] // largest first, and mixedGroups is in that order
				assert.Equal(t, g.errorType, got.ErrorType, "group %d", i)
				assert.Equal(t, g.count, got.Count, "group %s", g.name)
				assert.Equal(t, "payments", got.Handler)
				assert.Len(t, got.ID, 12)
				assert.NotEmpty(t, got.Sample)
				assert.False(t, got.FirstFailedAt.IsZero())
				assert.True(t, !got.LastFailedAt.Before(got.FirstFailedAt))
				if g.count > 1 {
					assert.True(t, got.LastFailedAt.After(got.FirstFailedAt), "group %s spans its failures", g.name)
				}
			}
			assert.Contains(t, groups[3].Fingerprint, "panicAccount")
			assert.Contains(t, groups[4].Fingerprint, "panicLedger")
			assert.Equal(t, "gateway: # after #", groups[1].Fingerprint)

			b, err := json.Marshal(groups)
			require.NoError(t, err)
			var raw []map[string]any
			require.NoError(t, json.Unmarshal(b, &raw))
			for _, k := range []string{"id", "error_type", "count", "first_failed_at", "last_failed_at", "handler", "sample"} {
				assert.Contains(t, raw[0], k)
			}
			assert.Equal(t, order, fx.peek(t, fx.dlq), "grouping read every message and left them in order")
		})
	}
}

func TestOperationsByGroup(t *testing.T) {
	for _, qt := range queueTypes {
		t.Run(string(qt), func(t *testing.T) {
			fx := newFixture(t, qt)
			order, groupOf := fillMixed(t, fx)
			ctx := context.Background()
			groups, err := dlq.Inspector{Conn: fx.conn}.Groups(ctx, fx.queue)
			require.NoError(t, err)
			groupID := map[string]string{}
			for i, g := range mixedGroups {
				groupID[g.name] = groups[i].ID
			}
			left := func(moved ...string) []string {
				return slices.DeleteFunc(slices.Clone(order), func(id string) bool { return slices.Contains(moved, groupOf[id]) })
			}
			idsOf := func(name string) []string {
				return slices.DeleteFunc(slices.Clone(order), func(id string) bool { return groupOf[id] != name })
			}
			op := dlq.Operator{Conn: fx.conn}
			op.BatchSize = 2 // several transactions per group
			var progress []dlq.Progress
			op.Progress = func(p dlq.Progress) { progress = append(progress, p) }

			t.Run("replay a group", func(t *testing.T) {
				res, err := op.Replay(ctx, fx.queue, dlq.Selector{Group: groupID["gateway"]}, dlq.Options{})
				require.NoError(t, err)
				assert.Equal(t, 5, res.Moved)
				assert.Equal(t, 5, res.Matched)
				assert.Equal(t, len(order), res.Scanned)
				got := fx.take(t, fx.queue)
				assert.Equal(t, idsOf("gateway"), deliveryIDs(got))
				for _, d := range got {
					assert.Equal(t, "1", d.Headers[headers.ReplayCount])
					assert.Nil(t, d.Headers[sluice.HeaderErrorType], "failure record removed")
					assert.Nil(t, d.Headers[sluice.HeaderRetryCount], "retry state reset")
					assert.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", d.Headers[headers.TraceParent])
				}
				assert.Equal(t, left("gateway"), fx.peek(t, fx.dlq))
				require.NotEmpty(t, progress)
				last := progress[len(progress)-1]
				assert.True(t, last.Done)
				assert.Equal(t, dlq.Progress{Op: "replay", Queue: fx.dlq, Total: len(order), Scanned: len(order), Matched: 5, Moved: 5, Done: true},
					dlq.Progress{Op: last.Op, Queue: last.Queue, Total: last.Total, Scanned: last.Scanned, Matched: last.Matched, Moved: last.Moved, Done: last.Done})
			})
			t.Run("archive a group", func(t *testing.T) {
				res, err := op.Archive(ctx, fx.queue, dlq.Selector{Group: groupID["account panic"]}, dlq.Options{})
				require.NoError(t, err)
				assert.Equal(t, 3, res.Moved)
				archive := topology.Archive(fx.queue)
				fx.rabbit.DeleteQueues(archive)
				assert.Equal(t, topology.Archive(fx.queue), archive)
				assert.Equal(t, idsOf("account panic"), fx.peek(t, archive))
				assert.Equal(t, left("gateway", "account panic"), fx.peek(t, fx.dlq))
				assertRetention(t, fx, archive, dlq.DefaultRetention)

				in := dlq.Inspector{Conn: fx.conn}
				in.From = dlq.FromArchive
				l, err := list(ctx, in, fx.queue, 0)
				require.NoError(t, err)
				require.Len(t, l.Records, 3)
				assert.Equal(t, "panic", l.Records[0].ErrorType, "the failure record travels with an archived message")
				assert.NotEmpty(t, l.Records[0].Headers[dlq.HeaderArchivedAt])
				ag, err := in.Groups(ctx, fx.queue)
				require.NoError(t, err)
				require.Len(t, ag, 1)
				assert.Equal(t, groupID["account panic"], ag[0].ID, "a group keeps its id in the archive")
			})
			t.Run("replay from the archive to another queue", func(t *testing.T) {
				other := fx.queue + ".fixed"
				fx.rabbit.DeleteQueues(other)
				declarePlain(t, fx, other)
				res, err := op.Replay(ctx, fx.queue, dlq.Selector{Group: groupID["account panic"]}, dlq.Options{From: dlq.FromArchive, To: other})
				require.NoError(t, err)
				assert.Equal(t, 3, res.Moved)
				assert.Equal(t, other, res.Destination)
				got := fx.take(t, other)
				assert.Equal(t, idsOf("account panic"), deliveryIDs(got))
				for _, d := range got {
					assert.Nil(t, d.Headers[dlq.HeaderArchivedAt], "a replay removes the archive stamp")
					assert.Nil(t, d.Headers[sluice.HeaderErrorStack])
				}
				assert.Equal(t, 0, fx.rabbit.Count(topology.Archive(fx.queue)))
			})
			t.Run("replay to a missing queue moves nothing", func(t *testing.T) {
				_, err := op.Replay(ctx, fx.queue, dlq.Selector{All: true}, dlq.Options{To: fx.queue + ".nowhere"})
				require.ErrorIs(t, err, dlq.ErrDestinationNotFound)
				assert.Equal(t, left("gateway", "account panic"), fx.peek(t, fx.dlq))
			})
			t.Run("purge a group", func(t *testing.T) {
				res, err := op.Purge(ctx, fx.queue, dlq.Selector{Group: groupID["invalid"]}, dlq.Options{})
				require.NoError(t, err)
				assert.Equal(t, 6, res.Moved)
				assert.Equal(t, left("gateway", "account panic", "invalid"), fx.peek(t, fx.dlq))
			})
			t.Run("a selector that matches nothing changes nothing", func(t *testing.T) {
				before := fx.peek(t, fx.dlq)
				for _, run := range []func() (dlq.Result, error){
					func() (dlq.Result, error) {
						return op.Replay(ctx, fx.queue, dlq.Selector{Group: "000000000000"}, dlq.Options{})
					},
					func() (dlq.Result, error) {
						return op.Archive(ctx, fx.queue, dlq.Selector{ErrorType: "gateway_down"}, dlq.Options{})
					},
					func() (dlq.Result, error) {
						return op.Purge(ctx, fx.queue, dlq.Selector{Group: groupID["invalid"]}, dlq.Options{})
					},
				} {
					res, err := run()
					require.ErrorIs(t, err, dlq.ErrNothingSelected)
					assert.Equal(t, 0, res.Moved)
					assert.Equal(t, len(before), res.Scanned)
				}
				assert.Equal(t, before, fx.peek(t, fx.dlq))
			})
			t.Run("a dry run changes nothing", func(t *testing.T) {
				before := fx.peek(t, fx.dlq)
				res, err := op.Archive(ctx, fx.queue, dlq.Selector{All: true}, dlq.Options{DryRun: true})
				require.NoError(t, err)
				assert.Equal(t, len(before), res.Moved)
				assert.Equal(t, before, fx.peek(t, fx.dlq))
			})
		})
	}
}

// TestLargeReadsKeepOrder reads and selectively replays a DLQ many windows long, so the
// reader replaces its consumer many times, and checks nothing is dropped or duplicated, and
// nothing reordered in a classic queue (a quorum queue's order after a replay is logged:
// see the package doc).
func TestLargeReadsKeepOrder(t *testing.T) {
	const n = 3000
	for _, qt := range queueTypes {
		t.Run(string(qt), func(t *testing.T) {
			fx := newFixture(t, qt)
			dlqfill.Fill(t, fx.conn, fx.queue, n, func(i int) dlqfill.Failure {
				err := invalidAmount()
				if i%4 == 0 {
					err = gatewayDown()
				}
				return dlqfill.Failure{ID: fmt.Sprintf("m-%05d", i), Handler: "payments", Err: err}
			})
			fx.waitCount(t, fx.dlq, n)
			order := fx.peek(t, fx.dlq)
			require.Len(t, order, n)
			ctx := context.Background()

			in := dlq.Inspector{Conn: fx.conn}
			in.Window = 100
			var seen []string
			total, err := in.Messages(ctx, fx.queue, dlq.Selector{}, func(r dlq.Record) bool {
				seen = append(seen, r.ID)
				return true
			})
			require.NoError(t, err)
			assert.Equal(t, n, total)
			assert.Equal(t, order, seen, "read in order, none dropped")
			assert.Equal(t, order, fx.peek(t, fx.dlq))

			op := dlq.Operator{Conn: fx.conn}
			op.Window, op.BatchSize = 100, 30
			res, err := op.Replay(ctx, fx.queue, dlq.Selector{ErrorType: "gateway_down"}, dlq.Options{})
			require.NoError(t, err)
			assert.Equal(t, n/4, res.Moved)
			var want, rest []string
			for i, id := range order {
				if i%4 == 0 {
					want = append(want, id)
				} else {
					rest = append(rest, id)
				}
			}
			assert.Equal(t, want, deliveryIDs(fx.take(t, fx.queue)))
			left := fx.peek(t, fx.dlq)
			require.Len(t, left, len(rest))
			assert.ElementsMatch(t, rest, left, "every skipped message is back in the DLQ, once")
			for i := range rest {
				if rest[i] == left[i] {
					continue
				}
				msg := fmt.Sprintf("the skipped messages stay in order: first difference at %d: want %s (now at %d), got %s (%v)",
					i, rest[i], slices.Index(left, rest[i]), left[i], left[max(i-3, 0):min(i+10, len(left))])
				if qt == amqp.QueueQuorum {
					// A quorum queue's order after a run is RabbitMQ's: in one full CI
					// run (RabbitMQ 4.3.6, two loaded cores) the first ten skipped
					// messages came back behind later ones; see the package doc.
					t.Log(msg)
					break
				}
				t.Fatal(msg)
			}
		})
	}
}

// TestQuorumDLQReadManyTimes reads a quorum DLQ 30 times: every read returns the messages,
// and RabbitMQ counts each return as a delivery, so a delivery limit would drop them.
func TestQuorumDLQReadManyTimes(t *testing.T) {
	const n, reads = 20, 30
	fx := newFixture(t, amqp.QueueQuorum)
	dlqfill.Fill(t, fx.conn, fx.queue, n, func(i int) dlqfill.Failure {
		return dlqfill.Failure{ID: fmt.Sprintf("m-%02d", i), Handler: "payments", Err: gatewayDown()}
	})
	fx.waitCount(t, fx.dlq, n)
	order := fx.peek(t, fx.dlq)
	in := dlq.Inspector{Conn: fx.conn}
	for i := range reads {
		l, err := list(context.Background(), in, fx.queue, 0)
		require.NoError(t, err)
		require.Equal(t, order, ids(l.Records), "read %d", i+1)
		fx.waitCount(t, fx.dlq, n)
	}
	var counts []any
	for _, d := range fx.peekDeliveries(t, fx.dlq) {
		counts = append(counts, d.Headers["x-delivery-count"])
	}
	assert.Equal(t, slices.Repeat([]any{int64(reads + 1)}, n), counts, "every read counted as a delivery of every message")
	assert.Equal(t, order, fx.peek(t, fx.dlq), "all %d messages kept after %d reads", n, reads)

	t.Run("the DLQ is declared without a reachable delivery limit", func(t *testing.T) {
		declare := func(args amqp091.Table) error {
			c, err := fx.rabbit.Conn.Channel()
			require.NoError(t, err)
			defer c.Close()
			_, err = c.QueueDeclare(fx.dlq, true, false, false, false, args)
			return err
		}
		require.NoError(t, declare(topology.DeadLetterArgs(string(amqp.QueueQuorum), nil)))
		assert.Equal(t, int64(topology.NoDeliveryLimit), topology.DeadLetterArgs(string(amqp.QueueQuorum), nil)["x-delivery-limit"])
		assert.Error(t, declare(amqp091.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(20)}), "a limit of 20 is not what it has")
	})
}

// assertRetention checks the archive's x-message-ttl: a declaration with the same
// arguments is accepted, one with another TTL refused.
func assertRetention(t *testing.T, fx *fixture, archive string, retention time.Duration) {
	t.Helper()
	declare := func(ttl time.Duration) error {
		ch, err := fx.rabbit.Conn.Channel()
		require.NoError(t, err)
		defer ch.Close()
		_, err = ch.QueueDeclare(archive, true, false, false, false, amqp091.Table{"x-queue-type": "classic", "x-message-ttl": ttl.Milliseconds()})
		return err
	}
	assert.NoError(t, declare(retention), "archive declared with x-message-ttl %s", retention)
	assert.Error(t, declare(retention+time.Hour))
}

func declarePlain(t *testing.T, fx *fixture, queue string) {
	t.Helper()
	ch, err := fx.rabbit.Conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
}

func deliveryIDs(ds []amqp091.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = idOf(d)
	}
	return out
}
