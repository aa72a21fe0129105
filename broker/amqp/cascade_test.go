package amqp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
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
	require.NoError(t, b.DeclareCascade(ctx))
	assert.Equal(t, 93, cascadeQueues(t, vhost), "the whole cascade, up to %s", amqp.MaxDelay)
	t.Logf("RabbitMQ %s: delay queues per vhost: 0 without delays, 15/30/45 for delays up to 150 ms/2.55 s/40.95 s, 93 for the whole cascade", testenv.Version())
}
