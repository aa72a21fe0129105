package memory

import (
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

type queue struct {
	mu    sync.Mutex
	ready []*message.Message
	avail chan struct{} // signalled when ready grows
}

func (b *Broker) queue(name string) *queue {
	b.mu.Lock()
	defer b.mu.Unlock()
	q, ok := b.queues[name]
	if !ok {
		q = &queue{avail: make(chan struct{}, 1)}
		b.queues[name] = q
	}
	return q
}

func (q *queue) push(m *message.Message, front bool) {
	q.mu.Lock()
	if front {
		q.ready = append([]*message.Message{m}, q.ready...)
	} else {
		q.ready = append(q.ready, m)
	}
	q.mu.Unlock()
	select {
	case q.avail <- struct{}{}:
	default:
	}
}

func (q *queue) pop() (*message.Message, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.ready) == 0 {
		return nil, false
	}
	m := q.ready[0]
	q.ready[0] = nil
	q.ready = q.ready[1:]
	if len(q.ready) > 0 {
		select {
		case q.avail <- struct{}{}:
		default:
		}
	}
	return m, true
}

// copyMessage gives every hand-off its own message, as a broker round trip would.
func copyMessage(m *message.Message) *message.Message {
	c := message.NewMessage(m.UUID, append([]byte(nil), m.Payload...))
	c.Metadata = make(message.Metadata, len(m.Metadata))
	for k, v := range m.Metadata {
		c.Metadata[k] = v
	}
	return c
}

// Len returns how many messages wait in queue, ready or scheduled for it.
func (b *Broker) Len(queue string) int {
	q := b.queue(queue)
	q.mu.Lock()
	n := len(q.ready)
	q.mu.Unlock()
	b.mu.Lock()
	for _, s := range b.sched {
		if s.queue == queue {
			n++
		}
	}
	b.mu.Unlock()
	return n
}

// Peek returns copies of the ready messages of queue without consuming them.
func (b *Broker) Peek(queue string) []*message.Message {
	q := b.queue(queue)
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]*message.Message, len(q.ready))
	for i, m := range q.ready {
		out[i] = copyMessage(m)
	}
	return out
}
