package test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/policy"
	"github.com/sluice-go/sluice/router"
)

// Issue 52, point 5: RabbitMQ's consumer timeout must never take back a delivery the stack
// still decides about. A handler that cooperates but takes 3.5 s, HandlerTimeout 4 s, on a
// node whose consumer_timeout is 3 s: the stack's settle bound for it is 4 s + 1 s grace +
// two 30 s hand-offs + 10 s = 75 s.

// slowTake is how long the handler takes: past the node's consumer_timeout (3 s), within
// the handler timeout (4 s).
const slowTake = 3500 * time.Millisecond

// cancelLog is what the subscriber logs when RabbitMQ cancels its consumer
// (amqp.ErrConsumerCancelled's text).
const cancelLog = "consumer cancelled by RabbitMQ"

// slowStack runs a stack on b with HandlerTimeout 4 s and no retries, whose handler on
// queue takes slowTake (returning early only if its context ends) and counts its calls.
func slowStack(t *testing.T, b *amqp.Broker, queue string) (calls *atomic.Int64, stop func()) {
	t.Helper()
	calls = new(atomic.Int64)
	s, err := router.New(b, router.Config{Logger: testLogger(), HandlerTimeout: 4 * time.Second, CloseTimeout: 5 * time.Second,
		Retry: retry.Config{MaxRetries: -1}})
	require.NoError(t, err)
	require.NoError(t, s.Handle("slow", queue, func(m *message.Message) error {
		calls.Add(1)
		select {
		case <-time.After(slowTake):
			return nil
		case <-m.Context().Done():
			return m.Context().Err()
		}
	}))
	d := s.Describe()
	require.Len(t, d.Handlers, 1)
	require.Equal(t, policy.Duration(75*time.Second), d.Handlers[0].SettleWithin)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	select {
	case <-s.Running():
	case err := <-ran:
		cancel()
		t.Fatalf("the stack stopped at start: %v", err)
	}
	var once atomic.Bool
	stop = func() {
		if !once.CompareAndSwap(false, true) {
			return
		}
		cancel()
		assert.NoError(t, <-ran)
		assert.NoError(t, s.Close())
	}
	t.Cleanup(stop)
	return calls, stop
}

// timeoutBroker connects to url with the queue type and the node's consumer timeout given,
// logging at info into logs.
func timeoutBroker(t *testing.T, url string, qt amqp.QueueType, consumerTimeout time.Duration, logs *testenv.SyncBuffer) *amqp.Broker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{url}, QueueType: qt, ConsumerTimeout: consumerTimeout, Logger: logger})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// consumerArguments returns the arguments column of queue's consumers, as rabbitmqctl
// list_consumers prints it, one line per consumer.
func consumerArguments(t *testing.T, ctl func(args ...string) (string, error), queue string) []string {
	t.Helper()
	out, err := ctl("list_consumers", "--no-table-headers", "--quiet", "queue_name", "arguments")
	require.NoError(t, err, out)
	var args []string
	for _, line := range strings.Split(out, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), "\t")
		if ok && name == queue {
			args = append(args, rest)
		}
	}
	return args
}

// TestConsumerTimeout_43 runs on a RabbitMQ 4.3 node of its own with consumer_timeout =
// 3000 (one node start for every case): a quorum queue's consumer gets the settle bound as
// its x-consumer-timeout and is never cancelled while its handler takes 3.5 s; the same
// stack without the argument is cancelled at 3 s and its message delivered again while the
// handler still runs (so the first case can fail); a classic queue refuses the argument,
// is consumed without it, and RabbitMQ takes nothing back from it.
func TestConsumerTimeout_43(t *testing.T) {
	testenv.Require43(t)
	node := testenv.StartNode(t, testenv.NodeOptions{Config: []string{"consumer_timeout = 3000"}})
	t.Logf("RabbitMQ 4.3 node with consumer_timeout = 3000 started in %s", node.StartTime.Round(100*time.Millisecond))
	r := node.Rabbit(t)

	tests := []struct {
		name      string
		queueType amqp.QueueType
		// consumerTimeout is amqp.Config.ConsumerTimeout. An hour (above the bound) keeps
		// the argument off: the node's 3 s then applies, as without this feature.
		consumerTimeout time.Duration
		// arguments is what list_consumers shows of the consumer's arguments.
		arguments string
		cancelled bool
	}{
		{name: "quorum queue: the consumer's timeout is the bound, nothing taken back", queueType: amqp.QueueQuorum,
			consumerTimeout: 3 * time.Second, arguments: `x-consumer-timeout`},
		{name: "quorum queue without the argument: RabbitMQ cancels at 3s", queueType: amqp.QueueQuorum,
			consumerTimeout: time.Hour, cancelled: true},
		{name: "classic queue: the argument refused, consumed without it, nothing taken back", queueType: amqp.QueueClassic,
			consumerTimeout: 3 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			queue := testenv.Name("test.ctimeout")
			r.DeleteQueues(queue, topology.DLQ(queue))
			logs := &testenv.SyncBuffer{}
			b := timeoutBroker(t, node.URL(), tc.queueType, tc.consumerTimeout, logs)
			calls, stop := slowStack(t, b, queue)
			defer func() {
				if t.Failed() {
					t.Logf("broker log:\n%s", logs.String())
				}
			}()

			pub, err := amqp.Marshaler{}.Marshal(message.NewMessage("slow-1", []byte("slow")))
			require.NoError(t, err)
			r.Publish(queue, pub)
			require.Eventually(t, func() bool { return calls.Load() >= 1 }, 10*time.Second, 10*time.Millisecond, "the handler was not called")
			first := time.Now()

			if tc.cancelled {
				// RabbitMQ cancels the consumer at 3 s and gives the delivery to the
				// consumer the subscriber makes at once: the handler runs it again while
				// the first attempt still runs.
				require.Eventually(t, func() bool { return calls.Load() >= 2 }, 10*time.Second, 10*time.Millisecond,
					"RabbitMQ did not take the delivery back: the node does not enforce its consumer_timeout, and the test proves nothing")
				t.Logf("without x-consumer-timeout: delivered again %s after the first call", time.Since(first).Round(100*time.Millisecond))
				assert.Contains(t, logs.String(), cancelLog)
				for _, a := range consumerArguments(t, node.Ctl, queue) {
					assert.NotContains(t, a, "x-consumer-timeout")
				}
				return
			}

			// Past the handler's 3.5 s, and long past the node's 3 s: a delivery taken back
			// at 3 s would have been handled again by now.
			time.Sleep(slowTake + 2500*time.Millisecond)
			assert.EqualValues(t, 1, calls.Load(), "the handler ran once: RabbitMQ took nothing back")
			assert.NotContains(t, logs.String(), cancelLog, "the consumer was never cancelled")
			args := consumerArguments(t, node.Ctl, queue)
			require.Len(t, args, 1, "one consumer")
			t.Logf("the consumer's arguments (list_consumers): %s", args[0])
			if tc.arguments != "" {
				assert.Contains(t, args[0], tc.arguments)
				assert.Contains(t, args[0], "75000", "the bound, in milliseconds")
			} else {
				assert.NotContains(t, args[0], "x-consumer-timeout")
				assert.Equal(t, 1, strings.Count(logs.String(), "queue refuses x-consumer-timeout"), "the refusal is logged once")
			}
			stop()
			require.NoError(t, b.Close())
			assert.Zero(t, r.Count(queue), "acked: nothing went back to the queue")
			assert.Zero(t, r.Count(topology.DLQ(queue)), "nothing dead-lettered")
		})
	}
}

// TestConsumerTimeout_310: on RabbitMQ 3.10 a consumer takes no timeout of its own, so a
// subscriber whose settle bound exceeds the node's consumer_timeout consumes as before,
// without the argument, and says once per queue what the operator sets in rabbitmq.conf.
// (A 3.10 node enforces consumer_timeout by closing the channel at its next minute tick,
// whatever the consumer asks: see docs/reliability.md.)
func TestConsumerTimeout_310(t *testing.T) {
	if testenv.Is43() {
		t.Skip("RabbitMQ 3.10 behaviour: runs with SLUICE_RABBITMQ=3.10; TestConsumerTimeout_43 covers 4.3")
	}
	r := testenv.NewRabbit(t)
	for _, qt := range []amqp.QueueType{amqp.QueueQuorum, amqp.QueueClassic} {
		t.Run(string(qt), func(t *testing.T) {
			queue := testenv.Name("test.ctimeout310")
			r.DeleteQueues(queue, topology.DLQ(queue))
			logs := &testenv.SyncBuffer{}
			// The node's is 30 min (the shared node); the broker is told 3 s, as an
			// operator who set consumer_timeout = 3000 would.
			b := timeoutBroker(t, r.URL, qt, 3*time.Second, logs)
			calls, stop := slowStack(t, b, queue)
			for i := range 3 {
				pub, err := amqp.Marshaler{}.Marshal(message.NewMessage(fmt.Sprintf("slow-%d", i), []byte("slow")))
				require.NoError(t, err)
				r.Publish(queue, pub)
			}
			require.Eventually(t, func() bool { return calls.Load() >= 1 }, 10*time.Second, 10*time.Millisecond, "the handler was not called")
			args := consumerArguments(t, func(args ...string) (string, error) { return testenv.Ctl(t, args...), nil }, queue)
			require.Len(t, args, 1, "one consumer")
			assert.NotContains(t, args[0], "x-consumer-timeout", "3.10 takes no per-consumer timeout: none is sent")
			require.Eventually(t, func() bool { return calls.Load() == 3 }, 20*time.Second, 50*time.Millisecond, "all three handled")
			stop()
			require.NoError(t, b.Close())
			assert.Zero(t, r.Count(queue), "every message acked")
			out := logs.String()
			assert.Equal(t, 1, strings.Count(out, "set consumer_timeout in rabbitmq.conf"), "said once per queue:\n%s", out)
			assert.Contains(t, out, "set_consumer_timeout_ms=75000")
			assert.Contains(t, out, "queue="+queue)
		})
	}
}
