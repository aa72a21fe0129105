package test

import (
	"fmt"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// With AMQP_SECONDARY_URL, `payments serve` consumes the second cluster (a node of the
// test's own, not clustered with the shared one) beside AMQP_URL: a request published on
// either is settled on its own cluster, and a request on both (what a producer whose
// primary confirm was lost leaves behind) is charged once, since both stacks share the
// idempotency store.
func TestPaymentsServeConsumesBothClusters(t *testing.T) {
	primary := testenv.NewRabbit(t)
	node := testenv.StartNode(t, testenv.NodeOptions{})
	secondary := node.Rabbit(t)
	queue, output := testenv.Name("e2e.secondary.requested"), testenv.Name("e2e.secondary.succeeded")
	primary.DeleteQueues(queue, topology.DLQ(queue), output, topology.DLQ(output))
	startPayments(t, append(fastPaymentsEnv(primary.URL, queue, output), "AMQP_SECONDARY_URL="+node.URL()))
	for _, r := range []*testenv.Rabbit{primary, secondary} {
		waitQueue(t, r, queue)
		waitQueue(t, r, output)
	}
	onPrimary, onSecondary := collectEvents(t, primary, output), collectEvents(t, secondary, output)

	run := fmt.Sprintf("%d", time.Now().UnixNano()%1e9)
	id := func(s string) string { return "pay_" + run + "_" + s }
	publish := func(r *testenv.Rabbit, msgID, paymentID string) {
		r.Publish(queue, amqp091.Publishing{MessageId: msgID + "-" + run, ContentType: "application/json", DeliveryMode: amqp091.Persistent, Body: paymentBody(paymentID, "tok_visa")})
	}
	publish(primary, "m-primary", id("primary"))
	publish(secondary, "m-secondary", id("secondary"))
	publish(primary, "m-both", id("both"))
	publish(secondary, "m-both", id("both"))

	count := func() (p, s map[string]int) {
		p, s = map[string]int{}, map[string]int{}
		for _, a := range onPrimary() {
			p[a.ev.PaymentID]++
		}
		for _, a := range onSecondary() {
			s[a.ev.PaymentID]++
		}
		return p, s
	}
	require.Eventually(t, func() bool {
		p, s := count()
		return p[id("primary")] == 1 && s[id("secondary")] == 1 && p[id("both")]+s[id("both")] == 1
	}, 60*time.Second, 50*time.Millisecond, "success events on each cluster")
	require.Eventually(t, func() bool { return primary.Count(queue) == 0 && secondary.Count(queue) == 0 },
		30*time.Second, 50*time.Millisecond, "both request queues consumed")
	time.Sleep(time.Second) // a second charge of the request on both clusters would show now
	p, s := count()
	require.Equal(t, map[string]int{id("primary"): 1}, without(p, id("both")), "events on the primary")
	require.Equal(t, map[string]int{id("secondary"): 1}, without(s, id("both")), "events on the secondary")
	require.Equal(t, 1, p[id("both")]+s[id("both")], "the request on both clusters charged once")
}

func without(m map[string]int, key string) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		if k != key {
			out[k] = v
		}
	}
	return out
}
