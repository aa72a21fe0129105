package test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// handoffCounter counts what the stack asks the broker to do during an outage: deliveries
// handed to the handler and publishes (retry and deferral copies, dead letters), each
// split at the moment the dependency comes back.
type handoffCounter struct {
	router.Broker
	upAt func() time.Time // zero while unknown: the outage has not begun

	deliveries, deliveriesDuring atomic.Int64
	publishes, publishesDuring   atomic.Int64
	deadLetters                  atomic.Int64
}

func (c *handoffCounter) during() bool {
	up := c.upAt()
	return up.IsZero() || time.Now().Before(up)
}

func (c *handoffCounter) Delay(ctx context.Context, queue string, d time.Duration, msg *message.Message) error {
	if err := c.Broker.Delay(ctx, queue, d, msg); err != nil {
		return err
	}
	c.publishes.Add(1)
	if c.during() {
		c.publishesDuring.Add(1)
	}
	return nil
}

func (c *handoffCounter) DeadLetter(ctx context.Context, queue string, msg *message.Message) error {
	if err := c.Broker.DeadLetter(ctx, queue, msg); err != nil {
		return err
	}
	c.deadLetters.Add(1)
	c.publishes.Add(1)
	if c.during() {
		c.publishesDuring.Add(1)
	}
	return nil
}

func (c *handoffCounter) Subscriber(concurrency, prefetch int) message.Subscriber {
	inner := c.Broker.Subscriber(concurrency, prefetch)
	counting := countingSub{Subscriber: inner, c: c}
	if p, ok := inner.(router.Pauser); ok {
		return pausableCountingSub{countingSub: counting, Pauser: p}
	}
	return counting
}

type countingSub struct {
	message.Subscriber
	c *handoffCounter
}

func (s countingSub) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for msg := range in {
			s.c.deliveries.Add(1)
			if s.c.during() {
				s.c.deliveriesDuring.Add(1)
			}
			out <- msg
		}
	}()
	return out, nil
}

// pausableCountingSub keeps the subscriber's Pause and Resume visible to the stack.
type pausableCountingSub struct {
	countingSub
	router.Pauser
}

// outageDep is a dependency that is down for outage from its first call, then up; it
// records the order in which messages succeeded.
type outageDep struct {
	outage time.Duration

	mu          sync.Mutex
	upAt        time.Time
	callsDown   int
	callsUp     int
	done        map[string]bool
	lastDone    time.Time
	doneInOrder []string
}

func newOutageDep(outage time.Duration) *outageDep {
	return &outageDep{outage: outage, done: map[string]bool{}}
}

func (d *outageDep) handle(msg *message.Message) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	if d.upAt.IsZero() {
		d.upAt = now.Add(d.outage)
	}
	if now.Before(d.upAt) {
		d.callsDown++
		return errGatewayDown
	}
	d.callsUp++
	if !d.done[string(msg.Payload)] {
		d.done[string(msg.Payload)] = true
		d.doneInOrder = append(d.doneInOrder, string(msg.Payload))
		d.lastDone = now
	}
	return nil
}

func (d *outageDep) recovery() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.upAt
}

func (d *outageDep) stats() (down, up, done int, last time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.callsDown, d.callsUp, len(d.done), d.lastDone
}

// outageRun is the result of one outage scenario.
type outageRun struct {
	mode                      string
	backlog                   int
	deliveriesDuring          int64
	publishesDuring           int64
	callsDown, callsUp        int
	drain                     time.Duration
	deadLetters, inQueueAfter int
	opens                     int
}

func (r outageRun) String() string {
	return fmt.Sprintf("%s: backlog %d; during the outage %d deliveries (%.3f per backlog message), %d publishes (%.3f per message), %d dependency calls; %d calls after; drained %s after recovery; %d breaker opens; %d dead-lettered",
		r.mode, r.backlog, r.deliveriesDuring, float64(r.deliveriesDuring)/float64(r.backlog),
		r.publishesDuring, float64(r.publishesDuring)/float64(r.backlog), r.callsDown, r.callsUp,
		r.drain.Round(time.Millisecond), r.opens, r.deadLetters)
}

// outageScenario: a backlog of messages waits in a queue, the stack starts, the dependency
// is down for outage from its first call and then back. It returns once every message is
// processed and the queue is empty.
func outageScenario(t testing.TB, e *env, backlog int, outage, openTimeout time.Duration, deferring bool) outageRun {
	const (
		concurrency = 4
		threshold   = 5
	)
	q := e.newQueue(t, "outage")
	require.NoError(t, e.broker.DeclareQueue(context.Background(), q))
	for i := range backlog {
		e.publish(t, q, message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "m-%06d", i)))
	}
	var opens atomic.Int64
	reg, err := breaker.New(breaker.Config{
		ConsecutiveFailures: threshold,
		OpenTimeout:         openTimeout,
		Logger:              testLogger(),
		OnStateChange: func(_ string, _, to breaker.State) {
			if to == breaker.StateOpen {
				opens.Add(1)
			}
		},
	})
	require.NoError(t, err)
	dep := newOutageDep(outage)
	counter := &handoffCounter{Broker: e.broker, upAt: dep.recovery}
	e.broker = counter
	opts := []router.HandlerOption{router.WithBreaker("gateway")}
	mode := "pause"
	if deferring {
		opts = append(opts, router.WithDeferWhileOpen())
		mode = "defer"
	}
	start(t, e, router.Config{
		Concurrency: concurrency,
		Prefetch:    4 * concurrency,
		Breakers:    reg,
		Retry:       retry.Config{MaxRetries: 20, InitialDelay: 200 * time.Millisecond, MaxDelay: 2 * time.Second},
	}, func(s *router.Stack) {
		require.NoError(t, s.Handle("charge", q, dep.handle, opts...))
	})

	require.Eventually(t, func() bool {
		_, _, done, _ := dep.stats()
		return done == backlog
	}, outage+3*time.Minute, 20*time.Millisecond, "every message is processed after recovery")
	require.Eventually(t, func() bool { return e.count(t, q) == 0 }, 30*time.Second, 20*time.Millisecond)
	down, up, _, last := dep.stats()
	run := outageRun{
		mode: mode, backlog: backlog,
		deliveriesDuring: counter.deliveriesDuring.Load(), publishesDuring: counter.publishesDuring.Load(),
		callsDown: down, callsUp: up, drain: last.Sub(dep.recovery()),
		deadLetters: int(counter.deadLetters.Load()), opens: int(opens.Load()),
	}
	run.inQueueAfter = len(e.dlq(t, q))
	return run
}

// A backlog waits while the dependency is down. Pausing keeps the backlog in its queue:
// the broker moves next to nothing during the outage (only the calls that tripped the
// breaker and the probes are retried), where deferral moves every message through the
// delay cascade once per open timeout. Either way nothing is lost or dead-lettered.
func TestOverload_OutagePauseBesideDeferral(t *testing.T) {
	const (
		backlog     = 1000
		outage      = 3 * time.Second
		openTimeout = 500 * time.Millisecond
	)
	onEachBroker(t, func(t *testing.T, e *env) {
		runs := map[string]outageRun{}
		for _, deferring := range []bool{true, false} {
			sub := *e
			name := map[bool]string{true: "defer", false: "pause"}[deferring]
			t.Run(name, func(t *testing.T) {
				run := outageScenario(t, &sub, backlog, outage, openTimeout, deferring)
				t.Log(run)
				runs[name] = run
				assert.Zero(t, run.deadLetters, "nothing may be dead-lettered")
				assert.Zero(t, run.inQueueAfter, "the dead-letter queue stays empty")
			})
		}
		pause, deferral := runs["pause"], runs["defer"]
		require.NotZero(t, pause.backlog)
		require.NotZero(t, deferral.backlog)
		probes := int(outage/openTimeout) + 1
		// Pausing: the dependency sees the calls that tripped it (threshold plus those in
		// flight) and one probe per open period; each of them is retried once, and nothing
		// else is published.
		assert.LessOrEqual(t, pause.callsDown, 5+3+probes, "dependency calls during the outage")
		assert.LessOrEqual(t, pause.publishesDuring, int64(pause.callsDown), "only failed calls are handed off while paused")
		assert.Less(t, float64(pause.deliveriesDuring)/float64(backlog), 0.1, "deliveries per backlog message while paused")
		assert.Greater(t, deferral.publishesDuring, 10*pause.publishesDuring+int64(backlog)/2, "deferral moves the backlog through the cascade")
	})
}

// BenchmarkOverloadOutage measures the outage scenario on RabbitMQ: a backlog, the
// dependency down, then back, with today's deferral beside the pause. The default is a
// short run (2,000 messages, 5 s outage, 1 s open timeout); the figure comes from
// SLUICE_OUTAGE_BACKLOG=20000 SLUICE_OUTAGE_SECONDS=30 SLUICE_OUTAGE_OPEN_SECONDS=5.
func BenchmarkOverloadOutage(b *testing.B) {
	backlog := envInt("SLUICE_OUTAGE_BACKLOG", 2000)
	outage := time.Duration(envInt("SLUICE_OUTAGE_SECONDS", 5)) * time.Second
	openTimeout := time.Duration(envInt("SLUICE_OUTAGE_OPEN_SECONDS", 1)) * time.Second
	for _, mode := range []string{"defer", "pause"} {
		b.Run(mode, func(b *testing.B) {
			for range b.N {
				run := outageScenario(b, rabbitEnv(b), backlog, outage, openTimeout, mode == "defer")
				b.ReportMetric(float64(run.deliveriesDuring)/float64(backlog), "deliveries/msg")
				b.ReportMetric(float64(run.publishesDuring)/float64(backlog), "publishes/msg")
				b.ReportMetric(float64(run.callsDown), "dep-calls-down")
				b.ReportMetric(run.drain.Seconds(), "s-drain")
				b.ReportMetric(float64(run.deadLetters), "dead-letters")
			}
		})
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
