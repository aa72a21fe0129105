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

// SubscribeOptions tune one subscription: package broker's, which both brokers take. The
// embedded broker has no prefetch: Prefetch is ignored.
type SubscribeOptions = broker.SubscribeOptions

// Subscriber returns a subscriber with opts.
func (b *Broker) Subscriber(opts SubscribeOptions) broker.Subscriber {
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
	gate    pausegate.Gate // Pause and Resume (pause.go)
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
