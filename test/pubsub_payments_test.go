package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/dlqwire"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/demo/paymentsim"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// The payment service subscribed to an exchange (PAYMENTS_EXCHANGE, default binding key
// payment.requested), driven by a plain amqp091 producer publishing to that exchange, with
// its success events read from its output exchange (PAYMENTS_OUTPUT_EXCHANGE, routing key
// payment.succeeded). A retried payment's attempts stay in the service's queue; an event
// with another key does not reach it and is kept in sluice.unrouted.
func TestPaymentsServiceSubscribedToAnExchange(t *testing.T) {
	r := testenv.NewRabbit(t)
	queue, output := testenv.Name("e2e.sub.payments.requested"), testenv.Name("e2e.sub.payments.succeeded")
	requests, events := testenv.Name("e2e.sub.orders"), testenv.Name("e2e.sub.payments")
	r.DeleteQueues(queue, topology.DLQ(queue), output, topology.DLQ(output))
	deleteExchangesAfter(t, r.URL, requests, events)
	env := append(fastPaymentsEnv(r.URL, queue, output), "PAYMENTS_EXCHANGE="+requests, "PAYMENTS_OUTPUT_EXCHANGE="+events)
	startPayments(t, env)

	// The service declares its exchanges at start; then the test subscribes to the
	// success events, as another service would, with a queue of its own.
	ch, err := r.Conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	require.Eventually(t, func() bool {
		probe, err := r.Conn.Channel()
		if err != nil {
			return false
		}
		defer probe.Close()
		return probe.ExchangeDeclarePassive(events, amqp091.ExchangeTopic, true, false, false, false, nil) == nil
	}, 60*time.Second, 50*time.Millisecond, "the service declares its output exchange")
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q.Name, "payment.succeeded", events, false, nil))
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	require.NoError(t, err)
	var mu sync.Mutex
	got := map[string][]example_payment.Succeeded{}
	keys := map[string]bool{}
	go func() {
		for d := range deliveries {
			var ev example_payment.Succeeded
			if json.Unmarshal(d.Body, &ev) != nil {
				continue
			}
			mu.Lock()
			got[ev.PaymentID] = append(got[ev.PaymentID], ev)
			keys[d.Exchange+" "+d.RoutingKey] = true
			mu.Unlock()
		}
	}()

	run := fmt.Sprintf("%d", time.Now().UnixNano()%1e9)
	id := func(s string) string { return "pay_" + run + "_" + s }
	pch, err := r.Conn.Channel()
	require.NoError(t, err)
	defer pch.Close()
	require.NoError(t, pch.Confirm(false))
	publish := func(msgID, key string, body []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		dc, err := pch.PublishWithDeferredConfirmWithContext(ctx, requests, key, true, false,
			amqp091.Publishing{MessageId: msgID, ContentType: "application/json", DeliveryMode: amqp091.Persistent, Body: body})
		require.NoError(t, err)
		ok, err := dc.WaitContext(ctx)
		require.NoError(t, err)
		require.True(t, ok)
	}
	publish("m-visa-"+run, "payment.requested", paymentBody(id("visa"), "tok_visa"))
	publish("m-flaky-"+run, "payment.requested", paymentBody(id("flaky"), paymentsim.FlakyToken(2)))
	publish("m-declined-"+run, "payment.requested", paymentBody(id("declined"), paymentsim.TokenInsufficientFunds))
	publish("m-refund-"+run, "payment.refunded", paymentBody(id("refund"), "tok_visa"))

	want := map[string]int{id("visa"): 1, id("flaky"): 3}
	count := func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]int{}
		for pid, evs := range got {
			for _, ev := range evs {
				out[pid] = ev.Attempts
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return assert.ObjectsAreEqual(want, count()) }, 60*time.Second, 50*time.Millisecond, "success events on %s", events)
	require.Eventually(t, func() bool { return r.Count(topology.DLQ(queue)) == 1 }, 30*time.Second, 50*time.Millisecond, "the declined payment is dead-lettered")
	time.Sleep(500 * time.Millisecond) // a second event for a payment would show now
	mu.Lock()
	assert.Len(t, got[id("visa")], 1)
	assert.Len(t, got[id("flaky")], 1)
	assert.Equal(t, map[string]bool{events + " payment.succeeded": true}, keys)
	mu.Unlock()
	assert.Equal(t, -1, r.Count(output), "success events go to the exchange, no output queue is declared")
	assert.Equal(t, 0, r.Count(queue))

	testenv.LockUnrouted(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := dlq.ListUnrouted(ctx, r.Conn, dlq.UnroutedSelector{Exchange: requests}, 0)
	require.NoError(t, err)
	require.Len(t, l.Events, 1, "the refund nobody subscribed to is kept")
	assert.Equal(t, "payment.refunded", l.Events[0].RoutingKey)
	// Take it out of the queue every test of the vhost shares.
	dropUnrouted(t, r, l.Events[0].ID)
}

// dropUnrouted removes this test's event from the shared sluice.unrouted.
func dropUnrouted(t *testing.T, r *testenv.Rabbit, id string) {
	t.Helper()
	ch, err := r.Conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	for {
		d, ok, err := ch.Get(topology.UnroutedQueue, false)
		require.NoError(t, err)
		if !ok {
			return
		}
		if dlqwire.MessageID(d) == id {
			require.NoError(t, d.Ack(false))
		}
	}
}

// The demo (what `make run` runs) with the service subscribed to an exchange and its
// success events on an output exchange, on the embedded broker: every request settles as
// its mix says.
func TestPaymentsDemoOnExchanges(t *testing.T) {
	bin := testenv.Binary(t, "./cmd/payments")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "demo", "-n", "80", "-seed", "7")
	cmd.Env = append(fastPaymentsEnv("", "payments.requested", "payments.succeeded"),
		"PAYMENTS_EXCHANGE=orders", "PAYMENTS_OUTPUT_EXCHANGE=payments")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "demo failed:\n%s", out)
	assert.Contains(t, string(out), "every request settled as the contract says")
	assert.NotContains(t, string(out), "mismatch")
}
