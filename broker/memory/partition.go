package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/topology"
)

// A publish that mixes up a partitioned queue and a plain one is a program's mistake, named
// in the error's text; RabbitMQ returns both as unroutable.
var (
	// errNotPartitioned: a partitioned publish named a queue not declared partitioned.
	errNotPartitioned = errors.New("memory: queue not declared partitioned")
	// errPartitioned: a plain publish named a partitioned queue, which has no queue of its
	// own name.
	errPartitioned = errors.New("memory: queue is partitioned; publish with PublishPartitioned")
)

// partitionSet remembers the partitioned queues: queue → partition count, and each
// partition queue → its queue (for the shared dead-letter queue). The zero value is empty.
type partitionSet struct {
	mu     sync.Mutex
	counts map[string]int
	parent map[string]string
}

func (p *partitionSet) set(queue string, partitions int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.counts == nil {
		p.counts, p.parent = map[string]int{}, map[string]string{}
	}
	p.counts[queue] = partitions
	for k := 0; k < partitions; k++ {
		p.parent[topology.Partition(queue, k)] = queue
	}
}

func (p *partitionSet) count(queue string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counts[queue]
}

// dlq returns the dead-letter queue of queue: the shared one of its partitioned queue when
// queue is a partition, else queue's own.
func (p *partitionSet) dlq(queue string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if parent, ok := p.parent[queue]; ok {
		return topology.DLQ(parent)
	}
	return topology.DLQ(queue)
}

// DeclarePartitioned creates partitions queues topology.Partition(queue, k) and the one
// dead-letter queue they share, topology.DLQ(queue). The embedded broker has one consumer
// process, so every partition is trivially consumed by one instance; what it keeps from
// RabbitMQ is the routing: PublishPartitioned sends every message of a key to the same
// partition (by FNV-1a of the key, not RabbitMQ's hash).
func (b *Broker) DeclarePartitioned(_ context.Context, queue string, partitions int) error {
	if b.closed() {
		return broker.ErrClosed
	}
	if partitions < 1 {
		return fmt.Errorf("memory: partitions of queue %q: %d, want at least 1", queue, partitions)
	}
	if n := b.parts.count(queue); n > partitions {
		return fmt.Errorf("memory: queue %q has %d partitions, declared again with %d: %w", queue, n, partitions, broker.ErrInequivalent)
	}
	b.parts.set(queue, partitions)
	for k := 0; k < partitions; k++ {
		b.queue(topology.Partition(queue, k))
	}
	b.queue(topology.DLQ(queue))
	return nil
}

// PublishPartitioned puts copies of messages at the end of the partition of queue that key
// hashes to.
func (b *Broker) PublishPartitioned(_ context.Context, queue, key string, messages ...*message.Message) error {
	if b.closed() {
		return broker.ErrClosed
	}
	if key == "" {
		return fmt.Errorf("publish to partitioned queue %q: %w", queue, broker.ErrPartitionKey)
	}
	n := b.parts.count(queue)
	if n == 0 {
		return fmt.Errorf("publish to queue %q with key %q: %w", queue, key, errNotPartitioned)
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	q := b.queue(topology.Partition(queue, int(h.Sum64()%uint64(n))))
	for _, m := range messages {
		q.push(copyMessage(m), false)
	}
	return nil
}
