package memory_test

import (
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/sluice-go/sluice/broker/memory"
)

// TestUniversalPubSub runs Watermill's universal Pub/Sub suite against the embedded broker.
//
// Every constructor call within one test returns a new publisher and a new subscriber of ONE
// broker shared by that test, which is how a process uses the embedded broker: all its
// handlers share it. The suite's "instances" are therefore subscribers of one broker, and
// the features declared are what that truly gives:
//   - ConsumerGroups: false. A queue has competing consumers, never a copy per group.
//   - ExactlyOnceDelivery: false. At-least-once: a message whose subscriber closes before
//     the handler's verdict goes back to the queue and may be handled again.
//   - GuaranteedOrder with GuaranteedOrderWithSingleSubscriber: true. One subscriber with
//     Concurrency 1 takes messages in publish order, one at a time, and a nacked message
//     returns to the head of its queue. With several subscribers, or Concurrency > 1, order
//     is not guaranteed; the flag makes the suite's order tests use one subscriber.
//   - Persistent: true. Queues live in the broker, not in a subscriber: what a closed
//     subscriber did not ack is consumed by the next one. Nothing survives the process.
//   - RequireSingleInstance: false. Many subscribers of the shared broker compete for a
//     queue correctly, so the suite's 50-subscriber test runs. (A second memory.New is a
//     separate broker; the shared broker per test is what makes this hold.)
//   - NewSubscriberReceivesOldMessages: false. A consumed message is gone.
//   - ContextPreserved: false. A copy is delivered, carrying the subscription's context.
//
// Two settings differ from the defaults, for the suite's expectations, not to hide a fault:
//   - DrainTimeout 1s: the suite expects the context of a message still held by a handler
//     to be cancelled soon after its subscriber closes (within 15s); the default drain,
//     which lets handlers finish during a shutdown, is 30s.
//   - NackBackoffMax 5ms: sluice holds a nacked message for a backoff that grows with
//     consecutive nacks, up to 10s by default, because in sluice a nack means the broker
//     hand-off failed and spinning would not help. The suite nacks 300 times in a row and
//     waits at most 15s for each redelivery; with a 10s cap that alone would take ~40 min.
func TestUniversalPubSub(t *testing.T) {
	tests.TestPubSub(t, tests.Features{
		ConsumerGroups:                      false,
		ExactlyOnceDelivery:                 false,
		GuaranteedOrder:                     true,
		GuaranteedOrderWithSingleSubscriber: true,
		Persistent:                          true,
		RequireSingleInstance:               false,
		NewSubscriberReceivesOldMessages:    false,
		ContextPreserved:                    false,
	}, sharedBrokerPerTest(memory.Config{DrainTimeout: time.Second, NackBackoffMax: 5 * time.Millisecond}), nil)
}

// sharedBrokerPerTest returns a constructor that gives every call within one test a new
// publisher and subscriber of that test's broker, closed when the test ends.
func sharedBrokerPerTest(cfg memory.Config) tests.PubSubConstructor {
	var mu sync.Mutex
	brokers := map[*testing.T]*memory.Broker{}
	return func(t *testing.T) (message.Publisher, message.Subscriber) {
		mu.Lock()
		b, ok := brokers[t]
		if !ok {
			b = memory.New(cfg)
			brokers[t] = b
			t.Cleanup(func() {
				mu.Lock()
				delete(brokers, t)
				mu.Unlock()
				_ = b.Close()
			})
		}
		mu.Unlock()
		return b.Publisher(), b.Subscriber(memory.SubscribeOptions{})
	}
}
