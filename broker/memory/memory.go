// Package memory is sluice's embedded broker, used when no AMQP_URL is set: in-process
// queues with the same semantics the stack relies on from RabbitMQ — competing consumers,
// acks and requeue on nack, a dead-letter queue per queue, and delayed re-delivery by a
// scheduler (one timer goroutine; no handler ever sleeps). Nothing survives the process.
package memory

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// ErrClosed is returned by operations on a closed broker.
var ErrClosed = errors.New("memory: broker closed")

// Config configures the embedded broker. The zero value is ready to use.
type Config struct {
	// NackBackoffMax caps how long a nacked message waits before it is requeued, so a
	// failing hand-off does not spin. Zero means 10s.
	NackBackoffMax time.Duration
	// DrainTimeout is how long a closing subscriber (or broker) waits for the verdict on a
	// message a handler holds before it returns the message to its queue and cancels the
	// message's context, as the RabbitMQ subscriber does. Zero means 30s.
	DrainTimeout time.Duration
	// Logger receives broker events. Nil means slog.Default().
	Logger *slog.Logger
}

// SubscribeOptions tune one subscription; they mean what they mean for RabbitMQ.
type SubscribeOptions struct {
	// Concurrency is how many messages are handed out at once. Zero means 1.
	Concurrency int
}

// DLQName returns the dead-letter queue of queue.
func DLQName(queue string) string { return queue + ".dlq" }

// Broker is the embedded broker. Queues are created on first use.
type Broker struct {
	cfg Config

	mu     sync.Mutex
	queues map[string]*queue
	parts  partitionSet // partitioned queues (partition.go)
	ex     exchanges    // exchanges and bindings (exchange.go)

	sched   scheduleHeap
	wake    chan struct{}
	closing chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

// New starts an embedded broker.
func New(cfg Config) *Broker {
	if cfg.NackBackoffMax <= 0 {
		cfg.NackBackoffMax = 10 * time.Second
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	b := &Broker{cfg: cfg, queues: map[string]*queue{}, wake: make(chan struct{}, 1), closing: make(chan struct{})}
	b.wg.Add(1)
	go b.runScheduler()
	return b
}

// Name returns "memory".
func (b *Broker) Name() string { return "memory" }

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

func (b *Broker) closed() bool {
	select {
	case <-b.closing:
		return true
	default:
		return false
	}
}

// DeclareQueue creates queue and its dead-letter queue.
func (b *Broker) DeclareQueue(_ context.Context, queue string) error {
	if b.closed() {
		return ErrClosed
	}
	b.queue(queue)
	b.queue(DLQName(queue))
	return nil
}

// Publish puts copies of messages at the end of the queue named topic.
func (b *Broker) Publish(topic string, messages ...*message.Message) error {
	if b.closed() {
		return ErrClosed
	}
	if b.parts.count(topic) > 0 {
		return fmt.Errorf("publish to queue %q: %w", topic, ErrPartitioned)
	}
	q := b.queue(topic)
	for _, m := range messages {
		q.push(copyMessage(m), false)
	}
	return nil
}

// Delay delivers a copy of msg to queue after d, by the scheduler.
func (b *Broker) Delay(_ context.Context, queue string, d time.Duration, msg *message.Message) error {
	if b.closed() {
		return ErrClosed
	}
	b.mu.Lock()
	heap.Push(&b.sched, scheduled{due: time.Now().Add(d), queue: queue, msg: copyMessage(msg)})
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
	return nil
}

// DeadLetter puts a copy of msg in queue's dead-letter queue (a partition's is the one its
// partitioned queue's partitions share).
func (b *Broker) DeadLetter(_ context.Context, queue string, msg *message.Message) error {
	if b.closed() {
		return ErrClosed
	}
	b.queue(b.parts.dlq(queue)).push(copyMessage(msg), false)
	return nil
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

// Publisher returns the broker itself, which implements message.Publisher.
func (b *Broker) Publisher() message.Publisher { return publisher{b} }

type publisher struct{ b *Broker }

func (p publisher) Publish(topic string, messages ...*message.Message) error {
	return p.b.Publish(topic, messages...)
}
func (p publisher) Close() error { return nil }

// Subscriber returns a subscriber with opts.
func (b *Broker) Subscriber(opts SubscribeOptions) message.Subscriber {
	if opts.Concurrency <= 0 {
		opts.Concurrency = 1
	}
	return &subscriber{b: b, opts: opts, closing: make(chan struct{})}
}

type subscriber struct {
	b       *Broker
	opts    SubscribeOptions
	closing chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	nacks   int64
	nackMu  sync.Mutex
	gate    gate // Pause and Resume (pause.go)
}

func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.b.closed() {
		return nil, ErrClosed
	}
	select {
	case <-s.closing:
		return nil, ErrClosed
	default:
	}
	q := s.b.queue(topic)
	out := make(chan *message.Message)
	var workers sync.WaitGroup
	for i := 0; i < s.opts.Concurrency; i++ {
		workers.Add(1)
		go func() {
			defer workers.Done()
			s.work(ctx, q, out, i)
		}()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		workers.Wait()
		close(out)
	}()
	return out, nil
}

func (s *subscriber) stop(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return true
	case <-s.closing:
		return true
	case <-s.b.closing:
		return true
	default:
		return false
	}
}

func (s *subscriber) work(ctx context.Context, q *queue, out chan<- *message.Message, worker int) {
	for {
		if s.stop(ctx) {
			return
		}
		st := s.gate.state()
		if !st.admits(worker) {
			select {
			case <-st.changed:
			case <-ctx.Done():
			case <-s.closing:
			case <-s.b.closing:
			}
			continue
		}
		m, ok := q.pop()
		if !ok {
			select {
			case <-q.avail:
			case <-st.changed:
			case <-ctx.Done():
				return
			case <-s.closing:
				return
			case <-s.b.closing:
				return
			}
			continue
		}
		msg := copyMessage(m)
		msgCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		msg.SetContext(msgCtx)
		select {
		case out <- msg:
		case <-ctx.Done():
			q.push(m, true)
			cancel()
			return
		case <-s.closing:
			q.push(m, true)
			cancel()
			return
		case <-s.b.closing:
			q.push(m, true)
			cancel()
			return
		case <-st.changed:
			q.push(m, true)
			cancel()
			continue
		}
		s.settle(q, m, msg, cancel)
		cancel()
	}
}

// settle waits for the handler's verdict on msg (a copy of m, the queued message). When the
// subscriber or the broker closes first, the handler gets DrainTimeout to finish; then m
// goes back to the head of its queue, as RabbitMQ returns an unacked delivery when its
// channel closes. Without this, Close waited forever for a handler that never decides.
func (s *subscriber) settle(q *queue, m, msg *message.Message, cancel context.CancelFunc) {
	closing, brokerClosing := s.closing, s.b.closing
	var drain <-chan time.Time
	for {
		select {
		case <-msg.Acked():
			s.nackMu.Lock()
			s.nacks = 0
			s.nackMu.Unlock()
			return
		case <-msg.Nacked():
			s.requeueLater(q, m)
			return
		case <-closing:
		case <-brokerClosing:
		case <-drain:
			// Cancel the handler and give it a moment to answer, so a hand-off it is
			// making is not doubled by the requeue.
			cancel()
			select {
			case <-msg.Acked():
				return
			case <-msg.Nacked():
			case <-time.After(time.Second):
			}
			s.b.cfg.Logger.Warn("handler did not finish within the drain timeout; message returned to the queue", "message_id", m.UUID)
			q.push(m, true)
			return
		}
		// Closing: start the drain once.
		closing, brokerClosing = nil, nil
		t := time.NewTimer(s.b.cfg.DrainTimeout)
		defer t.Stop()
		drain = t.C
	}
}

func (s *subscriber) requeueLater(q *queue, m *message.Message) {
	s.nackMu.Lock()
	s.nacks++
	n := s.nacks
	s.nackMu.Unlock()
	if n > 1 {
		wait := 50 * time.Millisecond << min(n-2, 10)
		if wait > s.b.cfg.NackBackoffMax {
			wait = s.b.cfg.NackBackoffMax
		}
		wait = wait/2 + rand.N(wait/2+1)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-s.closing:
			t.Stop()
		case <-s.b.closing:
			t.Stop()
		}
	}
	q.push(m, true)
}

func (s *subscriber) Close() error {
	s.once.Do(func() { close(s.closing) })
	s.wg.Wait()
	return nil
}

// Close stops the scheduler and every subscription. Scheduled messages are dropped with
// the process, as everything in the embedded broker is.
func (b *Broker) Close() error {
	b.once.Do(func() { close(b.closing) })
	b.wg.Wait()
	return nil
}

type scheduled struct {
	due   time.Time
	queue string
	msg   *message.Message
}

type scheduleHeap []scheduled

func (h scheduleHeap) Len() int           { return len(h) }
func (h scheduleHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h scheduleHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *scheduleHeap) Push(x any)        { *h = append(*h, x.(scheduled)) }
func (h *scheduleHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// runScheduler moves due messages into their queues. One timer, reset to the earliest due
// time, serves every delay: a long delay never holds back a short one.
func (b *Broker) runScheduler() {
	defer b.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		b.mu.Lock()
		now := time.Now()
		var due []scheduled
		for len(b.sched) > 0 && !b.sched[0].due.After(now) {
			due = append(due, heap.Pop(&b.sched).(scheduled))
		}
		next := time.Hour
		if len(b.sched) > 0 {
			next = b.sched[0].due.Sub(now)
		}
		b.mu.Unlock()
		for _, s := range due {
			b.queue(s.queue).push(s.msg, false)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(next)
		select {
		case <-b.closing:
			return
		case <-b.wake:
		case <-timer.C:
		}
	}
}

// String describes the broker for logs.
func (b *Broker) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return fmt.Sprintf("memory broker (%d queues)", len(b.queues))
}
