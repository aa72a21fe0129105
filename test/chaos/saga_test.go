//go:build chaos

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/handlers/example_order"
	"github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/demo/paymentdemo"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

const (
	// sagaRequests is the size of the demo mix the checker publishes as order.created.
	sagaRequests = 1200
	// sagaRetries is the demo's retry limit (RETRY_MAX_RETRIES' default).
	sagaRetries = 5
	// sagaRate is the checker's pace (order.created per second), so faults land mid-flow.
	sagaRate = 100
)

// Issue 54, the order saga's contract: the payments service runs the order side
// (ORDERS=on, its order book in a file), and a checker that is not sluice (amqp091-go)
// publishes the demo's failure mix as order.created and reads the orders' end states from
// orders.outcomes. Every order must end paid or cancelled (its payment's compensation,
// payment.failed), exactly once, never both, through a restart of the broker's node and a
// SIGKILL of the service.
func TestSagaContract(t *testing.T) {
	node := testenv.StartNode(t, testenv.NodeOptions{Name: "sluice_saga"})
	t.Logf("saga node %s on port %d started in %s", node.Name, node.Port, node.StartTime)
	svc := startService(t, node,
		"ORDERS=on", "ORDERS_BOOK="+filepath.Join(t.TempDir(), "orders.jsonl"),
		fmt.Sprintf("RETRY_MAX_RETRIES=%d", sagaRetries),
		"RETRY_INITIAL_DELAY=100ms", "RETRY_MAX_DELAY=1s", "RETRY_JITTER=0.1",
		fmt.Sprintf("PAYMENTS_CONCURRENCY=%d", concurrency),
	)
	obs := &client{url: node.URL()}
	outcomes := func() int { return obs.count(example_order.QueueOutcomes) }
	require.Eventually(t, func() bool { return obs.count(example_order.QueueCreated) >= 0 && outcomes() >= 0 },
		60*time.Second, 100*time.Millisecond, "service declared its queues")

	mix := paymentdemo.Mix(sagaRequests, 20261207)
	ids := make([]string, len(mix))
	for i := range mix {
		ids[i] = fmt.Sprintf("saga-%05d", i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	c := &chaosRun{t: t, ctx: ctx, node: node, svc: svc, obs: obs, to: example_order.QueueCreated, outcomes: outcomes}
	pubDone := c.produce(mix, ids)

	recovery := map[string]time.Duration{}
	c.waitPublished(sagaRequests / 3)
	node.Stop()
	time.Sleep(2 * time.Second)
	require.NoError(t, node.Start())
	recovery["broker restart"] = c.recovered("broker restart")
	c.waitPublished(2 * sagaRequests / 3)
	svc.kill()
	svc.start()
	recovery["SIGKILL of the service"] = c.recovered("SIGKILL of the service")
	require.NoError(t, <-pubDone, "checker's producer")
	settled := sagaSettled(t, c)

	byOrder, deliveries := drainOutcomes(t, obs)
	compensated, deadOrders := drainDeadLetters(t, obs)
	refused := distinctIDs(t, obs, topology.DLQ(example_order.QueueCreated))

	// The orders of the mix: every body that decodes (its duplicates repeat an order).
	type order struct {
		req    paymentdemo.Request
		expect example_order.Status
	}
	orders := map[string]order{}
	malformed := 0
	for _, r := range mix {
		req, err := example_payment.Decode(r.Body)
		if err != nil {
			malformed++ // dead-lettered by the order side: never an order
			continue
		}
		if r.Kind == paymentdemo.KindDuplicate {
			continue
		}
		want := example_order.StatusCancelled
		if r.ExpectWithin(sagaRetries+1).Outcome == paymentdemo.ExpectSucceeded {
			want = example_order.StatusPaid
		}
		orders[req.OrderID] = order{req: r, expect: want}
	}

	var paid, cancelled, shifted, missing, both int
	for id, o := range orders {
		got := byOrder[id]
		switch {
		case len(got) == 0:
			missing++
			t.Errorf("order %s (%s): no outcome", id, o.req.Kind)
			continue
		case len(got) > 1:
			both++
			t.Errorf("order %s (%s): %d outcomes %v", id, o.req.Kind, len(got), got)
			continue
		}
		status := got[0]
		if status == example_order.StatusPaid {
			paid++
		} else {
			cancelled++
			assert.True(t, compensated[id], "order %s cancelled: its payment's dead letter names the compensation", id)
		}
		if status != o.expect {
			// A SIGKILL resets the simulated gateway's attempt counts, and a redelivery
			// advances them: a flaky or rate-limited payment in flight may end the other way.
			if o.req.Kind == paymentdemo.KindFlaky || o.req.Kind == paymentdemo.KindRateLimited {
				shifted++
				continue
			}
			t.Errorf("order %s (%s, %s): %s, want %s", id, o.req.Kind, o.req.Source, status, o.expect)
		}
	}
	for id := range byOrder {
		if _, ok := orders[id]; !ok {
			t.Errorf("outcome for %s, which is no order of the mix", id)
		}
	}
	// A payment whose copies ended differently (a redelivered copy and its retry both
	// advance a flaky token's count) sent both events: the order kept the first.
	paidAndCompensated := 0
	for id := range compensated {
		if got := byOrder[id]; len(got) == 1 && got[0] == example_order.StatusPaid {
			paidAndCompensated++
		}
	}
	distinct := 0
	for _, s := range byOrder {
		distinct += len(s)
	}
	t.Logf("saga: %d order.created (%d orders, %d duplicates, %d malformed) at %d/s; faults: broker restart (recovered in %s), SIGKILL of the service (recovered in %s); settled %s after the start",
		len(mix), len(orders), len(mix)-len(orders)-malformed, malformed, sagaRate,
		recovery["broker restart"].Round(10*time.Millisecond), recovery["SIGKILL of the service"].Round(10*time.Millisecond),
		settled.Sub(start).Round(time.Second))
	t.Logf("saga: paid %d, cancelled %d, flaky orders ended the other way by the faults %d, missing %d, both %d; outcome messages delivered %d for %d distinct ids",
		paid, cancelled, shifted, missing, both, deliveries, distinct)
	t.Logf("saga: payment dead letters of orders %d, naming a compensation for %d orders; paid orders whose payment was also compensated (the first outcome won) %d",
		deadOrders, len(compensated), paidAndCompensated)
	assert.Zero(t, missing, "orders without an end state")
	assert.Zero(t, both, "orders with two end states")
	assert.Equal(t, len(orders), paid+cancelled, "every order paid or cancelled")
	assert.Equal(t, malformed, refused, "every malformed order.created dead-lettered by the order side")
	assert.Positive(t, cancelled, "the mix cancels orders")
	assert.Positive(t, paid, "the mix pays orders")
}

// sagaSettled waits until nothing is left to do: the service's queues and the delay cascade
// empty, and the outcome count unchanged for 8 s (longer than the longest retry delay).
// It returns when the outcomes stopped moving.
func sagaSettled(t *testing.T, c *chaosRun) time.Time {
	t.Helper()
	queues := []string{example_order.QueueCreated, example_payment.QueueRequested, example_payment.QueueSucceeded, example_payment.QueueFailed}
	last, stableSince := -2, time.Now()
	for {
		require.NoError(t, c.ctx.Err(), "the saga did not settle")
		p := c.progress()
		busy := cascadeMessages(t, c.node) != 0
		for _, q := range queues {
			busy = busy || c.obs.count(q) != 0
		}
		if p != last || busy {
			last, stableSince = p, time.Now()
		} else if time.Since(stableSince) > 8*time.Second {
			return stableSince
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// drainOutcomes takes every message of orders.outcomes, as the checker's own client: the
// distinct end states per order (by message id, which a redelivery repeats) and the
// number of messages delivered.
func drainOutcomes(t *testing.T, obs *client) (map[string][]example_order.Status, int) {
	t.Helper()
	ch, err := obs.channel()
	require.NoError(t, err)
	seen := map[string]bool{}
	byOrder := map[string][]example_order.Status{}
	n := 0
	for {
		d, ok, err := ch.Get(example_order.QueueOutcomes, true)
		require.NoError(t, err)
		if !ok {
			break
		}
		n++
		var oc example_order.Outcome
		require.NoError(t, json.Unmarshal(d.Body, &oc), "outcome %s", d.MessageId)
		require.Equal(t, example_order.OutcomeID(oc.OrderID, oc.Status), d.MessageId, "outcome id")
		if seen[d.MessageId] {
			continue
		}
		seen[d.MessageId] = true
		byOrder[oc.OrderID] = append(byOrder[oc.OrderID], oc.Status)
	}
	for _, s := range byOrder {
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	}
	return byOrder, n
}

// drainDeadLetters takes the payment requests' dead letters and returns the orders whose
// dead letter names a compensation (x-compensation-id), and how many dead letters are
// orders' (a dead letter whose ack was lost is published again).
func drainDeadLetters(t *testing.T, obs *client) (map[string]bool, int) {
	t.Helper()
	ch, err := obs.channel()
	require.NoError(t, err)
	compensated := map[string]bool{}
	n := 0
	for {
		d, ok, err := ch.Get(topology.DLQ(example_payment.QueueRequested), true)
		require.NoError(t, err)
		if !ok {
			break
		}
		req, err := example_payment.Decode(d.Body)
		if err != nil {
			continue
		}
		n++
		if id, _ := d.Headers["x-compensation-id"].(string); strings.TrimSpace(id) != "" {
			compensated[req.OrderID] = true
		}
	}
	return compensated, n
}

// distinctIDs takes every message of queue and returns how many distinct message ids they have.
func distinctIDs(t *testing.T, obs *client, queue string) int {
	t.Helper()
	ch, err := obs.channel()
	require.NoError(t, err)
	seen := map[string]bool{}
	for {
		d, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			return len(seen)
		}
		seen[d.MessageId] = true
	}
}
