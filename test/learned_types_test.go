package test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/retrystats"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// TestLearnedRetryBoundedTypes is issue 36's point 6 on bounded memory, on RabbitMQ: a
// stack with the learned policy whose handler fails 10,000 messages with 10,000 distinct
// error types tracks MaxTypes of them and counts the rest together as _OTHER; every
// message is counted once and dead-lettered once.
func TestLearnedRetryBoundedTypes(t *testing.T) {
	const (
		messages = 10_000
		maxTypes = 8
	)
	e := rabbitEnv(t)
	queue := e.newQueue(t, "learned.types")
	t.Cleanup(func() { e.rabbit.DeleteQueues(queue, topology.DLQ(queue)) }) // after the stack stops
	stats, err := retrystats.New(retrystats.Config{MaxTypes: maxTypes})
	require.NoError(t, err)
	start(t, e, router.Config{Retry: retry.Config{
		MaxRetries: -1, // the first failure is final: one delivery and one dead letter each
		Stats:      stats, Learned: &retry.Learned{},
	}}, func(s *router.Stack) {
		require.NoError(t, s.Handle("charge", queue, func(m *message.Message) error {
			return learnedError{"type-" + string(m.Payload)}
		}, router.WithConcurrency(8), router.WithPrefetch(64)))
	})

	// One confirmed channel, the confirms awaited together: 10,000 one at a time would
	// take the test's time, not sluice's.
	conn, err := amqp091.Dial(e.rabbit.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	confirms := make([]*amqp091.DeferredConfirmation, 0, messages)
	for i := range messages {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp091.Publishing{
			MessageId: fmt.Sprintf("m-%05d", i), Body: fmt.Appendf(nil, "%d", i), DeliveryMode: amqp091.Persistent,
		})
		require.NoError(t, err)
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		ok, err := dc.WaitContext(ctx)
		require.NoError(t, err)
		require.True(t, ok, "RabbitMQ confirmed the test's publish")
	}

	dlqName := topology.DLQ(queue)
	require.Eventually(t, func() bool { return e.count(t, dlqName) == messages && e.count(t, queue) == 0 },
		3*time.Minute, 100*time.Millisecond, "all %d dead-lettered", messages)
	// The retry step counts a message once its dead letter is confirmed, so the last few
	// can be in the DLQ a moment before they are counted.
	counted := func() (n int64) {
		for _, ts := range stats.Snapshot() {
			n += ts.Messages
		}
		return n
	}
	require.Eventually(t, func() bool { return counted() >= messages }, 30*time.Second, 10*time.Millisecond,
		"all %d counted", messages)

	snap := stats.Snapshot()
	require.Len(t, snap, maxTypes+1, "%d types tracked and _OTHER", maxTypes)
	var total, other int64
	for _, ts := range snap {
		assert.Equal(t, "charge", ts.Handler)
		total += ts.Messages
		if ts.ErrorType == retrystats.OtherType {
			other = ts.Messages
		}
	}
	assert.EqualValues(t, messages, total, "every message counted once")
	assert.EqualValues(t, messages-maxTypes, other, "the untracked types counted together")
	assert.Equal(t, stats.Type("charge", retrystats.OtherType).Messages, stats.Type("charge", "type-9999").Messages,
		"an untracked type reads _OTHER")
}
