package memory

import (
	"context"
	"fmt"

	"github.com/sluice-go/sluice"
)

// Pause stops the subscription's workers from taking messages: a message waiting for a
// handler goes back to the head of its queue, messages with a handler finish as usual.
func (s *subscriber) Pause() { s.gate.Set(true, 0) }

// Resume lets the workers take messages again; a positive limit lets only that many of
// them work until Resume is called with another limit, zero lets all of them.
func (s *subscriber) Resume(limit int) { s.gate.Set(false, limit) }

// Paused reports whether Pause was called after the last Resume.
func (s *subscriber) Paused() bool { return s.gate.State().Paused }

// QueueDepth returns the messages ready in queue (Len without the scheduled ones), the
// backlog the retry step's adaptive policy reads and telemetry's depth watcher reports.
// The embedded broker does not count consumers or unacknowledged messages. A queue nothing
// declared, published to or consumed is an error wrapping sluice.ErrQueueNotFound, as on
// RabbitMQ.
func (b *Broker) QueueDepth(_ context.Context, queue string) (sluice.QueueDepth, error) {
	b.mu.Lock()
	q, ok := b.queues[queue]
	b.mu.Unlock()
	if !ok {
		return sluice.QueueDepth{}, fmt.Errorf("memory: depth of queue %q: %w", queue, sluice.ErrQueueNotFound)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return sluice.QueueDepth{Ready: int64(len(q.ready))}, nil
}
