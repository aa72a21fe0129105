package amqp_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// Pausing a subscription on RabbitMQ: messages with a handler finish, prefetched ones go
// back, and the queue keeps them in order; Resume with a limit lets only that many out at
// once. Both queue types sluice declares are covered; the order holds on classic queues.
func TestSubscriberPauseKeepsTheQueueInOrder(t *testing.T) {
	for _, qt := range []amqp.QueueType{amqp.QueueClassic, amqp.QueueQuorum} {
		t.Run(string(qt), func(t *testing.T) {
			const total = 30
			r := testenv.NewRabbit(t)
			b := newBroker(t, amqp.Config{QueueType: qt, Logger: quietLogger()})
			q := testenv.Name("pause")
			declare(t, b, r, q)
			t.Cleanup(func() { r.DeleteQueues(q, topology.DLQ(q)) })
			for i := range total {
				require.NoError(t, b.Publisher().Publish(q, message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "m-%02d", i))))
			}

			sub := b.Subscriber(broker.SubscribeOptions{Concurrency: 3, Prefetch: 10})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			msgs, err := sub.Subscribe(ctx, q)
			require.NoError(t, err)
			var got []string
			receive := func() *message.Message {
				t.Helper()
				select {
				case m := <-msgs:
					got = append(got, string(m.Payload))
					return m
				case <-time.After(10 * time.Second):
					t.Fatal("no delivery")
					return nil
				}
			}
			quiet := func(what string) {
				t.Helper()
				select {
				case m := <-msgs:
					t.Fatalf("%s: got %s", what, m.Payload)
				case <-time.After(300 * time.Millisecond):
				}
			}

			inFlight := []*message.Message{receive(), receive(), receive()}
			sub.Pause()
			assert.True(t, sub.Paused())
			for _, m := range inFlight {
				m.Ack()
			}
			require.Eventually(t, func() bool { return r.Count(q) == total-3 }, 10*time.Second, 20*time.Millisecond,
				"the prefetched deliveries go back and the in-flight ones are acked")
			quiet("paused")

			sub.Resume(1)
			probe := receive()
			quiet("one delivery out at a time while probing")
			probe.Ack()
			receive().Ack()
			sub.Pause()
			require.Eventually(t, func() bool { return r.Count(q) == total-5 }, 10*time.Second, 20*time.Millisecond)
			require.NoError(t, sub.Close())

			var rest []string
			for {
				d, ok := r.Get(q)
				if !ok {
					break
				}
				rest = append(rest, string(d.Body))
			}
			want := make([]string, 0, total)
			for i := range total {
				want = append(want, fmt.Sprintf("m-%02d", i))
			}
			if qt == amqp.QueueClassic {
				assert.Equal(t, want[5:], rest, "the queue keeps the messages it got back in order")
				slices.Sort(got)
				assert.Equal(t, want[:5], got, "the deliveries were the head of the queue, each once")
				return
			}
			// A quorum queue (RabbitMQ 3.10) may deliver a returned message after later
			// ones: measured here, returns reach the queue's log after the new consumer
			// started. Nothing is lost or doubled.
			all := append(append([]string(nil), got...), rest...)
			slices.Sort(all)
			assert.Equal(t, want, all, "every message once, delivered or waiting")
		})
	}
}
