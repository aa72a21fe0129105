package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

func testLogger() *slog.Logger {
	if os.Getenv("SLUICE_TEST_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newBroker connects sluice's broker to the cluster with quorum queues.
func newBroker(t *testing.T, urls []string) *amqp.Broker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: urls, QueueType: amqp.QueueQuorum, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func TestClusterIsFormed(t *testing.T) {
	urls := nodeURLs(t)
	require.Len(t, urls, 3)
	var status struct {
		RunningNodes []string `json:"running_nodes"`
	}
	require.NoError(t, json.Unmarshal([]byte(ctl(t, 1, "-q", "cluster_status", "--formatter", "json")), &status))
	assert.Len(t, status.RunningNodes, 3, "three running members: %v", status.RunningNodes)
	for _, u := range urls {
		assert.NotContains(t, u, ":5672/", "the shared node is not part of the cluster")
	}
	if clusterState.startTime > 0 {
		t.Logf("cluster started in %s (%s)", clusterState.startTime.Round(100*time.Millisecond), strings.TrimSpace(clusterState.startLog))
	}
}

// queueInfo is a row of rabbitmqctl list_queues.
type queueInfo struct {
	Name    string   `json:"name"`
	Type    string   `json:"type"`
	Members []string `json:"members"`
	// Arguments are [name, AMQP type, value] triples.
	Arguments [][]any `json:"arguments"`
}

func (q queueInfo) arg(name string) any {
	for _, a := range q.Arguments {
		if len(a) == 3 && a[0] == name {
			return a[2]
		}
	}
	return nil
}

func listQueues(t *testing.T, prefix string) map[string]queueInfo {
	t.Helper()
	var rows []queueInfo
	out := ctl(t, 1, "-q", "list_queues", "name", "type", "members", "arguments", "--formatter", "json")
	require.NoError(t, json.Unmarshal([]byte(out), &rows), "list_queues output: %s", out)
	got := map[string]queueInfo{}
	for _, r := range rows {
		if strings.HasPrefix(r.Name, prefix) {
			got[r.Name] = r
		}
	}
	return got
}

// getAll takes every message from queue (auto-ack) and returns their bodies. Quorum
// queues with single-active-consumer refuse basic.get: see consumeFor for those.
func getAll(t *testing.T, conn *amqp091.Connection, queue string) []string {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	var out []string
	for {
		d, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			return out
		}
		out = append(out, string(d.Body))
	}
}

// consumeFor consumes queues (auto-ack) until want messages came or timeout, and returns
// the bodies per queue.
func consumeFor(t *testing.T, conn *amqp091.Connection, want int, timeout time.Duration, queues ...string) map[string][]string {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	type delivery struct{ queue, body string }
	all := make(chan delivery)
	stop := make(chan struct{})
	defer close(stop)
	for _, q := range queues {
		ds, err := ch.Consume(q, "", true, false, false, false, nil)
		require.NoError(t, err, "consume %s", q)
		go func() {
			for d := range ds {
				select {
				case all <- delivery{q, string(d.Body)}:
				case <-stop:
					return
				}
			}
		}()
	}
	got := map[string][]string{}
	deadline := time.After(timeout)
	for n := 0; n < want; n++ {
		select {
		case d := <-all:
			got[d.queue] = append(got[d.queue], d.body)
		case <-deadline:
			t.Fatalf("%d of %d messages came within %s: %v", n, want, timeout, got)
		}
	}
	return got
}

func TestPartitionTopology(t *testing.T) {
	urls := nodeURLs(t)
	n := newNames("cluster.topology")
	n.cleanup(t, urls[0])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first := newBroker(t, urls)
	require.NoError(t, first.DeclarePartitioned(ctx, n.queue, partitions))

	t.Run("quorum partitions with single active consumer on every node", func(t *testing.T) {
		qs := listQueues(t, n.queue)
		for k := 0; k < partitions; k++ {
			q, ok := qs[topology.Partition(n.queue, k)]
			require.True(t, ok, "partition %d declared: %v", k, qs)
			assert.Equal(t, "quorum", q.Type)
			assert.Len(t, q.Members, 3, "replicas of %s", q.Name)
			assert.Equal(t, true, q.arg("x-single-active-consumer"), "arguments of %s: %v", q.Name, q.Arguments)
			assert.Equal(t, topology.DeadLetterExchange, q.arg("x-dead-letter-exchange"))
			assert.Equal(t, q.Name, q.arg("x-dead-letter-routing-key"), "RabbitMQ's own dead letters (delivery limit) reach the shared DLQ too")
		}
		dl, ok := qs[topology.DLQ(n.queue)]
		require.True(t, ok, "the shared dead-letter queue %s", topology.DLQ(n.queue))
		assert.Equal(t, "quorum", dl.Type)
		assert.Len(t, qs, partitions+1, "no queue named %s itself, no per-partition DLQ: %v", n.queue, qs)
	})

	conn := dial(t, urls[2])
	keys := make([]string, 200)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%03d", i)
	}
	parts := make([]string, partitions)
	for k := range parts {
		parts[k] = topology.Partition(n.queue, k)
	}
	route := func(b *amqp.Broker) map[string]string {
		for _, k := range keys {
			require.NoError(t, b.PublishPartitioned(ctx, n.queue, k, message.NewMessage(k+"-"+fmt.Sprint(time.Now().UnixNano()), []byte(k))))
		}
		at := map[string]string{}
		for q, bodies := range consumeFor(t, conn, len(keys), 20*time.Second, parts...) {
			for _, body := range bodies {
				at[body] = q
			}
		}
		return at
	}

	t.Run("a key always goes to the same partition, whichever instance declared", func(t *testing.T) {
		before := route(first)
		// Another instance, on another node, declares the same partitions again.
		second := newBroker(t, []string{urls[2], urls[1], urls[0]})
		require.NoError(t, second.DeclarePartitioned(ctx, n.queue, partitions))
		after := route(second)
		assert.Equal(t, before, after)
		share := map[string]int{}
		for _, q := range before {
			share[q]++
		}
		t.Logf("keys per partition: %v", share)
		for _, q := range parts {
			assert.Greater(t, share[q], len(keys)/partitions/3, "partition %s gets a fair share of keys", q)
		}
	})

	t.Run("dead letters of every partition land in the shared DLQ", func(t *testing.T) {
		for k := 0; k < partitions; k++ {
			require.NoError(t, first.DeadLetter(ctx, topology.Partition(n.queue, k), message.NewMessage(fmt.Sprint("dead-", k), []byte("x"))))
		}
		assert.Len(t, getAll(t, conn, topology.DLQ(n.queue)), partitions)
	})

	t.Run("a delayed message comes back to its partition", func(t *testing.T) {
		part := topology.Partition(n.queue, 2)
		require.NoError(t, first.Delay(ctx, part, 50*time.Millisecond, message.NewMessage("delayed", []byte("delayed"))))
		got := consumeFor(t, conn, 1, 20*time.Second, parts...)
		assert.Equal(t, map[string][]string{part: {"delayed"}}, got)
	})

	t.Run("a plain publish to the queue name is refused", func(t *testing.T) {
		err := first.Publisher().Publish(n.queue, message.NewMessage("plain", []byte("x")))
		require.ErrorIs(t, err, amqp.ErrUnroutable, "producers must publish to the partition exchange")
	})

	t.Run("fewer partitions than exist is refused", func(t *testing.T) {
		err := first.DeclarePartitioned(ctx, n.queue, partitions-1)
		require.ErrorIs(t, err, broker.ErrInequivalent)
		assert.Contains(t, err.Error(), topology.Partition(n.queue, partitions-1))
	})
}

// attempt is one handler call of the in-process stack.
type attempt struct {
	key, queue string
	replayed   bool
}

// TestPartitionedRetryAndReplayStayOnPartition runs the stack in-process on the cluster:
// a retry goes through the delay cascade and a dead letter through the shared DLQ and a
// replay, and each comes back to the partition the key lives in.
func TestPartitionedRetryAndReplayStayOnPartition(t *testing.T) {
	urls := nodeURLs(t)
	n := newNames("cluster.retry")
	n.cleanup(t, urls[0])
	b := newBroker(t, urls)
	s, err := router.New(b, router.Config{
		Logger: testLogger(),
		Retry:  retry.Config{MaxRetries: 3, InitialDelay: 50 * time.Millisecond, MaxDelay: 100 * time.Millisecond, Jitter: retry.NoJitter},
	})
	require.NoError(t, err)
	var mu sync.Mutex
	var seen []attempt
	require.NoError(t, s.Handle("work", n.queue, func(msg *message.Message) error {
		key := string(msg.Payload)
		replayed := msg.Metadata.Get(headers.ReplayCount) != ""
		mu.Lock()
		seen = append(seen, attempt{key: key, queue: message.SubscribeTopicFromCtx(msg.Context()), replayed: replayed})
		mu.Unlock()
		switch {
		case strings.HasPrefix(key, "poison") && !replayed:
			return sluice.Permanent(errors.New("refused until replayed"))
		case !strings.HasPrefix(key, "poison") && sluice.RetryCount(msg.Metadata) == 0:
			return errors.New("first attempt fails")
		}
		return nil
	}, router.WithPartitions(partitions), router.WithConcurrency(2)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		_ = s.Close()
		cancel()
		<-done
	})
	select {
	case <-s.Running():
	case err := <-done:
		t.Fatalf("stack stopped: %v", err)
	case <-time.After(90 * time.Second):
		t.Fatal("stack did not start")
	}

	var keys []string
	for i := 0; i < 16; i++ {
		keys = append(keys, fmt.Sprintf("key-%02d", i))
	}
	for i := 0; i < 4; i++ {
		keys = append(keys, fmt.Sprintf("poison-%d", i))
	}
	pctx, pcancel := context.WithTimeout(context.Background(), time.Minute)
	defer pcancel()
	for _, k := range keys {
		require.NoError(t, b.PublishPartitioned(pctx, n.queue, k, message.NewMessage("m-"+k, []byte(k))))
	}
	byKey := func() map[string][]attempt {
		mu.Lock()
		defer mu.Unlock()
		out := map[string][]attempt{}
		for _, a := range seen {
			out[a.key] = append(out[a.key], a)
		}
		return out
	}
	conn := dial(t, urls[1])
	require.Eventually(t, func() bool {
		ch, err := conn.Channel()
		if err != nil {
			return false
		}
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(topology.DLQ(n.queue), true, false, false, false, nil)
		return err == nil && q.Messages == 4 && len(byKey()) == len(keys) && func() bool {
			for k, as := range byKey() {
				if !strings.HasPrefix(k, "poison") && len(as) < 2 {
					return false
				}
			}
			return true
		}()
	}, 60*time.Second, 50*time.Millisecond, "retries done and poison dead-lettered")

	op := dlq.Operator{Conn: conn}
	var replayed []dlq.Moved
	op.OnMoved = func(m dlq.Moved) { replayed = append(replayed, m) }
	_, err = op.Replay(pctx, n.queue, dlq.Selector{All: true}, dlq.Options{})
	require.NoError(t, err)
	require.Len(t, replayed, 4)
	require.Eventually(t, func() bool {
		for k, as := range byKey() {
			if strings.HasPrefix(k, "poison") && len(as) < 2 {
				return false
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond, "replayed messages handled")

	destination := map[string]string{}
	for _, r := range replayed {
		destination[strings.TrimPrefix(r.ID, "m-")] = r.Destination
	}
	for k, as := range byKey() {
		require.Len(t, as, 2, "attempts of %s", k)
		assert.Equal(t, as[0].queue, as[1].queue, "key %s: second attempt on another partition", k)
		assert.True(t, strings.HasPrefix(as[0].queue, n.queue+topology.PartitionInfix), "consumed from a partition: %s", as[0].queue)
		if strings.HasPrefix(k, "poison") {
			assert.True(t, as[1].replayed)
			assert.Equal(t, as[0].queue, destination[k], "the DLQ record names the partition")
		}
	}
}

// TestClientSkipsUnreachableNode: the first node of the list does not answer; New connects
// to the next one, and everything works there.
func TestClientSkipsUnreachableNode(t *testing.T) {
	urls := nodeURLs(t)
	dead := fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", testenv.FreePort(t))
	b := newBroker(t, []string{dead, urls[1], urls[2]})
	n := newNames("cluster.skip")
	n.cleanup(t, urls[1])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, b.DeclareQueue(ctx, n.queue))
	require.NoError(t, b.Publisher().Publish(n.queue, message.NewMessage("m1", []byte("x"))))
	assert.Equal(t, []string{"x"}, getAll(t, dial(t, urls[2]), n.queue))
}
