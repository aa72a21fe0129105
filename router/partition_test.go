package router_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// attempt is one handler call: which handler and partition queue saw which key.
type attempt struct{ handler, queue, key string }

type attempts struct {
	mu  sync.Mutex
	all []attempt
}

func (a *attempts) add(msg *message.Message) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.all = append(a.all, attempt{
		handler: message.HandlerNameFromCtx(msg.Context()),
		queue:   message.SubscribeTopicFromCtx(msg.Context()),
		key:     string(msg.Payload),
	})
}

func (a *attempts) snapshot() []attempt {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]attempt(nil), a.all...)
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// runStack runs a stack on b with one partitioned handler until the test ends.
func runStack(t *testing.T, b *memory.Broker, partitions int, h message.NoPublishHandlerFunc) {
	t.Helper()
	s, err := router.New(b, router.Config{
		Logger: quietLogger(),
		Retry:  retry.Config{MaxRetries: 2, InitialDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond, Jitter: retry.NoJitter},
	})
	require.NoError(t, err)
	require.NoError(t, s.Handle("work", "q", h, router.WithPartitions(partitions), router.WithConcurrency(2)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-s.Running():
	case err := <-done:
		t.Fatalf("stack stopped at start: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("stack did not start")
	}
	t.Cleanup(func() {
		_ = s.Close()
		cancel()
		<-done
	})
}

func TestPartitionedHandlerConsumesEachKeyOnOnePartition(t *testing.T) {
	b := memory.New(memory.Config{Logger: quietLogger()})
	t.Cleanup(func() { _ = b.Close() })
	var seen attempts
	runStack(t, b, 4, func(msg *message.Message) error {
		seen.add(msg)
		return nil
	})
	const keys, copies = 30, 3
	for c := 0; c < copies; c++ {
		for k := 0; k < keys; k++ {
			key := fmt.Sprintf("key-%d", k)
			require.NoError(t, b.PublishPartitioned(context.Background(), "q", key, message.NewMessage(fmt.Sprintf("%s-%d", key, c), []byte(key))))
		}
	}
	require.Eventually(t, func() bool { return len(seen.snapshot()) == keys*copies }, 10*time.Second, 10*time.Millisecond)

	partitionOf := map[string]string{}
	used := map[string]bool{}
	for _, a := range seen.snapshot() {
		k := strings.TrimPrefix(a.queue, "q.p")
		assert.Equal(t, "work#"+k, a.handler, "handler of partition queue %s", a.queue)
		assert.Equal(t, topology.Partition("q", atoi(t, k)), a.queue)
		if prev, ok := partitionOf[a.key]; ok {
			assert.Equal(t, prev, a.queue, "key %s consumed from two partitions", a.key)
		}
		partitionOf[a.key] = a.queue
		used[a.queue] = true
	}
	assert.Greater(t, len(used), 1, "the keys spread over the partitions")
}

func TestPartitionedRetryAndDeadLetterStayOnThePartition(t *testing.T) {
	b := memory.New(memory.Config{Logger: quietLogger()})
	t.Cleanup(func() { _ = b.Close() })
	var seen attempts
	runStack(t, b, 3, func(msg *message.Message) error {
		seen.add(msg)
		switch {
		case strings.HasPrefix(string(msg.Payload), "poison"):
			return sluice.Permanent(errors.New("refused"))
		case sluice.RetryCount(msg.Metadata) == 0:
			return errors.New("first attempt fails")
		}
		return nil
	})
	ctx := context.Background()
	keys := []string{"a", "b", "c", "d", "e", "f"}
	for _, k := range keys {
		require.NoError(t, b.PublishPartitioned(ctx, "q", k, message.NewMessage("m-"+k, []byte(k))))
	}
	require.NoError(t, b.PublishPartitioned(ctx, "q", "poison", message.NewMessage("m-poison", []byte("poison"))))

	require.Eventually(t, func() bool { return len(seen.snapshot()) == 2*len(keys)+1 }, 10*time.Second, 10*time.Millisecond)
	queues := map[string][]string{}
	for _, a := range seen.snapshot() {
		queues[a.key] = append(queues[a.key], a.queue)
	}
	for _, k := range keys {
		require.Len(t, queues[k], 2, "key %s: first attempt and retry", k)
		assert.Equal(t, queues[k][0], queues[k][1], "key %s retried on another partition", k)
	}

	require.Eventually(t, func() bool { return b.Len(topology.DLQ("q")) == 1 }, 5*time.Second, 10*time.Millisecond, "dead letter in the shared DLQ q.dlq")
	dead := b.Peek(topology.DLQ("q"))[0]
	assert.Equal(t, queues["poison"][0], dead.Metadata.Get(sluice.HeaderOriginalQueue), "the record names the partition, where a replay must go")
	assert.Equal(t, router.PartitionHandlerName("work", atoi(t, strings.TrimPrefix(queues["poison"][0], "q.p"))), dead.Metadata.Get(headers.Handler))
}

func TestWithPartitionsRegistration(t *testing.T) {
	cases := []struct {
		name    string
		first   []router.HandlerOption
		second  string // a second handler's name, registered after the first
		wantErr error
	}{
		{"negative", []router.HandlerOption{router.WithPartitions(-1)}, "", router.ErrInvalidOption},
		{"name reused", []router.HandlerOption{router.WithPartitions(2)}, "work", router.ErrDuplicateHandler},
		{"partition handler name reused", []router.HandlerOption{router.WithPartitions(2)}, "work#1", router.ErrDuplicateHandler},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := memory.New(memory.Config{Logger: quietLogger()})
			t.Cleanup(func() { _ = b.Close() })
			s, err := router.New(b, router.Config{Logger: quietLogger()})
			require.NoError(t, err)
			noop := func(*message.Message) error { return nil }
			err = s.Handle("work", "q", noop, tc.first...)
			if tc.second == "" {
				require.ErrorIs(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.ErrorIs(t, s.Handle(tc.second, "other", noop), tc.wantErr)
		})
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	_, err := fmt.Sscanf(s, "%d", &n)
	require.NoError(t, err, "partition number %q", s)
	return n
}
