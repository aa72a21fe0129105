package router

import (
	"context"
	"io"
	"log/slog"
	"time"
)

// Claimer exposes the partition claimer to the external tests.
type Claimer = claimer

// NewClaimer returns a claimer of queue's partitions that surveys counter every interval.
func NewClaimer(queue string, partitions int, counter interface {
	ConsumerCount(ctx context.Context, queue string) (int, error)
}, interval time.Duration) *Claimer {
	return newClaimer(queue, partitions, counter, interval, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// Turn is closed once partition k may be subscribed to.
func (c *claimer) Turn(k int) <-chan struct{} { return c.turn(k) }

// Start starts the claim loop.
func (c *claimer) Start(ctx context.Context) { c.start(ctx) }

// Close stops it.
func (c *claimer) Close() { c.close() }

// AssignPartitions exposes the rendezvous assignment of partitions to members.
var AssignPartitions = assignPartitions

// PartitionHandlerName exposes the name of partition k's handler.
var PartitionHandlerName = partitionHandlerName
