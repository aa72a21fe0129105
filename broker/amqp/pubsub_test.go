package amqp_test

import (
	"context"
	"log/slog"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// TestUniversalPubSub runs Watermill's universal Pub/Sub suite against the RabbitMQ wiring:
// Broker.Publisher() and Broker.Subscriber(SubscribeOptions), each constructor call with its
// own Broker (its own connection), so "instances" in the suite's sense are separate clients
// of one RabbitMQ. sluice consumes queues that exist, so a small adapter declares a topic's
// queue (Broker.DeclareQueue) on its first use; every declared queue and its .dlq are
// deleted when the test ends.
//
// Features, as RabbitMQ queues behind sluice truly give them:
//   - ConsumerGroups: true. For the consumer-group test a topic is a fanout exchange
//     (Broker.DeclareExchange) and a group the queue "<topic>.<group>" bound to it
//     (Broker.DeclareSubscription), as sluice's publish/subscribe declares them: every group
//     gets every message, a group's subscribers compete for it. The other tests use a
//     topic as one queue.
//   - ExactlyOnceDelivery: false. At-least-once: an unacked delivery returns to the queue
//     when its channel closes, and a publish retried after a lost confirm may be duplicated.
//   - GuaranteedOrder: true only with Concurrency 1 and a single subscriber (prefetch 1, one
//     delivery out at a time, a requeued message keeps its place in a classic queue); with
//     Concurrency > 1 deliveries are handled in parallel and order is not guaranteed.
//   - Persistent: true. Durable queues, persistent messages: what one client did not ack,
//     the next consumes.
//   - RequireSingleInstance: false. Any number of clients compete for a queue.
//   - NewSubscriberReceivesOldMessages: false. A queue forgets what was acked.
//   - ContextPreserved: false. A message's context does not travel over AMQP.
//   - RestartServiceCommand: none. The shared RabbitMQ is never restarted from tests; the
//     chaos test (test/chaos) covers reconnects.
//
// Two settings differ from the defaults, for the suite's expectations, not to hide a fault:
//   - DrainTimeout 1s: the suite expects the context of a message a handler still holds to
//     be cancelled soon after its subscriber closes (within 15s); the default drain, which
//     lets handlers finish during a shutdown, is 30s.
//   - NackBackoffMax 5ms: sluice holds a nacked delivery for a backoff that grows with
//     consecutive nacks, up to 10s by default, because in sluice a nack means the broker
//     hand-off failed and spinning would not help. The suite nacks 300 times in a row and
//     waits at most 15s for each redelivery; with a 10s cap that alone would take ~40 min.
func TestUniversalPubSub(t *testing.T) {
	url := testenv.AMQPURL(t)
	cases := []struct {
		name     string
		opts     broker.SubscribeOptions
		features tests.Features
	}{
		{
			name: "concurrency=1",
			opts: broker.SubscribeOptions{Concurrency: 1},
			features: tests.Features{
				ConsumerGroups:                      true,
				GuaranteedOrder:                     true,
				GuaranteedOrderWithSingleSubscriber: true,
				Persistent:                          true,
			},
		},
		{
			name: "concurrency=8",
			opts: broker.SubscribeOptions{Concurrency: 8, Prefetch: 16},
			features: tests.Features{
				ConsumerGroups: true,
				Persistent:     true,
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newSuiteEnv(t, url, tc.opts)
			tests.TestPubSub(t, tc.features, s.newPubSub, s.newGroupPubSub)
		})
	}
}

// suiteEnv makes the suite's publishers and subscribers and remembers every queue they
// declared, to delete them at the end.
type suiteEnv struct {
	url  string
	opts broker.SubscribeOptions

	mu        sync.Mutex
	queues    map[string]*declaration
	exchanges map[string]bool
}

type declaration struct {
	once sync.Once
	err  error
}

func newSuiteEnv(t *testing.T, url string, opts broker.SubscribeOptions) *suiteEnv {
	s := &suiteEnv{url: url, opts: opts, queues: map[string]*declaration{}, exchanges: map[string]bool{}}
	t.Cleanup(func() { s.deleteQueues(t) })
	return s
}

// newGroupPubSub gives the consumer-group test a publisher to the fanout exchange named by
// the topic and a subscriber of the group's queue "<topic>.<group>" bound to it.
func (s *suiteEnv) newGroupPubSub(t *testing.T, group string) (message.Publisher, message.Subscriber) {
	pub, sub := s.newPubSub(t)
	p, q := pub.(*suitePublisher), sub.(*suiteSubscriber)
	return &groupPublisher{p}, &groupSubscriber{suiteSubscriber: q, group: group}
}

type groupPublisher struct{ *suitePublisher }

func (p *groupPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.s.declareExchange(p.b, topic); err != nil {
		return err
	}
	return p.b.PublishToExchange(context.Background(), topic, "", msgs...)
}

type groupSubscriber struct {
	*suiteSubscriber
	group string
}

func (s *groupSubscriber) SubscribeInitialize(topic string) error {
	if err := s.s.declareExchange(s.b, topic); err != nil {
		return err
	}
	queue := topic + "." + s.group
	s.s.mu.Lock()
	s.s.queues[queue] = &declaration{}
	s.s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return s.b.DeclareSubscription(ctx, queue, []broker.Binding{{Exchange: topic, Kind: broker.Fanout}}, false)
}

func (s *groupSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := s.SubscribeInitialize(topic); err != nil {
		return nil, err
	}
	return s.sub.Subscribe(ctx, topic+"."+s.group)
}

func (s *suiteEnv) declareExchange(b *amqp.Broker, exchange string) error {
	s.mu.Lock()
	s.exchanges[exchange] = true
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return b.DeclareExchange(ctx, exchange, broker.Fanout, false)
}

func (s *suiteEnv) newPubSub(t *testing.T) (message.Publisher, message.Subscriber) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{
		URLs:           []string{s.url},
		DrainTimeout:   time.Second,
		NackBackoffMax: 5 * time.Millisecond,
		Logger:         quietLogger(),
	})
	require.NoError(t, err)
	c := &closer{b: b}
	c.open.Store(2)
	return &suitePublisher{s: s, b: b, c: c}, &suiteSubscriber{s: s, b: b, c: c, sub: b.Subscriber(s.opts)}
}

// declare declares queue once for the whole run, whichever broker asks first.
func (s *suiteEnv) declare(b *amqp.Broker, queue string) error {
	s.mu.Lock()
	d, ok := s.queues[queue]
	if !ok {
		d = &declaration{}
		s.queues[queue] = d
	}
	s.mu.Unlock()
	d.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		d.err = b.DeclareQueue(ctx, queue)
	})
	return d.err
}

func (s *suiteEnv) deleteQueues(t *testing.T) {
	s.mu.Lock()
	names := make([]string, 0, 2*len(s.queues))
	for q := range s.queues {
		names = append(names, q, topology.DLQ(q))
	}
	s.mu.Unlock()
	sort.Strings(names)
	conn, err := amqp091.Dial(s.url)
	if err != nil {
		t.Errorf("delete %d test queues: %v", len(names), err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Errorf("delete %d test queues: %v", len(names), err)
		return
	}
	defer ch.Close()
	for _, q := range names {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			t.Errorf("delete test queue %q: %v", q, err)
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for x := range s.exchanges {
		if err := ch.ExchangeDelete(x, false, false); err != nil {
			t.Errorf("delete test exchange %q: %v", x, err)
			return
		}
	}
}

// closer closes the broker once both its publisher and its subscriber are closed; the
// suite closes them in either order, and sometimes twice.
type closer struct {
	b    *amqp.Broker
	open atomic.Int32
}

func (c *closer) done(once *sync.Once) error {
	var err error
	once.Do(func() {
		if c.open.Add(-1) == 0 {
			err = c.b.Close()
		}
	})
	return err
}

type suitePublisher struct {
	s    *suiteEnv
	b    *amqp.Broker
	c    *closer
	once sync.Once
}

func (p *suitePublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.s.declare(p.b, topic); err != nil {
		return err
	}
	return p.b.Publisher().Publish(topic, msgs...)
}

func (p *suitePublisher) Close() error { return p.c.done(&p.once) }

type suiteSubscriber struct {
	s    *suiteEnv
	b    *amqp.Broker
	c    *closer
	sub  broker.Subscriber
	once sync.Once
}

func (s *suiteSubscriber) SubscribeInitialize(topic string) error { return s.s.declare(s.b, topic) }

func (s *suiteSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := s.s.declare(s.b, topic); err != nil {
		return nil, err
	}
	return s.sub.Subscribe(ctx, topic)
}

func (s *suiteSubscriber) Close() error {
	err := s.sub.Close()
	if cerr := s.c.done(&s.once); err == nil {
		err = cerr
	}
	return err
}

// quietLogger keeps the suite's output readable; SLUICE_TEST_DEBUG=1 shows everything.
func quietLogger() *slog.Logger {
	level := slog.LevelError
	if os.Getenv("SLUICE_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// A publish whose deadline has already passed fails at once with the context's error. It
// used to be taken for a lost channel: the shared channel was closed under every other
// caller's in-flight confirms and reopened, again and again, without end.
func TestPublishWithExpiredDeadlineFailsFast(t *testing.T) {
	r := testenv.NewRabbit(t)
	b := newBroker(t, amqp.Config{})
	queue := testenv.Name("test.expired")
	declare(t, b, r, queue)
	require.NoError(t, b.Publisher().Publish(queue, message.NewMessage("first", []byte("x"))))

	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- b.Publisher().PublishTo(expired, "", queue, message.NewMessage("late", []byte("x"))) }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(10 * time.Second):
		t.Fatal("publish with an expired deadline did not return")
	}
	require.NoError(t, b.Publisher().Publish(queue, message.NewMessage("after", []byte("x"))))
	require.Eventually(t, func() bool { return r.Count(queue) == 2 }, 10*time.Second, 50*time.Millisecond,
		"the expired publish must not reach the queue; the others must")
}
