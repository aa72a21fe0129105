package amqp_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// freshVhost makes a vhost of its own for t (deleted when t ends) and returns its URL:
// what a new service on an empty vhost sees.
func freshVhost(t *testing.T) (url, vhost string) {
	t.Helper()
	base := testenv.AMQPURL(t)
	vhost = testenv.Name("sluice-cascade")
	testenv.Ctl(t, "add_vhost", vhost)
	t.Cleanup(func() { testenv.Ctl(t, "delete_vhost", vhost) })
	testenv.Ctl(t, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
	return strings.TrimSuffix(base, "/") + "/" + vhost, vhost
}

// cascadeQueues counts the delay cascade's queues in vhost.
func cascadeQueues(t *testing.T, vhost string) int {
	t.Helper()
	n := 0
	for _, line := range strings.Split(testenv.Ctl(t, "-q", "--no-table-headers", "list_queues", "-p", vhost, "name"), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "sluice.delay.") {
			n++
		}
	}
	return n
}

// Issue 34: the cascade's 93 quorum queues (a Raft group each on a cluster) were declared
// on every vhost before a single retry. Now a vhost holds only the digits its delays reach:
// none for a stack that never delays, two digits (30 queues) for delays up to 2.55 s,
// three (45) for up to 40.95 s; the whole cascade only when asked for. A delay beyond what
// is declared still arrives: Delay declares the digits it needs first.
func TestCascadeDeclaresOnlyTheLevelsItsDelaysReach(t *testing.T) {
	url, vhost := freshVhost(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{url}})
	require.NoError(t, err)
	defer b.Close()
	queue := "orders"
	require.NoError(t, b.DeclareQueue(ctx, queue))
	assert.Zero(t, cascadeQueues(t, vhost), "a consumed queue alone declares no delay queue")

	sub := b.Subscriber(broker.SubscribeOptions{})
	defer sub.Close()
	got, err := sub.Subscribe(ctx, queue)
	require.NoError(t, err)
	steps := []struct {
		delay time.Duration
		want  int
	}{
		{100 * time.Millisecond, 15}, // digit 0: up to 150 ms
		{1200 * time.Millisecond, 30},
		{5 * time.Second, 45}, // digit 2: up to 40.95 s
	}
	for _, st := range steps {
		id := fmt.Sprintf("after-%s", st.delay)
		sent := time.Now()
		require.NoError(t, b.Delay(ctx, queue, st.delay, message.NewMessage(id, []byte("x"))))
		assert.Equal(t, st.want, cascadeQueues(t, vhost), "after a delay of %s", st.delay)
		select {
		case m := <-got:
			assert.Equal(t, id, m.UUID)
			assert.GreaterOrEqual(t, time.Since(sent), st.delay, "not before its delay")
			m.Ack()
		case <-time.After(st.delay + 20*time.Second):
			t.Fatalf("the message delayed %s never arrived", st.delay)
		}
	}
	require.NoError(t, b.DeclareDelays(ctx, 30*time.Second))
	assert.Equal(t, 45, cascadeQueues(t, vhost), "a 30 s policy needs nothing more")
	require.NoError(t, b.DeclareDelays(ctx, math.MaxInt64))
	assert.Equal(t, 93, cascadeQueues(t, vhost), "the whole cascade, up to %s", amqp.MaxDelay)
	t.Logf("RabbitMQ %s: delay queues per vhost: 0 without delays, 15/30/45 for delays up to 150 ms/2.55 s/40.95 s, 93 for the whole cascade", testenv.Version())
}

// A cascade an earlier run declared is used at once by a new broker's first delay, and
// declared again in the background all the same, which repairs what was lost meanwhile: a
// binding of a digit the delay passes, deleted by hand, is back without another call.
// (Declaring it in place held every delay of a first burst for some 200 ms on RabbitMQ
// 4.3, each binding a metadata-store write: issue 55.)
func TestCascadeFoundDeclaredIsRepairedInTheBackground(t *testing.T) {
	url, vhost := freshVhost(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, err := amqp.New(ctx, amqp.Config{URLs: []string{url}})
	require.NoError(t, err)
	require.NoError(t, first.DeclareQueue(ctx, "orders"))
	require.NoError(t, first.DeclareDelays(ctx, 5*time.Second))
	require.NoError(t, first.Close())

	// Digit 1's value 5 binding goes (a 3 s delay passes digit 1's value 2 instead).
	conn, err := amqp091.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	const lost = "sluice.delay.d1.05"
	key := strings.Repeat("*.", 18) + "0.1.0.1.#"
	bound := func() bool {
		for _, line := range strings.Split(testenv.Ctl(t, "-q", "--no-table-headers", "list_bindings", "-p", vhost, "destination_name", "routing_key"), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == lost && f[1] == key {
				return true
			}
		}
		return false
	}
	require.True(t, bound(), "digit 1's value 5 is bound with %s", key)
	require.NoError(t, ch.QueueUnbind(lost, key, "sluice.delay.d1", nil))
	require.False(t, bound())

	b, err := amqp.New(ctx, amqp.Config{URLs: []string{url}})
	require.NoError(t, err)
	defer b.Close()
	sub := b.Subscriber(broker.SubscribeOptions{})
	got, err := sub.Subscribe(ctx, "orders")
	require.NoError(t, err)
	sent := time.Now()
	require.NoError(t, b.Delay(ctx, "orders", 3*time.Second, message.NewMessage("late", []byte("x"))))
	require.Eventually(t, bound, 10*time.Second, 20*time.Millisecond, "the background declaration binds %s again", lost)
	select {
	case m := <-got:
		assert.Equal(t, "late", m.UUID)
		assert.GreaterOrEqual(t, time.Since(sent), 3*time.Second)
		m.Ack()
	case <-time.After(30 * time.Second):
		t.Fatal("the delayed message never arrived")
	}
}

// A stack's Run declares the delay routes its retry policy can reach (up to MaxDelay)
// before anything consumes, while the cluster is whole: the first retry of a long delay
// may come during a partition, when a node in the minority accepts the declaration's
// connection but cannot commit it (cluster_not_formed on RabbitMQ 4.3). A delay beyond
// MaxDelay (a handler's RetryAfter) still declares what it needs on its first use.
func TestRunDeclaresTheDelaysItsPolicyReaches(t *testing.T) {
	url, vhost := freshVhost(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{url}})
	require.NoError(t, err)
	defer b.Close()
	s, err := router.New(b, router.Config{Retry: retry.Config{InitialDelay: 100 * time.Millisecond, MaxDelay: 30 * time.Second}})
	require.NoError(t, err)
	require.NoError(t, s.Handle("orders", "orders", func(*message.Message) error { return nil }))
	assert.Zero(t, cascadeQueues(t, vhost), "nothing before Run")
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	select {
	case <-s.Running():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	assert.Equal(t, 45, cascadeQueues(t, vhost), "digits 0-2 (delays up to 40.95 s) for a 30 s MaxDelay, before any retry")
	stop()
	require.NoError(t, <-done)
	require.NoError(t, s.Close())
}
