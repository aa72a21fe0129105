package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/mask"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// Tuning of the payments instances in these tests.
const (
	partitions  = 4
	concurrency = 4
	// prefetch is what cmd/payments sets: four times the concurrency, per partition.
	prefetch = 4 * concurrency
)

// dial connects a plain amqp091 client to url, closed when t ends.
func dial(t *testing.T, url string) *amqp091.Connection {
	t.Helper()
	conn, err := amqp091.Dial(url)
	require.NoError(t, err, "connect to %s", mask.URL(url))
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// names of one test's queues.
type names struct {
	queue, output string
}

func newNames(prefix string) names {
	return names{queue: testenv.Name(prefix + ".requested"), output: testenv.Name(prefix + ".succeeded")}
}

// cleanup deletes what the test's stacks declared, when t ends (the cluster is wiped when
// the package ends anyway; this matters with SLUICE_CLUSTER_KEEP=1).
func (n names) cleanup(t *testing.T, url string) {
	t.Cleanup(func() {
		conn, err := amqp091.Dial(url)
		if err != nil {
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		defer ch.Close()
		for k := 0; k < partitions; k++ {
			_, _ = ch.QueueDelete(topology.Partition(n.queue, k), false, false, false)
		}
		for _, q := range []string{n.queue, topology.DLQ(n.queue), n.output, topology.DLQ(n.output)} {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
		_ = ch.ExchangeDelete(topology.PartitionExchange(n.queue), false, false)
	})
}

// payment is one request the producer sends.
type payment struct {
	messageID, paymentID string
}

func paymentBody(id string) []byte {
	return []byte(fmt.Sprintf(`{"payment_id":%q,"order_id":"ord_%s","amount_cents":1299,"currency":"EUR","source":"tok_visa"}`, id, id))
}

// workload returns total requests over ids distinct payments: every payment once, and
// total-ids duplicates (same payment_id, own message id) of recent payments, some right
// behind their original (still in flight), some later (done). Deterministic per seed.
func workload(run string, total, ids int, seed uint64) []payment {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	out := make([]payment, 0, total)
	dups := total - ids
	for i := 0; i < ids; i++ {
		pid := fmt.Sprintf("pay_%s_%04d", run, i)
		out = append(out, payment{messageID: fmt.Sprintf("m_%s_%04d", run, i), paymentID: pid})
		// Spread the duplicates evenly over the run.
		for d := i * dups / ids; d < (i+1)*dups/ids; d++ {
			orig := fmt.Sprintf("pay_%s_%04d", run, i-min(rng.IntN(40), i))
			out = append(out, payment{messageID: fmt.Sprintf("m_%s_dup%04d", run, d), paymentID: orig})
		}
	}
	return out
}

// producer publishes requests the way docs/scaling.md tells a producer to: to the partition
// exchange, with the payment_id as routing key, persistent, confirmed.
type producer struct {
	ch *amqp091.Channel
}

func newProducer(t *testing.T, url string) *producer {
	t.Helper()
	ch, err := dial(t, url).Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	return &producer{ch: ch}
}

// publish sends ps to queue's partition exchange, batch by batch, every batch waiting for
// its confirms; perSecond > 0 paces the batches to that rate. It returns once all are
// confirmed. It may run in a goroutine of its own: it reports, never fails the test.
func (p *producer) publish(queue string, ps []payment, perSecond int) error {
	const batch = 50
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for i := 0; i < len(ps); i += batch {
		if perSecond > 0 {
			due := start.Add(time.Duration(i) * time.Second / time.Duration(perSecond))
			time.Sleep(time.Until(due)) // pacing the load, not waiting for a result
		}
		var confirms []*amqp091.DeferredConfirmation
		for _, pm := range ps[i:min(i+batch, len(ps))] {
			dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, topology.PartitionExchange(queue), pm.paymentID, true, false, amqp091.Publishing{
				MessageId:    pm.messageID,
				ContentType:  "application/json",
				DeliveryMode: amqp091.Persistent,
				Body:         paymentBody(pm.paymentID),
			})
			if err != nil {
				return fmt.Errorf("publish %s: %w", pm.messageID, err)
			}
			confirms = append(confirms, dc)
		}
		for _, dc := range confirms {
			ok, err := dc.WaitContext(ctx)
			if err != nil {
				return fmt.Errorf("confirm of a publish: %w", err)
			}
			if !ok {
				return fmt.Errorf("publish nacked by the broker")
			}
		}
	}
	return nil
}

// publishInBackground runs publish in a goroutine; the channel yields its result.
func (p *producer) publishInBackground(queue string, ps []payment, perSecond int) <-chan error {
	done := make(chan error, 1)
	go func() { done <- p.publish(queue, ps, perSecond) }()
	return done
}

// events counts the success events on output, per payment_id.
type events struct {
	mu     sync.Mutex
	counts map[string]int
	total  int
	last   time.Time
}

func collect(t *testing.T, url, output string) *events {
	t.Helper()
	ch, err := dial(t, url).Channel()
	require.NoError(t, err)
	deliveries, err := ch.Consume(output, "", true, false, false, false, nil)
	require.NoError(t, err)
	e := &events{counts: map[string]int{}}
	go func() {
		for d := range deliveries {
			var ev example_payment.Succeeded
			if err := json.Unmarshal(d.Body, &ev); err != nil {
				t.Errorf("success event is not JSON: %q", d.Body)
				continue
			}
			e.mu.Lock()
			e.counts[ev.PaymentID]++
			e.total++
			e.last = time.Now()
			e.mu.Unlock()
		}
	}()
	t.Cleanup(func() { _ = ch.Close() })
	return e
}

func (e *events) distinct() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.counts)
}

func (e *events) snapshot() (counts map[string]int, total int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	counts = make(map[string]int, len(e.counts))
	for k, v := range e.counts {
		counts[k] = v
	}
	return counts, e.total
}

// waitAll waits until every payment of ids has an event, then until no event came for
// quiet (a late duplicate would show then), and returns the counts.
func (e *events) waitAll(t *testing.T, ids int, timeout, quiet time.Duration) map[string]int {
	t.Helper()
	require.Eventually(t, func() bool { return e.distinct() >= ids }, timeout, 20*time.Millisecond,
		"success events for all %d payments", ids)
	require.Eventually(t, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return time.Since(e.last) >= quiet
	}, timeout, 50*time.Millisecond, "the output queue goes quiet")
	counts, _ := e.snapshot()
	return counts
}

// instance is one payments process.
type instance struct {
	name    string
	cmd     *exec.Cmd
	logs    *testenv.SyncBuffer
	metrics string        // URL of its Prometheus endpoint
	exited  chan struct{} // closed when the process has ended
}

// startInstance runs `payments serve` on n, partitioned, on quorum queues, connecting to
// urls in that order (failing over along them). It is stopped when t ends.
func startInstance(t *testing.T, name string, n names, urls []string) *instance {
	t.Helper()
	bin := testenv.Binary(t, "./cmd/payments")
	port := testenv.FreePort(t)
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(),
		"AMQP_URL="+strings.Join(urls, ","),
		"AMQP_QUEUE_TYPE=quorum",
		"PAYMENTS_PARTITIONS="+strconv.Itoa(partitions),
		"PAYMENTS_CONCURRENCY="+strconv.Itoa(concurrency),
		"PAYMENTS_QUEUE="+n.queue,
		"PAYMENTS_OUTPUT_QUEUE="+n.output,
		"METRICS_ADDR=127.0.0.1:"+strconv.Itoa(port),
		"RETRY_MAX_RETRIES=3",
		"RETRY_INITIAL_DELAY=100ms",
		"RETRY_MAX_DELAY=400ms",
		"RETRY_JITTER=0",
		"OTEL_EXPORTER_OTLP_ENDPOINT=",
		"OTEL_TRACES_EXPORTER=none",
		"IDEMPOTENCY_SNAPSHOT=",
	)
	logs := &testenv.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	in := &instance{name: name, cmd: cmd, logs: logs, metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", port), exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(in.exited)
	}()
	t.Cleanup(func() {
		in.stop()
		if t.Failed() {
			t.Logf("instance %s logs:\n%s", name, logs.String())
		}
	})
	return in
}

// stop ends the process gracefully (SIGTERM; in-flight payments finish), or kills it.
func (in *instance) stop() {
	select {
	case <-in.exited:
		return
	default:
	}
	_ = in.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-in.exited:
	case <-time.After(40 * time.Second):
		_ = in.cmd.Process.Kill()
		<-in.exited
	}
}

// kill ends the process at once, like a crash.
func (in *instance) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, in.cmd.Process.Signal(syscall.SIGKILL))
	select {
	case <-in.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("instance %s did not die on SIGKILL", in.name)
	}
}

var ackedLine = regexp.MustCompile(`^sluice_messages_total\{([^}]*)\} ([0-9.e+]+)$`)
var handlerLabel = regexp.MustCompile(`handler="payments#([0-9]+)"`)

// acked returns, per partition, how many messages this instance acked there (successes and
// duplicates alike): a partition it never consumed is absent. Nil when the endpoint does
// not answer (the process is gone).
func (in *instance) acked() map[int]int {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(in.metrics)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	out := map[int]int{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := ackedLine.FindStringSubmatch(sc.Text())
		if m == nil || !strings.Contains(m[1], `outcome="ack"`) && !strings.Contains(m[1], `outcome="duplicate"`) {
			continue
		}
		h := handlerLabel.FindStringSubmatch(m[1])
		if h == nil {
			continue
		}
		k, _ := strconv.Atoi(h[1])
		v, _ := strconv.ParseFloat(m[2], 64)
		if v > 0 {
			out[k] += int(v)
		}
	}
	return out
}

// waitMetrics waits until the instance serves metrics.
func (in *instance) waitMetrics(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool { return in.acked() != nil }, 60*time.Second, 50*time.Millisecond,
		"instance %s serves metrics", in.name)
}

// waitClaimed waits until every partition of queue has an active consumer: the instances
// have settled which takes which.
func waitClaimed(t *testing.T, url, queue string) {
	t.Helper()
	conn := dial(t, url)
	require.Eventually(t, func() bool {
		for k := 0; k < partitions; k++ {
			ch, err := conn.Channel()
			if err != nil {
				return false
			}
			q, err := ch.QueueDeclarePassive(topology.Partition(queue, k), true, false, false, false, nil)
			_ = ch.Close()
			if err != nil || q.Consumers == 0 {
				return false
			}
		}
		return true
	}, 90*time.Second, 100*time.Millisecond, "every partition of %s has a consumer", queue)
}

// owners maps each partition to the instances that acked messages on it.
func owners(ins ...*instance) map[int][]string {
	out := map[int][]string{}
	for _, in := range ins {
		for k := range in.acked() {
			out[k] = append(out[k], in.name)
		}
	}
	return out
}

// overOnce returns the payments with more than one success event and the extra events.
func overOnce(counts map[string]int) (ids []string, extra int) {
	for id, n := range counts {
		if n > 1 {
			ids = append(ids, id)
			extra += n - 1
		}
	}
	return ids, extra
}
