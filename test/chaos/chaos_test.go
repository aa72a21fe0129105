//go:build chaos

// Package chaos holds the chaos test: the payment service, as its own process, consumes
// 5,000 requests while RabbitMQ is restarted, the service is killed, and the broker drops
// every connection. Afterwards every request must be accounted for.
//
// The test runs its own RabbitMQ node (testenv.StartNode) so that restarting it cannot
// disturb any other test: it never shares a broker with them. Run it with `make test-chaos`.
package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/demo/paymentdemo"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

const (
	requests    = 5000
	maxRetries  = 3
	concurrency = 8
	prefetch    = concurrency * 4
	// snapshotEvery is how often the service writes its idempotency store.
	snapshotEvery = 200 * time.Millisecond
	// publishRate is the producer's pace (requests per second).
	publishRate = 125
	queue       = example_payment.QueueRequested
	output      = example_payment.QueueSucceeded
)

// dlq is the payments queue's dead-letter queue.
var dlq = topology.DLQ(queue)

// service is the payments binary, restartable.
type service struct {
	t    *testing.T
	bin  string
	env  []string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	logs *os.File
}

func (s *service) start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd := exec.Command(s.bin, "serve")
	cmd.Env = s.env
	cmd.Stdout, cmd.Stderr = s.logs, s.logs
	require.NoError(s.t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
}

func (s *service) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
}

func (s *service) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// client is a plain amqp091 client that reconnects by itself, as the test's producer and
// observer must survive the same faults as the service.
type client struct {
	url  string
	mu   sync.Mutex
	conn *amqp091.Connection
	ch   *amqp091.Channel
}

func (c *client) channel() (*amqp091.Channel, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch != nil && !c.ch.IsClosed() {
		return c.ch, nil
	}
	if c.conn == nil || c.conn.IsClosed() {
		conn, err := amqp091.Dial(c.url)
		if err != nil {
			return nil, err
		}
		c.conn = conn
	}
	ch, err := c.conn.Channel()
	if err != nil {
		_ = c.conn.Close()
		c.conn = nil
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	c.ch = ch
	return ch, nil
}

func (c *client) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		_ = c.conn.Close()
	}
	c.conn, c.ch = nil, nil
}

// publish publishes until RabbitMQ confirms, reconnecting as often as needed. A publish
// whose confirm was lost is sent again: the request may arrive twice, which the service's
// idempotency must absorb.
func (c *client) publish(ctx context.Context, to, msgID string, body []byte) error {
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		ch, err := c.channel()
		if err == nil {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			var dc *amqp091.DeferredConfirmation
			dc, err = ch.PublishWithDeferredConfirmWithContext(pctx, "", to, true, false, amqp091.Publishing{
				MessageId: msgID, ContentType: "application/json", DeliveryMode: amqp091.Persistent, Body: body,
			})
			if err == nil {
				var ok bool
				ok, err = dc.WaitContext(pctx)
				if err == nil && !ok {
					err = errors.New("nacked")
				}
			}
			cancel()
			if err == nil {
				return nil
			}
		}
		c.reset()
		time.Sleep(200 * time.Millisecond)
	}
}

// count returns a queue's ready messages, or -1 while the broker is unreachable.
func (c *client) count(name string) int {
	ch, err := c.channel()
	if err != nil {
		c.reset()
		return -1
	}
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		c.reset()
		return -1
	}
	return q.Messages
}

func TestChaos(t *testing.T) {
	node := testenv.StartNode(t, testenv.NodeOptions{Name: "sluice_chaos"})
	t.Logf("chaos node %s on port %d started in %s", node.Name, node.Port, node.StartTime)
	svc := startChaosService(t, node)
	obs := &client{url: node.URL()}
	require.Eventually(t, func() bool { return obs.count(queue) >= 0 && obs.count(output) >= 0 }, 60*time.Second, 100*time.Millisecond, "service declared its queues")

	mix := paymentdemo.Mix(requests, 20261129)
	ids := make([]string, len(mix))
	for i := range mix {
		ids[i] = fmt.Sprintf("chaos-%05d", i)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()

	c := &chaosRun{t: t, ctx: ctx, node: node, svc: svc, obs: obs}
	pubDone := c.produce(mix, ids)
	faults, recovery := c.injectFaults()
	require.NoError(t, <-pubDone, "producer")
	t.Logf("published %d requests", c.published.Load())
	c.waitSettled()
	events, dead := c.drain()
	lost, wrong, shifted, duplicateRequests, doubles := accountFor(t, mix, ids, events, dead)

	t.Logf("faults survived: %v", faults)
	for _, f := range faults {
		t.Logf("  %-24s recovered in %s", f, recovery[f].Round(10*time.Millisecond))
	}
	t.Logf("requests %d (%d duplicates in the mix), success events %d, dead letters %d, lost %d, wrong type %d, flaky payments settled the other way by the faults %d, double charges %d",
		len(mix), duplicateRequests, len(events)+doubles, len(dead), lost, wrong, shifted, doubles)

	if lost > 0 {
		// Where the broker still holds messages says where the lost ones stopped.
		out, err := node.Ctl("list_queues", "--no-table-headers", "name", "type", "messages", "messages_unacknowledged")
		t.Logf("queues at the end (err %v):\n%s", err, out)
	}
	assert.Zero(t, lost, "requests lost")
	assert.Zero(t, wrong, "requests dead-lettered with the wrong error type")
	// The bound on double charges. Broker restarts and dropped connections cost nothing:
	// the same process remembers what it did, and a redelivered message is acked as a
	// duplicate. The SIGKILL is what can charge twice: the idempotency store lives in
	// memory and is written to disk every snapshotEvery, so the new process does not know
	// (a) the payments in flight at the kill, whose output may be confirmed while their
	// ack was never sent — at most the prefetch — and (b) the payments completed after the
	// last snapshot, whose duplicates may arrive later — at most what the service
	// completes in one interval, which is below the producer's rate (every request is
	// consumed once, retries aside) times the interval, doubled for retries finishing.
	bound := prefetch + 2*int(publishRate*snapshotEvery.Seconds()+1)
	t.Logf("double-charge bound: prefetch %d + 2 × %d requests/s × %s = %d", prefetch, publishRate, snapshotEvery, bound)
	assert.LessOrEqual(t, doubles, bound, "double charges beyond what the kill explains")
}

// startChaosService starts the payments service on node, its logs shown if t fails.
func startChaosService(t *testing.T, node *testenv.Node) *service {
	return startService(t, node,
		fmt.Sprintf("RETRY_MAX_RETRIES=%d", maxRetries),
		"RETRY_INITIAL_DELAY=100ms", "RETRY_MAX_DELAY=1s", "RETRY_JITTER=0.1",
		fmt.Sprintf("PAYMENTS_CONCURRENCY=%d", concurrency),
		// The idempotency store is written every 200ms, so the SIGKILL forgets only
		// what completed in the last 200ms (see the bound below).
		"IDEMPOTENCY_SNAPSHOT="+filepath.Join(t.TempDir(), "idempotency.snap"),
		"IDEMPOTENCY_SNAPSHOT_INTERVAL="+snapshotEvery.String(),
	)
}

// startService starts `payments serve` on node with env added to the test's environment,
// its logs shown if t fails, and stops it when t ends.
func startService(t *testing.T, node *testenv.Node, env ...string) *service {
	logs, err := os.CreateTemp("", "sluice-chaos-service-*.log")
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logs.Name())
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			t.Logf("service logs (tail):\n%s", b)
		}
		_ = logs.Close()
		_ = os.Remove(logs.Name())
	})
	svc := &service{
		t:    t,
		bin:  testenv.Binary(t, "./cmd/payments"),
		logs: logs,
		env: append(append(os.Environ(),
			"AMQP_URL="+node.URL(),
			"OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_TRACES_EXPORTER=none",
		), env...),
	}
	svc.start()
	t.Cleanup(svc.stop)
	return svc
}

// chaosRun is what TestChaos's steps share: the node, the service, a plain client
// observing the queues, and the producer's count of confirmed requests.
type chaosRun struct {
	t         *testing.T
	ctx       context.Context
	node      *testenv.Node
	svc       *service
	obs       *client
	published atomic.Int64
	// to is the queue produce publishes to (queue when empty); outcomes, when set, is the
	// progress the faults' recovery is measured by (the outcome queues' counts when nil).
	to       string
	outcomes func() int
}

// produce publishes mix in the background; the channel gets the producer's error or nil.
// The producer paces 5,000 requests over about 40 seconds, so faults land mid-flow.
func (c *chaosRun) produce(mix []paymentdemo.Request, ids []string) <-chan error {
	ctx, node, published := c.ctx, c.node, &c.published
	to := c.to
	if to == "" {
		to = queue
	}
	pubDone := make(chan error, 1)
	go func() {
		pub := &client{url: node.URL()}
		defer pub.reset()
		for i, r := range mix {
			if err := pub.publish(ctx, to, ids[i], r.Body); err != nil {
				pubDone <- err
				return
			}
			published.Add(1)
			time.Sleep(time.Second / publishRate)
		}
		pubDone <- nil
	}()
	return pubDone
}

// progress is the number of settled outcomes visible in the broker, or -1 when it cannot
// be read.
func (c *chaosRun) progress() int {
	if c.outcomes != nil {
		return c.outcomes()
	}
	obs := c.obs
	a, b := obs.count(output), obs.count(dlq)
	if a < 0 || b < 0 {
		return -1
	}
	return a + b
}

// recovered is the time from a fault's end until progress grows again.
func (c *chaosRun) recovered(what string) time.Duration {
	t, ctx, progress := c.t, c.ctx, c.progress
	begin := time.Now()
	deadline, _ := ctx.Deadline()
	base := -1
	require.Eventually(t, func() bool { base = progress(); return base >= 0 }, time.Until(deadline), 100*time.Millisecond,
		"the outcome queues readable after %s", what)
	var d time.Duration
	if !assert.Eventually(t, func() bool {
		if progress() <= base {
			return false
		}
		d = time.Since(begin)
		return true
	}, 3*time.Minute-time.Since(begin), 50*time.Millisecond, "no progress within 3 minutes after %s", what) {
		return 0
	}
	t.Logf("recovered from %s in %s", what, d.Round(10*time.Millisecond))
	return d
}

// waitPublished waits until the producer published n requests.
func (c *chaosRun) waitPublished(n int64) {
	t, ctx, published := c.t, c.ctx, &c.published
	deadline, _ := ctx.Deadline()
	assert.Eventually(t, func() bool { return published.Load() >= n || ctx.Err() != nil }, time.Until(deadline), 50*time.Millisecond)
}

// injectFaults injects the four faults as the producer reaches its milestones, and
// returns them in order with the time each took to recover from.
func (c *chaosRun) injectFaults() ([]string, map[string]time.Duration) {
	t, node, svc, recovered, waitPublished := c.t, c.node, c.svc, c.recovered, c.waitPublished
	var faults []string
	recovery := map[string]time.Duration{}

	waitPublished(600)
	faults = append(faults, "stop_app/start_app")
	out, err := node.Ctl("stop_app")
	require.NoError(t, err, out)
	time.Sleep(3 * time.Second)
	out, err = node.Ctl("start_app")
	require.NoError(t, err, out)
	recovery["stop_app/start_app"] = recovered("stop_app/start_app")

	waitPublished(1800)
	faults = append(faults, "SIGKILL of the service")
	svc.kill()
	svc.start()
	recovery["SIGKILL of the service"] = recovered("SIGKILL of the service")

	waitPublished(2800)
	faults = append(faults, "close_all_connections")
	out, err = node.Ctl("close_all_connections", "chaos test")
	require.NoError(t, err, out)
	recovery["close_all_connections"] = recovered("close_all_connections")

	waitPublished(3800)
	faults = append(faults, "whole node restart")
	node.Stop()
	time.Sleep(2 * time.Second)
	require.NoError(t, node.Start())
	recovery["whole node restart"] = recovered("whole node restart")
	return faults, recovery
}

// waitSettled waits until every request settled.
func (c *chaosRun) waitSettled() {
	t, ctx, node, obs, progress := c.t, c.ctx, c.node, c.obs, c.progress
	// Settled: the consumed queue and the delay cascade are empty and the outcome counts
	// have not moved for 8s (longer than the longest retry delay). The cascade is asked,
	// not assumed empty: a message whose delay ran out while the node restarted can wait
	// there for RabbitMQ's dead-letter worker to retry its forward (up to its
	// dead_letter_worker_publisher_confirm_timeout, 3 minutes by default).
	last, stableSince := -2, time.Now()
	settleStart, heldInCascade := time.Now(), 0
	for {
		require.NoError(t, ctx.Err(), "requests did not settle")
		p := progress()
		held := cascadeMessages(t, node)
		heldInCascade = max(heldInCascade, held)
		if p != last || obs.count(queue) != 0 || held != 0 {
			last, stableSince = p, time.Now()
		} else if time.Since(stableSince) > 8*time.Second {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("settled in %s after the producer finished; at most %d messages were seen in the delay cascade meanwhile",
		time.Since(settleStart).Round(time.Second), heldInCascade)
}

// drain takes every outcome with the plain client: success events counted by payment id,
// and the DLQ's error type by message id.
func (c *chaosRun) drain() (map[string]int, map[string]string) {
	t, obs := c.t, c.obs
	// Drain the outcomes with the plain client.
	events := map[string]int{}
	dead := map[string]string{}
	ch, err := obs.channel()
	require.NoError(t, err)
	for {
		d, ok, err := ch.Get(output, true)
		require.NoError(t, err)
		if !ok {
			break
		}
		var ev example_payment.Succeeded
		require.NoError(t, json.Unmarshal(d.Body, &ev))
		events[ev.PaymentID]++
	}
	for {
		d, ok, err := ch.Get(dlq, true)
		require.NoError(t, err)
		if !ok {
			break
		}
		dead[d.MessageId], _ = d.Headers["x-error-type"].(string)
	}
	return events, dead
}

// accountFor accounts for every request of mix against the outcomes, failing t for each
// that is lost or wrong.
func accountFor(t *testing.T, mix []paymentdemo.Request, ids []string, events map[string]int, dead map[string]string) (lost, wrong, shifted, duplicateRequests, doubles int) {
	succeededPayments := map[string]bool{}
	for i, r := range mix {
		exp := r.ExpectWithin(maxRetries + 1)
		switch exp.Outcome {
		case paymentdemo.ExpectDuplicate:
			duplicateRequests++
			continue
		case paymentdemo.ExpectSucceeded:
			succeededPayments[r.PaymentID] = true
			if events[r.PaymentID] > 0 {
				continue
			}
			// A kill resets the simulated gateway's attempt counter, so a flaky payment
			// in flight then may need more attempts than its retries allow.
			if r.Kind == paymentdemo.KindFlaky && dead[ids[i]] == example_payment.ErrorTypeGatewayTimeout {
				shifted++
				continue
			}
			lost++
			t.Errorf("request %s (%s, payment %s) expected to succeed: no event, DLQ %q", ids[i], r.Kind, r.PaymentID, dead[ids[i]])
		case paymentdemo.ExpectDeadLettered:
			typ, ok := dead[ids[i]]
			// A flaky payment counts its failures in the simulated gateway's memory: a
			// redelivered copy (its ack lost with a connection) and its retry copy both
			// advance that count, so one copy can succeed within its retries, while the
			// other may still run out of them and be dead-lettered too. Either way it is
			// accounted for.
			if r.Kind == paymentdemo.KindFlaky && events[r.PaymentID] > 0 {
				shifted++
				succeededPayments[r.PaymentID] = true
				if ok && typ != exp.ErrorType {
					wrong++
					t.Errorf("request %s (%s): DLQ error type %q, want %q", ids[i], r.Kind, typ, exp.ErrorType)
				}
				continue
			}
			if !ok {
				lost++
				t.Errorf("request %s (%s) expected in the DLQ: not there", ids[i], r.Kind)
				continue
			}
			if typ != exp.ErrorType {
				wrong++
				t.Errorf("request %s (%s): DLQ error type %q, want %q", ids[i], r.Kind, typ, exp.ErrorType)
			}
		}
	}
	for pid, n := range events {
		if !succeededPayments[pid] {
			t.Errorf("success event for payment %s that must not succeed", pid)
		}
		doubles += n - 1
	}
	return lost, wrong, shifted, duplicateRequests, doubles
}

// cascadeMessages is how many messages the delay cascade's queues hold on node, counting
// those a quorum queue keeps until its dead-letter worker has forwarded them.
func cascadeMessages(t *testing.T, node *testenv.Node) int {
	t.Helper()
	out, err := node.Ctl("list_queues", "--quiet", "--no-table-headers", "name", "messages")
	require.NoError(t, err, out)
	n := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || !strings.HasPrefix(f[0], topology.DelayExchangePrefix) {
			continue
		}
		k, err := strconv.Atoi(f[1])
		require.NoError(t, err, "list_queues line %q", line)
		n += k
	}
	return n
}
