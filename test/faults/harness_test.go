//go:build faults

// Package faults holds the fault suite: sluice against a slow, cut, blocked or frozen
// broker. Every scenario runs on a RabbitMQ node of its own (testenv.StartNode), never on
// the shared one, with toxiproxy (as a library, in this process) between sluice and the node
// where the network is the fault. A ledger follows every message id from its publish to
// where it ended, and each scenario checks that nothing confirmed was lost, that side
// effects happened exactly once (or within the bound the scenario states), that no
// goroutine outlived the stack, and that the node's connection and channel counts went back
// to their baseline. Run it with `make test-faults`.
package faults

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// serverHeartbeat is the heartbeat the test nodes offer; amqp091 takes the lower of its own
// (10s) and the node's, so "three heartbeats" last seconds, not half a minute.
const serverHeartbeat = 2 * time.Second

// startNode starts a RabbitMQ node for one test with extra rabbitmq.conf lines.
func startNode(t *testing.T, conf ...string) *testenv.Node {
	t.Helper()
	conf = append([]string{fmt.Sprintf("heartbeat = %d", int(serverHeartbeat/time.Second))}, conf...)
	n := testenv.StartNode(t, testenv.NodeOptions{Config: conf})
	t.Logf("node %s on port %d started in %s", n.Name, n.Port, n.StartTime.Round(time.Millisecond))
	return n
}

// proxy is a toxiproxy proxy, in this process, in front of a node.
type proxy struct {
	t *testing.T
	p *toxiproxy.Proxy
}

// newProxy starts a proxy to upstream (host:port); it is stopped when t ends.
func newProxy(t *testing.T, upstream string) *proxy {
	t.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(server, testenv.Name("proxy"), "127.0.0.1:0", upstream)
	require.NoError(t, p.Start())
	t.Cleanup(p.Stop)
	return &proxy{t: t, p: p}
}

// url is the AMQP URL through the proxy.
func (p *proxy) url() string { return "amqp://guest:guest@" + p.p.Listen + "/" }

// add adds a toxic; attrs is its JSON attributes object. stream is "upstream" (sluice to
// RabbitMQ) or "downstream".
func (p *proxy) add(name, kind, stream, attrs string) {
	p.t.Helper()
	body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, kind, stream, attrs)
	_, err := p.p.Toxics.AddToxicJson(strings.NewReader(body))
	require.NoError(p.t, err, "add toxic %s", body)
}

// remove removes a toxic.
func (p *proxy) remove(name string) {
	p.t.Helper()
	require.NoError(p.t, p.p.Toxics.RemoveToxic(context.Background(), name))
}

// Publish outcomes and final places of the ledger.
const (
	confirmed = "confirmed" // Publish returned nil: RabbitMQ took responsibility
	failed    = "failed"    // Publish returned an error: the message may or may not exist
	unrouted  = "unrouted"  // Publish returned ErrUnroutable: no queue took it
	processed = "processed" // the handler succeeded
	deadLtr   = "dlq"       // found in the DLQ
)

// record is what the ledger knows of one message id.
type record struct {
	publish string
	err     string      // the publish error, if any
	effects int         // handler side effects (successful calls)
	calls   []time.Time // every handler call, successful or not
	place   string
}

// ledger follows every message id of a scenario.
type ledger struct {
	mu sync.Mutex
	m  map[string]*record
	// empty counts handler calls with no id or no payload: a zero delivery passed on.
	empty atomic.Int64
}

func newLedger() *ledger { return &ledger{m: map[string]*record{}} }

func (l *ledger) get(id string) *record {
	r := l.m[id]
	if r == nil {
		r = &record{}
		l.m[id] = r
	}
	return r
}

// published records the outcome of id's publish.
func (l *ledger) published(id string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.get(id)
	switch {
	case err == nil:
		r.publish = confirmed
	case strings.Contains(err.Error(), amqp.ErrUnroutable.Error()):
		r.publish, r.place = unrouted, unrouted
	default:
		r.publish, r.err = failed, err.Error()
	}
}

// outcome returns id's publish outcome.
func (l *ledger) outcome(id string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.get(id).publish
}

// failures returns up to n publish errors, for logs.
func (l *ledger) failures(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for id, r := range l.m {
		if r.err != "" && len(out) < n {
			out = append(out, id+": "+r.err)
		}
	}
	return out
}

// called records a handler call and returns how many calls id had before it.
func (l *ledger) called(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.get(id)
	r.calls = append(r.calls, time.Now())
	return len(r.calls) - 1
}

// effect records id's side effect and its final place, processed.
func (l *ledger) effect(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.get(id)
	r.effects++
	r.place = processed
}

func (l *ledger) deadLettered(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.get(id).place = deadLtr
}

// count returns how many records satisfy f.
func (l *ledger) count(f func(*record) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.m {
		if f(r) {
			n++
		}
	}
	return n
}

// settled reports whether every confirmed message reached its final place.
func (l *ledger) settled() bool {
	return l.count(func(r *record) bool { return r.publish == confirmed && r.place == "" }) == 0
}

// summary is a scenario's line for docs/reliability.md's fault table.
type summary struct {
	Confirmed, Failed, Unrouted, Processed, DLQ, Lost, Duplicates int
}

func (l *ledger) summary() summary {
	l.mu.Lock()
	defer l.mu.Unlock()
	var s summary
	for _, r := range l.m {
		switch r.publish {
		case confirmed:
			s.Confirmed++
			if r.place == "" {
				s.Lost++
			}
		case failed:
			s.Failed++
		case unrouted:
			s.Unrouted++
		}
		switch r.place {
		case processed:
			s.Processed++
		case deadLtr:
			s.DLQ++
		}
		if r.effects > 1 {
			s.Duplicates += r.effects - 1
		}
	}
	return s
}

// check asserts the ledger's invariants: every confirmed message reached a final place,
// and no message had more than maxEffects side effects.
func (l *ledger) check(t *testing.T, maxEffects int) summary {
	t.Helper()
	s := l.summary()
	t.Logf("ledger: %+v", s)
	l.mu.Lock()
	defer l.mu.Unlock()
	var lost, over []string
	for id, r := range l.m {
		if r.publish == confirmed && r.place == "" {
			lost = append(lost, id)
		}
		if r.effects > maxEffects {
			over = append(over, fmt.Sprintf("%s(%d)", id, r.effects))
		}
		if r.place == unrouted && r.effects > 0 {
			over = append(over, id+"(unrouted yet handled)")
		}
	}
	sort.Strings(lost)
	sort.Strings(over)
	require.Zero(t, l.empty.Load(), "empty messages reached the handler")
	require.Empty(t, lost, "confirmed messages lost")
	require.Empty(t, over, "side effects above %d", maxEffects)
	return s
}

// drainDLQ takes queue's dead letters through a plain client on the node and records them.
func (l *ledger) drainDLQ(r *testenv.Rabbit, queue string) {
	for {
		d, ok := r.Get(topology.DLQ(queue))
		if !ok {
			return
		}
		l.deadLettered(d.MessageId)
	}
}

// counts returns the node's connection and channel counts.
func counts(t *testing.T, n *testenv.Node) (conns, chans int) {
	t.Helper()
	lines := func(args ...string) int {
		out, err := n.Ctl(append([]string{"-q", "--no-table-headers"}, args...)...)
		require.NoError(t, err, "rabbitmqctl %v: %s", args, out)
		c := 0
		for _, line := range strings.Split(out, "\n") {
			if strings.TrimSpace(line) != "" {
				c++
			}
		}
		return c
	}
	return lines("list_connections", "pid"), lines("list_channels", "pid")
}

// baseline records the node's connection and channel counts and the running goroutines;
// its verify, called once the stack is closed, fails t unless both counts are back and no
// new goroutine is left.
type baseline struct {
	node         *testenv.Node
	conns, chans int
	goroutines   goleak.Option
}

func takeBaseline(t *testing.T, n *testenv.Node) *baseline {
	t.Helper()
	c, ch := counts(t, n)
	return &baseline{node: n, conns: c, chans: ch, goroutines: goleak.IgnoreCurrent()}
}

func (b *baseline) verify(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		c, ch := counts(t, b.node)
		return c == b.conns && ch == b.chans
	}, 30*time.Second, 250*time.Millisecond, "connections and channels back to %d and %d", b.conns, b.chans)
	goleak.VerifyNone(t, b.goroutines,
		// The test's own proxy: its listener, and a link toxiproxy leaves behind when a
		// toxic is removed from a connection already reset (toxiproxy's, not sluice's).
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2.(*Proxy).server"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
		// A slow_close toxic holds its links for its delay, past the proxy's Stop.
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).write"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).read"),
	)
}

func logger() *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("SLUICE_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// scenario is what a fault scenario starts from: an info log kept for its assertions (the
// stack logs there when the scenario passes log in its amqp.Config), the ledger of side
// effects, its queue, and an idempotency guard, closed when the test ends.
type scenario struct {
	logs  *testenv.SyncBuffer
	log   *slog.Logger
	l     *ledger
	queue string
	guard *idempotency.Guard
}

// newScenario returns a scenario on a fresh queue named after name.
func newScenario(t *testing.T, name string) *scenario {
	t.Helper()
	sc := &scenario{logs: &testenv.SyncBuffer{}, l: newLedger(), queue: testenv.Name(name)}
	sc.log = slog.New(slog.NewTextHandler(sc.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	guard, err := idempotency.New(idempotency.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = guard.Close() })
	sc.guard = guard
	return sc
}

// config is the router config of a scenario's stack: the suite's retry policy, the
// scenario's guard, and concurrency and prefetch.
func (sc *scenario) config(concurrency, prefetch int) router.Config {
	return router.Config{Retry: retryConfig(), Guard: sc.guard, Concurrency: concurrency, Prefetch: prefetch}
}

// start runs the scenario's workload (each message takes work) on a stack of cfg.
func (sc *scenario) start(t *testing.T, cfg amqp.Config, concurrency, prefetch int, work time.Duration) *stack {
	t.Helper()
	return startStack(t, cfg, sc.config(concurrency, prefetch), workload(sc.l, sc.queue, work))
}

// stack is a running sluice stack on one broker.
type stack struct {
	broker *amqp.Broker
	s      *router.Stack
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// startStack connects a broker to urls and runs the stack build makes; it returns once
// every handler consumes. The stack is closed when t ends unless closed before.
func startStack(t *testing.T, cfg amqp.Config, rcfg router.Config, build func(b *amqp.Broker, s *router.Stack)) *stack {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = logger()
	}
	if rcfg.Logger == nil {
		rcfg.Logger = cfg.Logger
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, cfg)
	require.NoError(t, err)
	s, err := router.New(b, rcfg)
	require.NoError(t, err)
	build(b, s)
	runCtx, stop := context.WithCancel(context.Background())
	st := &stack{broker: b, s: s, cancel: stop, done: make(chan error, 1)}
	go func() { st.done <- s.Run(runCtx) }()
	select {
	case <-s.Running():
	case err := <-st.done:
		t.Fatalf("stack stopped at start: %v", err)
	case <-time.After(90 * time.Second):
		t.Fatal("stack did not start within 90s")
	}
	t.Cleanup(st.close)
	return st
}

// close stops the stack and closes its broker.
func (st *stack) close() {
	st.once.Do(func() {
		_ = st.s.Close()
		st.cancel()
		<-st.done
		_ = st.broker.Close()
	})
}

// msg builds a message with id and an idempotency key of its own.
func msg(id string) *message.Message {
	m := message.NewMessage(id, []byte(`{"id":"`+id+`"}`))
	return m
}

// waitSettled waits until every confirmed message of l reached its place, draining queue's
// DLQ as it goes.
func waitSettled(t *testing.T, l *ledger, r *testenv.Rabbit, queue string, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		l.drainDLQ(r, queue)
		return l.settled()
	}, within, 200*time.Millisecond, "every confirmed message processed or dead-lettered")
}

// Message id prefixes choose what the handler does.
const (
	failOnce  = "retry-"  // fails its first call (retryable): a delayed retry, then success
	poisonMsg = "poison-" // fails for good: the DLQ
)

// retryDelay is the scenarios' retry delay, without jitter, so the cascade's accuracy shows.
const retryDelay = 2 * time.Second

// workload registers the ledger's handler on queue: it records every call, fails
// failOnce messages once and poisonMsg messages for good, and records a side effect for
// every success. work is how long a call takes.
func workload(l *ledger, queue string, work time.Duration, opts ...router.HandlerOption) func(*amqp.Broker, *router.Stack) {
	return gatedWorkload(l, queue, work, nil, opts...)
}

// gatedWorkload is workload whose calls first wait for gate's read lock: a scenario holds
// the write lock to pause the handlers.
func gatedWorkload(l *ledger, queue string, work time.Duration, gate *sync.RWMutex, opts ...router.HandlerOption) func(*amqp.Broker, *router.Stack) {
	return func(b *amqp.Broker, s *router.Stack) {
		h := func(m *message.Message) error {
			if gate != nil {
				gate.RLock()
				gate.RUnlock() //nolint:staticcheck // a pause, not a critical section
			}
			if m.UUID == "" || len(m.Payload) == 0 {
				l.empty.Add(1)
				return nil
			}
			n := l.called(m.UUID)
			if work > 0 {
				select {
				case <-time.After(work):
				case <-m.Context().Done():
					return m.Context().Err()
				}
			}
			switch {
			case strings.HasPrefix(m.UUID, poisonMsg):
				return sluice.Permanent(fmt.Errorf("poison message %s", m.UUID))
			case strings.HasPrefix(m.UUID, failOnce) && n == 0:
				return fmt.Errorf("first call of %s fails", m.UUID)
			}
			l.effect(m.UUID)
			return nil
		}
		if err := s.Handle("faults-"+queue, queue, h, opts...); err != nil {
			panic(err)
		}
	}
}

// retryConfig is the stack's retry policy in the scenarios: one exact delay.
func retryConfig() retry.Config {
	return retry.Config{MaxRetries: 3, InitialDelay: retryDelay, Multiplier: 1, Jitter: retry.NoJitter}
}

// idFor is the id of the i-th message of a workload: every tenth fails once, every
// fiftieth is poison.
func idFor(prefix string, i int) string {
	switch {
	case i%50 == 49:
		return fmt.Sprintf("%s%s%05d", poisonMsg, prefix, i)
	case i%10 == 9:
		return fmt.Sprintf("%s%s%05d", failOnce, prefix, i)
	}
	return fmt.Sprintf("%s%05d", prefix, i)
}

// publishAll publishes ids to queue in batches of batch from workers goroutines with pub,
// recording each outcome, and returns how long it took.
func publishAll(l *ledger, pub *amqp.Publisher, queue string, ids []string, batch, workers int, timeout time.Duration) time.Duration {
	begin := time.Now()
	work := make(chan []string)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for chunk := range work {
				msgs := make([]*message.Message, len(chunk))
				for i, id := range chunk {
					msgs[i] = msg(id)
				}
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				err := pub.PublishTo(ctx, "", queue, msgs...)
				cancel()
				for _, id := range chunk {
					if l != nil {
						l.published(id, err)
					}
				}
			}
		}()
	}
	for i := 0; i < len(ids); i += batch {
		work <- ids[i:min(i+batch, len(ids))]
	}
	close(work)
	wg.Wait()
	return time.Since(begin)
}
