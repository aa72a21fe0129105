package memory

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/pausegate"
)

// Subscriber returns a subscriber with opts. The embedded broker has no prefetch:
// opts.Prefetch is ignored.
func (b *Broker) Subscriber(opts broker.SubscribeOptions) broker.Subscriber {
	if opts.Concurrency <= 0 {
		opts.Concurrency = 1
	}
	return &subscriber{b: b, opts: opts, closing: make(chan struct{})}
}

type subscriber struct {
	b       *Broker
	opts    broker.SubscribeOptions
	closing chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	nacks   int64
	nackMu  sync.Mutex
	gate    pausegate.Gate // Pause and Resume (pause.go)
}

func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.b.closed() {
		return nil, broker.ErrClosed
	}
	select {
	case <-s.closing:
		return nil, broker.ErrClosed
	default:
	}
	q := s.b.queue(topic)
	out := make(chan *message.Message)
	h := &holds{stop: make(chan struct{})}
	var workers sync.WaitGroup
	for i := 0; i < s.opts.Concurrency; i++ {
		workers.Add(1)
		go func() {
			defer workers.Done()
			s.work(ctx, q, out, i, h)
		}()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		workers.Wait()
		close(out)
		h.drain(s.b.cfg.DrainTimeout)
	}()
	return out, nil
}

// holds runs the held acks of one subscription (broker.Delivery.HoldAck) off the workers'
// goroutines, as RabbitMQ's subscriber does: a worker takes the next message while the
// previous one's ack waits.
type holds struct {
	wg   sync.WaitGroup
	stop chan struct{} // closed once the subscription ended and the drain timeout passed
}

// run runs wait, then settle with its result.
func (h *holds) run(wait func(stop <-chan struct{}) error, settle func(error)) {
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		settle(wait(h.stop))
	}()
}

// drain waits for the held acks, up to grace, then stops their waits and waits for them.
func (h *holds) drain(grace time.Duration) {
	done := make(chan struct{})
	go func() {
		h.wg.Wait()
		close(done)
	}()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		close(h.stop)
		<-done
	}
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

func (s *subscriber) work(ctx context.Context, q *queue, out chan<- *message.Message, worker int, h *holds) {
	for {
		if s.stop(ctx) {
			return
		}
		st := s.gate.State()
		if !st.Admits(worker) {
			select {
			case <-st.Changed:
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
			case <-st.Changed:
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
		msgCtx, dl := broker.WithDelivery(msgCtx)
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
		case <-st.Changed:
			q.push(m, true)
			cancel()
			continue
		}
		s.settle(q, m, msg, dl, h, cancel)
		cancel()
	}
}

// settle waits for the handler's verdict on msg (a copy of m, the queued message) and
// settles it as RabbitMQ's subscriber does: an ack removes it (once a held ack's wait
// returned nil), a nack requeues it as dl says (requeueLater). When the subscriber or the
// broker closes first, the handler gets DrainTimeout to finish; then m goes back to the
// head of its queue, as RabbitMQ returns an unacked delivery when its channel closes.
// Without this, Close waited forever for a handler that never decides.
func (s *subscriber) settle(q *queue, m, msg *message.Message, dl *broker.Delivery, h *holds, cancel context.CancelFunc) {
	closing, brokerClosing := s.closing, s.b.closing
	var drain <-chan time.Time
	acked := func() {
		s.nackMu.Lock()
		s.nacks = 0
		s.nackMu.Unlock()
		if wait := dl.HeldAck(); wait != nil {
			// Not done until the wait says so: returned to the queue when it fails.
			h.run(wait, func(err error) {
				if err != nil {
					s.b.cfg.Logger.Debug("held ack failed; message returned to the queue", "message_id", m.UUID, "error", err)
					q.push(m, true)
				}
			})
		}
	}
	nacked := func() {
		if wait := dl.HeldAck(); wait != nil {
			h.run(wait, func(error) {}) // it settles the step's own state; the nack stands
		}
	}
	for {
		select {
		case <-msg.Acked():
			acked()
			return
		case <-msg.Nacked():
			nacked()
			s.requeueLater(q, m, dl.Settlement())
			return
		case <-closing:
		case <-brokerClosing:
		case <-drain:
			// Cancel the handler and give it a moment to answer, so a hand-off it is
			// making is not doubled by the requeue.
			cancel()
			select {
			case <-msg.Acked():
				acked()
				return
			case <-msg.Nacked():
				nacked()
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

// requeueLater puts a nacked m back at the head of q as how says: at once when returned
// unprocessed or held back (the embedded broker holds nothing back itself, and counts no
// deliveries), and, a failure, after a pause that grows with consecutive rejections, so a
// failing hand-off does not spin.
func (s *subscriber) requeueLater(q *queue, m *message.Message, how broker.Settlement) {
	if how == broker.SettleReturn || how == broker.SettleHoldBack {
		q.push(m, true)
		return
	}
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
