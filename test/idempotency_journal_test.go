package test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/idempotency"
)

// journalRun is one payment service scenario's queues and its requests.
type journalRun struct {
	r             *testenv.Rabbit
	queue, output string
	run           string
	events        func() []arrived
}

func newJournalRun(t *testing.T, prefix string) *journalRun {
	r := testenv.NewRabbit(t)
	jr := &journalRun{
		r:      r,
		queue:  testenv.Name(prefix + ".requested"),
		output: testenv.Name(prefix + ".succeeded"),
		run:    fmt.Sprintf("%d", time.Now().UnixNano()%1e9),
	}
	r.DeleteQueues(jr.queue, topology.DLQ(jr.queue), jr.output, topology.DLQ(jr.output), topology.IdempotencyJournal(jr.queue))
	return jr
}

func (jr *journalRun) env(extra ...string) []string {
	return append(fastPaymentsEnv(jr.r.URL, jr.queue, jr.output), extra...)
}

func (jr *journalRun) paymentID(i int) string { return fmt.Sprintf("pay_%s_%03d", jr.run, i) }

// publish sends payment requests for ids, each under a new message id: a client retrying
// after a timeout.
func (jr *journalRun) publish(round string, ids []int) {
	for _, i := range ids {
		jr.r.Publish(jr.queue, amqp091.Publishing{
			MessageId: fmt.Sprintf("%s-%s-%d", round, jr.run, i), ContentType: "application/json",
			DeliveryMode: amqp091.Persistent, Body: paymentBody(jr.paymentID(i), "tok_visa"),
		})
	}
}

// charges counts the success events (one per charge) by payment id.
func (jr *journalRun) charges() map[string]int {
	n := map[string]int{}
	for _, a := range jr.events() {
		n[a.ev.PaymentID]++
	}
	return n
}

func (jr *journalRun) waitCharged(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return len(jr.charges()) >= n }, 90*time.Second, 50*time.Millisecond,
		"%d payments charged (%d so far)", n, len(jr.charges()))
}

// waitSettled waits until the queue holds nothing ready or unacknowledged, then a little
// longer: a duplicate charged again would show as a second event by then.
func (jr *journalRun) waitSettled(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool { return jr.r.Count(jr.queue) == 0 }, 90*time.Second, 50*time.Millisecond, "queue drained")
	time.Sleep(2 * time.Second)
	require.Equal(t, 0, jr.r.Count(jr.queue), "nothing came back to the queue")
}

func (jr *journalRun) chargedTwice() []string {
	var twice []string
	for id, n := range jr.charges() {
		if n > 1 {
			twice = append(twice, fmt.Sprintf("%s×%d", id, n))
		}
	}
	slices.Sort(twice)
	return twice
}

func ids(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// 300 payments are charged, the service is killed with SIGKILL (no Close, no snapshot),
// started again, and the same 300 requests arrive again as new messages: none is charged
// a second time, because the restarted service restored the done keys from the journal
// before consuming. With IDEMPOTENCY_JOURNAL=off, the same run charges all 300 again: the
// control shows the scenario would catch a forgetful store.
func TestIdempotencyJournal_SIGKILLThenDuplicates(t *testing.T) {
	const n = 300
	for _, tc := range []struct {
		name      string
		env       []string
		wantTwice int
	}{
		{"journal on (default)", nil, 0},
		{"journal off", []string{"IDEMPOTENCY_JOURNAL=off"}, n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			jr := newJournalRun(t, "journal.kill")
			first := startPayments(t, jr.env(tc.env...))
			waitQueue(t, jr.r, jr.queue)
			waitQueue(t, jr.r, jr.output)
			jr.events = collectEvents(t, jr.r, jr.output)
			jr.publish("first", ids(n))
			jr.waitCharged(t, n)
			jr.waitSettled(t)

			require.NoError(t, first.cmd.Process.Signal(os.Kill))
			first.exited <- <-first.exited // its cleanup reads it again
			second := startPayments(t, jr.env(tc.env...))
			jr.publish("again", ids(n))
			jr.waitSettled(t)
			twice := jr.chargedTwice()
			assert.Len(t, twice, tc.wantTwice, "payments charged twice after the SIGKILL and restart")
			t.Logf("%s: %d payments, %d charged twice after SIGKILL and restart; %s", tc.name, n, len(twice), restoredLine(second.logs.String()))
		})
	}
}

// Two instances consume one plain queue; the same 300 requests arrive again in another
// order, each duplicate likely on the instance that did not charge it: none is charged
// twice, because each instance follows the other's journal records.
func TestIdempotencyJournal_TwoInstances(t *testing.T) {
	const n = 300
	jr := newJournalRun(t, "journal.two")
	a := startPayments(t, jr.env("PAYMENTS_CONCURRENCY=4"))
	waitQueue(t, jr.r, jr.queue)
	waitQueue(t, jr.r, jr.output)
	b := startPayments(t, jr.env("PAYMENTS_CONCURRENCY=4"))
	jr.events = collectEvents(t, jr.r, jr.output)
	require.Eventually(t, func() bool {
		return strings.Contains(a.logs.String(), "idempotency keys restored from the journal") && strings.Contains(b.logs.String(), "idempotency keys restored from the journal")
	}, 60*time.Second, 50*time.Millisecond, "both instances consuming")

	jr.publish("first", ids(n))
	jr.waitCharged(t, n)
	jr.waitSettled(t)
	reversed := ids(n)
	slices.Reverse(reversed)
	jr.publish("again", reversed)
	jr.waitSettled(t)
	assert.Empty(t, jr.chargedTwice(), "payments charged twice across two instances")
	assert.Len(t, jr.charges(), n)
}

func restoredLine(logs string) string {
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "idempotency keys restored from the journal") {
			return strings.TrimSpace(l)
		}
	}
	return "(no restore logged)"
}

// A broker restart mid-run (a node of the test's own, stopped and started with its data):
// the journal's appends and its follower resume by themselves, the follower from after its
// last offset, and a Guard started after the restart restores every key from before and
// after it.
func TestIdempotencyJournal_BrokerRestart(t *testing.T) {
	testenv.AMQPURL(t)
	node := testenv.StartNode(t, testenv.NodeOptions{})
	ctx := context.Background()
	connect := func() *amqp.Broker {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		b, err := amqp.New(cctx, amqp.Config{URLs: []string{node.URL()}, Logger: testLogger()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	guard := func() *idempotency.Guard {
		g, err := idempotency.New(idempotency.Config{Logger: testLogger()})
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, g.Close()) })
		return g
	}
	name := topology.IdempotencyJournal(testenv.Name("journal.restart"))
	var calls atomic.Int64
	charge := func(*message.Message) ([]*message.Message, error) { calls.Add(1); return nil, nil }
	step := func(g *idempotency.Guard, b *amqp.Broker) message.HandlerFunc {
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		mw, err := g.Journaled(rctx, b, name, nil)
		require.NoError(t, err)
		return mw(charge)
	}
	run := func(h message.HandlerFunc, from, to int) {
		for i := from; i < to; i++ {
			m := message.NewMessage(fmt.Sprintf("m-%d-%d", i, calls.Load()), nil)
			m.Metadata.Set(sluice.HeaderIdempotencyKey, fmt.Sprintf("pay-%d", i))
			_, err := h(m)
			require.NoError(t, err, "key pay-%d", i)
		}
	}

	writer, follower := guard(), guard()
	w := step(writer, connect())
	step(follower, connect())
	run(w, 0, 100)
	require.Eventually(t, func() bool { return follower.Stats().Journal.Applied >= 100 }, 10*time.Second, 10*time.Millisecond)

	node.Stop()
	require.NoError(t, node.Start())
	restartedAt := time.Now()
	run(w, 100, 200) // each waits for the reconnect and its confirm
	t.Logf("RabbitMQ %s: 100 more keys journaled within %s of the node's return (the first waits for the reconnect)", testenv.Version(), time.Since(restartedAt).Round(time.Millisecond))
	require.Eventually(t, func() bool { return follower.Stats().Journal.Applied >= 200 }, 60*time.Second, 20*time.Millisecond,
		"the follower resumed after the restart (applied %d)", follower.Stats().Journal.Applied)
	assert.EqualValues(t, 200, calls.Load())

	later := guard()
	l := step(later, connect())
	assert.EqualValues(t, 200, later.Stats().Journal.Restored, "every key from before and after the restart restored")
	run(l, 0, 200)
	assert.EqualValues(t, 200, calls.Load(), "no key run again after the restart")
	assert.EqualValues(t, 200, later.Stats().Hits)
}
