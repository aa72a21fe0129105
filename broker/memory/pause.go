package memory

import (
	"context"

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
// The embedded broker does not count consumers or unacknowledged messages.
func (b *Broker) QueueDepth(_ context.Context, queue string) (sluice.QueueDepth, error) {
	q := b.queue(queue)
	q.mu.Lock()
	defer q.mu.Unlock()
	return sluice.QueueDepth{Ready: int64(len(q.ready))}, nil
}
