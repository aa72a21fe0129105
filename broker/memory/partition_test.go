package memory_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/internal/topology"
)

func TestPartitionedPublishRoutesEveryKeyToOnePartition(t *testing.T) {
	b := memory.New(memory.Config{})
	t.Cleanup(func() { _ = b.Close() })
	ctx := context.Background()
	const parts, keys, copies = 4, 40, 3
	require.NoError(t, b.DeclarePartitioned(ctx, "q", parts))
	for c := 0; c < copies; c++ {
		for k := 0; k < keys; k++ {
			key := fmt.Sprintf("key-%d", k)
			require.NoError(t, b.PublishPartitioned(ctx, "q", key, message.NewMessage(fmt.Sprintf("%s-%d", key, c), []byte(key))))
		}
	}

	seen := map[string]string{} // key → partition
	used := map[string]bool{}
	total := 0
	for p := 0; p < parts; p++ {
		part := topology.Partition("q", p)
		for _, m := range b.Peek(part) {
			key := string(m.Payload)
			if prev, ok := seen[key]; ok {
				assert.Equal(t, prev, part, "key %s in two partitions", key)
			}
			seen[key] = part
			used[part] = true
			total++
		}
	}
	assert.Equal(t, keys*copies, total, "every message is in a partition")
	assert.Len(t, seen, keys)
	assert.Greater(t, len(used), 1, "keys spread over partitions")
}

func TestPartitionedQueueErrors(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		do   func(b *memory.Broker) error
		want error
	}{
		{"plain publish to a partitioned queue", func(b *memory.Broker) error {
			return b.Publish("q", message.NewMessage("m", nil))
		}, memory.ErrPartitioned},
		{"partitioned publish to a plain queue", func(b *memory.Broker) error {
			return b.PublishPartitioned(ctx, "plain", "k", message.NewMessage("m", nil))
		}, memory.ErrNotPartitioned},
		{"empty key", func(b *memory.Broker) error {
			return b.PublishPartitioned(ctx, "q", "", message.NewMessage("m", nil))
		}, broker.ErrPartitionKey},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := memory.New(memory.Config{})
			t.Cleanup(func() { _ = b.Close() })
			require.NoError(t, b.DeclarePartitioned(ctx, "q", 2))
			require.ErrorIs(t, tc.do(b), tc.want)
		})
	}
	t.Run("fewer partitions than declared before", func(t *testing.T) {
		b := memory.New(memory.Config{})
		t.Cleanup(func() { _ = b.Close() })
		require.NoError(t, b.DeclarePartitioned(ctx, "q", 4))
		require.NoError(t, b.DeclarePartitioned(ctx, "q", 4), "declaring is idempotent")
		require.ErrorIs(t, b.DeclarePartitioned(ctx, "q", 3), broker.ErrInequivalent)
	})
	t.Run("no partitions", func(t *testing.T) {
		b := memory.New(memory.Config{})
		t.Cleanup(func() { _ = b.Close() })
		require.Error(t, b.DeclarePartitioned(ctx, "q", 0))
	})
}

func TestPartitionsShareOneDeadLetterQueue(t *testing.T) {
	b := memory.New(memory.Config{})
	t.Cleanup(func() { _ = b.Close() })
	ctx := context.Background()
	require.NoError(t, b.DeclarePartitioned(ctx, "q", 3))
	for p := 0; p < 3; p++ {
		require.NoError(t, b.DeadLetter(ctx, topology.Partition("q", p), message.NewMessage(fmt.Sprint(p), nil)))
	}
	require.NoError(t, b.DeadLetter(ctx, "other", message.NewMessage("o", nil)))
	assert.Equal(t, 3, b.Len(topology.DLQ("q")))
	assert.Equal(t, 1, b.Len(topology.DLQ("other")), "a plain queue keeps its own DLQ")
	assert.Equal(t, 0, b.Len(topology.DLQ(topology.Partition("q", 0))))
}
