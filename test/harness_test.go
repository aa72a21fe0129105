// Package test holds sluice's integration, end-to-end and chaos tests. They run against a
// real RabbitMQ (and Jaeger where said); the embedded broker runs the same scenarios.
//
// Which tests run in parallel: the long ones that only wait on the shared node and a
// process of their own and touch nothing process-wide. Each uses queues named by
// testenv.Name, sets no environment variable (t.Setenv panics in a parallel test), and
// judges no timing another test's load would shift; the rest stay serial, and Go runs
// them all before any parallel one resumes, so a serial test never shares the machine
// with them. Tests that start a node of their own stay serial: on RabbitMQ 4.3 several
// nodes booting at once in the chroot on two loaded cores missed the 90 s boot limit. The
// overload, learned-retry and journal-concurrency scenarios measure rates and stay
// serial too. The parallel ones call `t.Parallel() // its own queues on the shared node`.
package test

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/router"
)

// env is one broker a scenario runs on.
type env struct {
	name   string
	broker router.Broker
	amqp   *amqp.Broker    // nil on the embedded broker
	mem    *memory.Broker  // nil on RabbitMQ
	rabbit *testenv.Rabbit // plain client, nil on the embedded broker
}

// newQueue names a fresh queue and removes it (and its DLQ) after the test.
func (e *env) newQueue(t testing.TB, prefix string) string {
	q := testenv.Name(prefix)
	if e.rabbit != nil {
		e.rabbit.DeleteQueues(q, topology.DLQ(q), topology.IdempotencyJournal(q))
	}
	return q
}

// count returns the messages waiting in queue.
func (e *env) count(t testing.TB, queue string) int {
	if e.rabbit != nil {
		return e.rabbit.Count(queue)
	}
	return e.mem.Len(queue)
}

// publish sends a message to queue as a producer outside sluice would.
func (e *env) publish(t testing.TB, queue string, msg *message.Message) {
	t.Helper()
	if e.rabbit != nil {
		pub, err := amqp.Marshaler{}.Marshal(msg)
		require.NoError(t, err)
		e.rabbit.Publish(queue, pub)
		return
	}
	require.NoError(t, e.mem.Publish(queue, msg))
}

// dlq returns the messages in queue's DLQ without consuming them for good on the embedded
// broker, and by taking them on RabbitMQ.
func (e *env) dlq(t testing.TB, queue string) []*message.Message {
	t.Helper()
	if e.rabbit == nil {
		return e.mem.Peek(topology.DLQ(queue))
	}
	var out []*message.Message
	for {
		d, ok := e.rabbit.Get(topology.DLQ(queue))
		if !ok {
			return out
		}
		m, _ := amqp.Marshaler{}.Unmarshal(d)
		out = append(out, m)
	}
}

func testLogger() *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("SLUICE_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func rabbitEnv(t testing.TB) *env {
	r := testenv.NewRabbit(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{r.URL}, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return &env{name: "rabbitmq", broker: b, amqp: b, rabbit: r}
}

func memoryEnv(t testing.TB) *env {
	b := memory.New(memory.Config{Logger: testLogger()})
	t.Cleanup(func() { _ = b.Close() })
	return &env{name: "memory", broker: b, mem: b}
}

// onEachBroker runs scenario on RabbitMQ and on the embedded broker.
func onEachBroker(t *testing.T, scenario func(t *testing.T, e *env)) {
	t.Run("rabbitmq", func(t *testing.T) { scenario(t, rabbitEnv(t)) })
	t.Run("memory", func(t *testing.T) { scenario(t, memoryEnv(t)) })
}

// start runs a stack built by build until the test ends.
func start(t testing.TB, e *env, cfg router.Config, build func(s *router.Stack)) *router.Stack {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	s, err := router.New(e.broker, cfg)
	require.NoError(t, err)
	build(s)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-s.Running():
	case err := <-done:
		t.Fatalf("stack stopped at start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("stack did not start")
	}
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() {
			_ = s.Close()
			cancel()
			<-done
		})
	})
	return s
}

// calls records handler calls with their times.
type calls struct {
	mu    sync.Mutex
	times []time.Time
	msgs  []*message.Message
}

func (c *calls) add(m *message.Message) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.times = append(c.times, time.Now())
	c.msgs = append(c.msgs, m)
	return len(c.times)
}

func (c *calls) n() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.times)
}

func (c *calls) gaps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var g []time.Duration
	for i := 1; i < len(c.times); i++ {
		g = append(g, c.times[i].Sub(c.times[i-1]))
	}
	return g
}
