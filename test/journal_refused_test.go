package test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/router"
)

// RabbitMQ refuses the journal's appends under a running stack: its stream is replaced by a
// queue of the same name that takes nothing (x-max-length 0, x-overflow reject-publish),
// so every append is nacked, as a full or unavailable destination would. A payment arriving
// meanwhile is charged, but its message is not acknowledged as done: it is deferred and
// comes back, and while the journal refuses it is never acknowledged as a duplicate either.
// The failure is logged and counted. Once the queue is gone the journal declares its
// stream again (logged and counted too); the record is journaled, the message that came
// back is absorbed as a duplicate and acknowledged, and the payment was charged once.
// A Guard started afterwards restores the key: the record is on the journal, not only in
// the memory of the instance that charged it. (Replacing the stream loses the records
// before it, as deleting it does: the first payment's key is then known only in memory.)
func TestJournalRefused_NackedAppendsDeferUntilJournalBack(t *testing.T) {
	e := rabbitEnv(t)
	r := e.rabbit
	queue := testenv.Name("journal.refused")
	journal := topology.IdempotencyJournal(queue)
	r.DeleteQueues(queue, topology.DLQ(queue), journal)

	var logs testenv.SyncBuffer
	var (
		mu       sync.Mutex
		charged  = map[string]int{}
		absorbed = map[string]int{}
	)
	g, err := idempotency.New(idempotency.Config{
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		OnDuplicate: func(_ *message.Message, key string) {
			mu.Lock()
			absorbed[key]++
			mu.Unlock()
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, g.Close()) })
	count := func(m map[string]int, key string) int {
		mu.Lock()
		defer mu.Unlock()
		return m[key]
	}
	start(t, e, router.Config{Guard: g}, func(s *router.Stack) {
		require.NoError(t, s.Handle("charge", queue, func(m *message.Message) error {
			mu.Lock()
			charged[m.Metadata.Get(sluice.HeaderIdempotencyKey)]++
			mu.Unlock()
			return nil
		}))
	})
	pay := func(id, key string) {
		msg := message.NewMessage(id, paymentBody(key, "tok_visa"))
		msg.Metadata.Set(sluice.HeaderIdempotencyKey, key)
		e.publish(t, queue, msg)
	}
	run := testenv.Name("r")

	// Before: the journal confirms, the payment is acknowledged.
	before := "pay_before_" + run
	pay("m-before", before)
	require.Eventually(t, func() bool { return g.Stats().Journal.Appended >= 1 && r.Count(queue) == 0 },
		30*time.Second, 20*time.Millisecond, "the first payment journaled")

	refuseJournal(t, r, journal)
	failuresBefore := g.Stats().Journal.Failures

	refused := "pay_refused_" + run
	pay("m-refused", refused)
	require.Eventually(t, func() bool { return count(charged, refused) == 1 }, 30*time.Second, 20*time.Millisecond, "charged")
	require.Eventually(t, func() bool { return g.Stats().Journal.Failures > failuresBefore+1 }, 30*time.Second, 20*time.Millisecond,
		"the nacked appends counted (and retried)")
	// The message comes back at least once while refused (the deferral is a second) and
	// is deferred again each time, never acknowledged on a key that is not journaled.
	time.Sleep(3 * time.Second)
	st := g.Stats().Journal
	assert.Equal(t, 1, count(charged, refused), "charged once while the journal refuses")
	assert.Zero(t, count(absorbed, refused), "not acknowledged as a duplicate while its record is not journaled")
	assert.GreaterOrEqual(t, st.Unconfirmed, 1, "the key is done here but not journaled")
	assert.Contains(t, logs.String(), "journal record not confirmed", "the failure is logged")
	t.Logf("while refused: %d failed appends, %d unconfirmed keys", st.Failures-failuresBefore, st.Unconfirmed)

	// The journal is back: the refusing queue is deleted, the stream declared again.
	deleteQueue(t, r, journal)
	require.Eventually(t, func() bool { return count(absorbed, refused) >= 1 }, 30*time.Second, 20*time.Millisecond,
		"the deferred message came back and was absorbed once its record was journaled")
	require.Eventually(t, func() bool { return r.Count(queue) == 0 && g.Stats().Journal.Unconfirmed == 0 },
		30*time.Second, 20*time.Millisecond, "everything acknowledged and journaled")
	time.Sleep(time.Second) // a message deferred again would show by now
	assert.Zero(t, r.Count(queue), "nothing came back")
	assert.LessOrEqual(t, r.Count(topology.DLQ(queue)), 0, "nothing dead lettered")
	assert.Equal(t, 1, count(charged, refused), "charged once across the refusal")
	assert.Equal(t, 1, count(charged, before))
	assert.Positive(t, e.amqp.JournalsRecreated(), "the stream declared again is counted")

	// The record is on the journal: a new instance restores the key.
	later, err := idempotency.New(idempotency.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, later.Close()) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = later.Journaled(ctx, e.amqp, journal, nil)
	require.NoError(t, err)
	// The first payment's record went with the stream this test deleted; the refused one
	// was journaled into the stream declared again, once or twice: the committer's retry of
	// unconfirmed records and the redelivered message can both append it at the same
	// moment (two records of one key are harmless).
	if restored := later.Stats().Journal.Restored; !assert.True(t, restored == 1 || restored == 2,
		"a new instance restores the key journaled after the refusal (%d records)", restored) {
		t.Logf("both instances' logs:\n%s", logs.String())
	}
}

// refuseJournal replaces the journal stream by a queue RabbitMQ publishes nothing to: its
// appends are nacked. The running journal's follower may declare the stream again between
// the delete and the declare (it is consuming it); then both are done again.
func refuseJournal(t *testing.T, r *testenv.Rabbit, journal string) {
	t.Helper()
	require.Eventually(t, func() bool {
		conn, err := amqp091.Dial(r.URL)
		if err != nil {
			return false
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return false
		}
		defer ch.Close()
		if _, err := ch.QueueDelete(journal, false, false, false); err != nil {
			return false
		}
		_, err = ch.QueueDeclare(journal, true, false, false, false, amqp091.Table{
			"x-queue-type": "classic", "x-max-length": int64(0), "x-overflow": "reject-publish",
		})
		var ae *amqp091.Error
		if errors.As(err, &ae) {
			t.Logf("declaring the refusing queue: %v; again", ae)
		}
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "the journal %s replaced by a queue refusing every publish", journal)
	// Prove the broker refuses: a confirmed publish to it is nacked.
	conn, err := amqp091.Dial(r.URL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	dc, err := ch.PublishWithDeferredConfirm("", journal, false, false, amqp091.Publishing{Body: []byte("probe")})
	require.NoError(t, err)
	ok, err := dc.WaitContext(context.Background())
	require.NoError(t, err)
	require.False(t, ok, "RabbitMQ %s nacks a publish to %s", testenv.Version(), journal)
}

func deleteQueue(t *testing.T, r *testenv.Rabbit, queue string) {
	t.Helper()
	conn, err := amqp091.Dial(r.URL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.QueueDelete(queue, false, false, false)
	require.NoError(t, err)
}
