package dlq_test

import (
	"context"
	"encoding/json"
	"os"
	"os/user"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/topology"
)

func TestAuditTrail(t *testing.T) {
	fx := newFixture(t, queueTypes[0])
	archive := topology.Archive(fx.queue)
	t.Cleanup(func() { fx.rabbit.DeleteQueues(archive) })
	for _, id := range []string{"p1", "p2", "p3", "p4", "p5", "p6"} {
		err := invalidAmount()
		if id == "p3" || id == "p4" {
			err = gatewayDown()
		}
		fx.deadLetter(t, failure{id: id, err: err})
	}
	o := auditedOperator(t, fx, "carol@ops")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Each kind of action once, and one that fails.
	_, err := o.Replay(ctx, fx.queue, dlq.Selector{IDs: []string{"p1"}}, dlq.Options{})
	require.NoError(t, err)
	_, err = o.Archive(ctx, fx.queue, dlq.Selector{ErrorType: "gateway_down"}, dlq.Options{})
	require.NoError(t, err)
	_, err = o.Edit(ctx, fx.queue, dlq.Edit{ID: "p2", Payload: []byte(`{"id":"p2","amount":1}`)}, dlq.Options{})
	require.NoError(t, err)
	_, err = o.Replay(ctx, fx.queue, dlq.Selector{IDs: []string{"nope"}}, dlq.Options{})
	require.ErrorIs(t, err, dlq.ErrMessageNotFound)
	_, err = o.Purge(ctx, fx.queue, dlq.Selector{IDs: []string{"p5"}}, dlq.Options{})
	require.NoError(t, err)
	_, err = o.Replay(ctx, fx.queue, dlq.Selector{All: true}, dlq.Options{DryRun: true})
	require.NoError(t, err)
	_, err = o.Purge(ctx, fx.queue, dlq.Selector{All: true}, dlq.Options{From: dlq.FromArchive})
	require.NoError(t, err)

	events, err := dlq.ReadAudit(ctx, fx.conn, dlq.AuditQuery{Exchange: o.AuditExchange})
	require.NoError(t, err)
	type row struct {
		Action, Source, Selector, Result string
		Count                            int
		IDs                              []string
	}
	var got []row
	for _, ev := range events {
		got = append(got, row{ev.Action, ev.Source, ev.Selector, ev.Result, ev.Count, ev.IDs})
		assert.Equal(t, "carol@ops", ev.Actor)
		assert.Equal(t, fx.queue, ev.Queue)
		require.NotNil(t, ev.Ended, "every action recorded its outcome")
		assert.False(t, ev.Ended.Before(ev.At))
	}
	assert.Equal(t, []row{
		{"replay", fx.dlq, "--id p1", "ok", 1, []string{"p1"}},
		{"archive", fx.dlq, "--error-type gateway_down", "ok", 2, []string{"p3", "p4"}},
		{"edit", fx.dlq, "--id p2", "ok", 1, []string{"p2"}},
		{"replay", fx.dlq, "--id nope", "failed", 0, nil},
		{"purge", fx.dlq, "--id p5", "ok", 1, []string{"p5"}},
		// The dry run is not an action: not recorded.
		{"purge", archive, "--all", "ok", 3, nil},
	}, got)
	assert.Contains(t, events[3].Error, "message not found")

	// On the wire: a "started" record confirmed before each action, then its outcome.
	assert.Equal(t, 12, fx.rabbit.Count(o.AuditExchange))

	// Filters.
	mine, err := dlq.ReadAudit(ctx, fx.conn, dlq.AuditQuery{Exchange: o.AuditExchange, Queue: "other"})
	require.NoError(t, err)
	assert.Empty(t, mine)
	later, err := dlq.ReadAudit(ctx, fx.conn, dlq.AuditQuery{Exchange: o.AuditExchange, Since: time.Now().Add(time.Minute)})
	require.NoError(t, err)
	assert.Empty(t, later)
	assert.Equal(t, 12, fx.rabbit.Count(o.AuditExchange), "reading leaves the trail as it was")
}

func TestAuditDefaultsAndActor(t *testing.T) {
	fx := newFixture(t, queueTypes[0])
	fx.deadLetter(t, failure{id: "d1", err: invalidAmount()})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	since := time.Now().Add(-time.Second)
	_, err := dlq.Operator{Conn: fx.conn}.Purge(ctx, fx.queue, dlq.Selector{IDs: []string{"d1"}}, dlq.Options{})
	require.NoError(t, err)

	// The shared trail sluice.audit, bounded as documented, names the OS user and host.
	events, err := dlq.ReadAudit(ctx, fx.conn, dlq.AuditQuery{Queue: fx.queue, Since: since})
	require.NoError(t, err)
	require.Len(t, events, 1)
	assert.Equal(t, osActor(t), events[0].Actor)
	ch, err := fx.rabbit.Conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	q, err := ch.QueueDeclare(topology.Audit, true, false, false, false, amqp091.Table{
		"x-max-length": int64(100_000), "x-message-ttl": (90 * 24 * time.Hour).Milliseconds()})
	require.NoError(t, err, "sluice.audit is declared with the documented bounds")
	assert.Positive(t, q.Messages)
}

// An audit trail that refuses records stops every action before it changes anything.
func TestAuditUnwritableStopsActions(t *testing.T) {
	fx := newFixture(t, queueTypes[0])
	for _, id := range []string{"u1", "u2"} {
		fx.deadLetter(t, failure{id: id, err: invalidAmount()})
	}
	o := auditedOperator(t, fx, "dave@ops")
	// A full bounded queue that rejects publishes, as an operator might misconfigure it.
	ch, err := fx.rabbit.Conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(o.AuditExchange, true, false, false, false, amqp091.Table{"x-max-length": int64(0), "x-overflow": "reject-publish"})
	require.NoError(t, err)
	require.NoError(t, ch.Close())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	actions := map[string]func() error{
		"replay": func() error {
			_, err := o.Replay(ctx, fx.queue, dlq.Selector{IDs: []string{"u1"}}, dlq.Options{})
			return err
		},
		"archive": func() error {
			_, err := o.Archive(ctx, fx.queue, dlq.Selector{All: true}, dlq.Options{})
			return err
		},
		"purge": func() error {
			_, err := o.Purge(ctx, fx.queue, dlq.Selector{All: true}, dlq.Options{})
			return err
		},
		"edit": func() error {
			_, err := o.Edit(ctx, fx.queue, dlq.Edit{ID: "u2", Payload: []byte(`{}`)}, dlq.Options{})
			return err
		},
		"replay-unrouted": func() error {
			_, err := o.ReplayUnrouted(ctx, dlq.UnroutedSelector{Exchange: "none"}, false)
			return err
		},
	}
	for name, act := range actions {
		t.Run(name, func(t *testing.T) {
			err := act()
			require.ErrorIs(t, err, dlq.ErrAuditUnavailable)
			assert.Contains(t, err.Error(), "not started")
			assert.Contains(t, err.Error(), "RabbitMQ refused the record")
			assert.Equal(t, []string{"u1", "u2"}, fx.peek(t, fx.dlq), "nothing changed")
			assert.Zero(t, fx.rabbit.Count(fx.queue))
		})
	}
	// A dry run changes nothing, so it needs no record.
	_, err = o.Replay(ctx, fx.queue, dlq.Selector{All: true}, dlq.Options{DryRun: true})
	require.NoError(t, err)
}

// A record nobody can parse is shown, not dropped.
func TestReadAuditForeignRecord(t *testing.T) {
	fx := newFixture(t, queueTypes[0])
	fx.deadLetter(t, failure{id: "f1", err: invalidAmount()})
	o := auditedOperator(t, fx, "erin@ops")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := o.Purge(ctx, fx.queue, dlq.Selector{IDs: []string{"f1"}}, dlq.Options{})
	require.NoError(t, err)
	fx.rabbit.Publish(o.AuditExchange, amqp091.Publishing{MessageId: "junk", Body: []byte("hello")})
	events, err := dlq.ReadAudit(ctx, fx.conn, dlq.AuditQuery{Exchange: o.AuditExchange})
	require.NoError(t, err)
	require.Len(t, events, 2)
	assert.Equal(t, "unknown", events[1].Action)
	assert.Contains(t, events[1].Error, "not an audit record")
	raw, err := json.Marshal(events[0])
	require.NoError(t, err)
	assert.Contains(t, string(raw), `"actor":"erin@ops"`)
}

// osActor is the actor the audit trail names when the Operator sets none: the OS user and
// host name ("alice@host").
func osActor(t *testing.T) string {
	t.Helper()
	u, err := user.Current()
	require.NoError(t, err)
	host, err := os.Hostname()
	require.NoError(t, err)
	return u.Username + "@" + host
}
