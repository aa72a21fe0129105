package memory_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/internal/binding"
)

// TestUniversalPubSub runs Watermill's universal Pub/Sub suite against the embedded broker.
//
// Every constructor call within one test returns a new publisher and a new subscriber of ONE
// broker shared by that test, which is how a process uses the embedded broker: all its
// handlers share it. The suite's "instances" are therefore subscribers of one broker, and
// the features declared are what that truly gives:
//   - ConsumerGroups: true. A topic is a fanout exchange and a group is the queue
//     "<topic>.<group>" bound to it (the publish/subscribe model): every group gets every
//     message, the group's subscribers compete for it.
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
		ConsumerGroups:                      true,
		ExactlyOnceDelivery:                 false,
		GuaranteedOrder:                     true,
		GuaranteedOrderWithSingleSubscriber: true,
		Persistent:                          true,
		RequireSingleInstance:               false,
		NewSubscriberReceivesOldMessages:    false,
		ContextPreserved:                    false,
	}, sharedBrokerPerTest(memory.Config{DrainTimeout: time.Second, NackBackoffMax: 5 * time.Millisecond}),
		groupsOfSharedBroker(memory.Config{DrainTimeout: time.Second, NackBackoffMax: 5 * time.Millisecond}))
}

// sharedBrokerPerTest returns a constructor that gives every call within one test a new
// publisher and subscriber of that test's broker, closed when the test ends.
func sharedBrokerPerTest(cfg memory.Config) tests.PubSubConstructor {
	bs := &testBrokers{cfg: cfg, all: map[*testing.T]*memory.Broker{}}
	return func(t *testing.T) (message.Publisher, message.Subscriber) {
		b := bs.get(t)
		return b.Publisher(), b.Subscriber(broker.SubscribeOptions{})
	}
}

// testBrokers holds one broker per test.
type testBrokers struct {
	cfg memory.Config
	mu  sync.Mutex
	all map[*testing.T]*memory.Broker
}

func (bs *testBrokers) get(t *testing.T) *memory.Broker {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	b, ok := bs.all[t]
	if !ok {
		b = memory.New(bs.cfg)
		bs.all[t] = b
		t.Cleanup(func() {
			bs.mu.Lock()
			delete(bs.all, t)
			bs.mu.Unlock()
			_ = b.Close()
		})
	}
	return b
}

// groupsOfSharedBroker is sharedBrokerPerTest for consumer groups: publishers publish to
// the fanout exchange named by the topic; a group's subscriber consumes the queue
// "<topic>.<group>" bound to it.
func groupsOfSharedBroker(cfg memory.Config) tests.ConsumerGroupPubSubConstructor {
	bs := &testBrokers{cfg: cfg, all: map[*testing.T]*memory.Broker{}}
	return func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		b := bs.get(t)
		return groupPublisher{b}, &groupSubscriber{b: b, sub: b.Subscriber(broker.SubscribeOptions{}), group: group}
	}
}

type groupPublisher struct{ b *memory.Broker }

func (p groupPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.b.DeclareExchange(context.Background(), topic, binding.Fanout, false); err != nil {
		return err
	}
	return p.b.PublishToExchange(context.Background(), topic, "", msgs...)
}

func (p groupPublisher) Close() error { return nil }

type groupSubscriber struct {
	b     *memory.Broker
	sub   message.Subscriber
	group string
}

func (s *groupSubscriber) SubscribeInitialize(topic string) error {
	return s.b.DeclareSubscription(context.Background(), topic+"."+s.group,
		[]binding.Binding{{Exchange: topic, Kind: binding.Fanout}}, false)
}

func (s *groupSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := s.SubscribeInitialize(topic); err != nil {
		return nil, err
	}
	return s.sub.Subscribe(ctx, topic+"."+s.group)
}

func (s *groupSubscriber) Close() error { return s.sub.Close() }
