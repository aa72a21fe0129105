//go:build faults

package faults

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/router"
)

// testQueueDeletedUnderConsumer is scenario 7: the consumed queue is deleted while its
// consumer runs (RabbitMQ cancels the consumer). No empty message reaches the handler; the
// stack reports the deletion at error level, declares the queue again, and consumes what is
// published afterwards. What the queue held when it was deleted is gone with it: that is the
// operator's deletion, not a loss by sluice, and the ledger counts it apart.
func testQueueDeletedUnderConsumer(t *testing.T, node *testenv.Node) {
	rabbit := node.Rabbit(t)
	base := takeBaseline(t, node)

	var logs testenv.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	l := newLedger()
	queue := testenv.Name("faults.deleted")
	st := startStack(t, amqp.Config{URLs: []string{node.URL()}, Logger: log},
		router.Config{Retry: retryConfig(), Concurrency: 2, Prefetch: 8},
		workload(l, queue, 20*time.Millisecond))

	before := make([]string, 200)
	for i := range before {
		before[i] = fmt.Sprintf("del-before-%04d", i)
	}
	publishAll(l, st.broker.Publisher(), queue, before, 20, 2, 30*time.Second)
	require.Eventually(t, func() bool { return l.count(func(r *record) bool { return r.effects > 0 }) >= 20 }, 30*time.Second, 20*time.Millisecond)

	ch, err := rabbit.Conn.Channel()
	require.NoError(t, err)
	purged, err := ch.QueueDelete(queue, false, false, false)
	require.NoError(t, err)
	_ = ch.Close()
	deleted := time.Now()
	t.Logf("deleted queue %s holding %d messages", queue, purged)

	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "queue deleted under its consumer; declared it again")
	}, 30*time.Second, 50*time.Millisecond, "the deletion is reported and the queue declared again")
	require.Eventually(t, func() bool { return rabbit.Count(queue) >= 0 }, 30*time.Second, 50*time.Millisecond, "the queue exists again")
	redeclared := time.Since(deleted)

	// What was still queued at the deletion went with the queue.
	l.mu.Lock()
	gone := 0
	for _, id := range before {
		if r := l.m[id]; r.place == "" {
			r.place = "deleted"
			gone++
		}
	}
	l.mu.Unlock()

	after := make([]string, 50)
	for i := range after {
		after[i] = idFor("del-after-", i)
	}
	publishAll(l, st.broker.Publisher(), queue, after, 10, 2, 30*time.Second)
	waitSettled(t, l, rabbit, queue, 2*time.Minute)
	st.close()
	s := l.check(t, 1)
	t.Logf("queue deleted: re-declared and consuming %s after the deletion; %d messages went with the queue; %+v", redeclared.Round(time.Millisecond), gone, s)
	assert.Zero(t, l.empty.Load(), "no empty message reached the handler")
	base.verify(t)
}
