package outbox

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/outboxstore"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Publisher is a message.Publisher that never loses a message it returned success for.
// Each Publish goes to the wrapped (confirmed) publisher with Config.DirectTimeout; when
// that fails for any reason Config.Permanent does not name (broker unreachable, blocked,
// nacked, slow), the messages are written to the outbox file and fsynced, and Publish
// returns nil. A forwarder goroutine publishes the outbox's entries in order, with the
// wrapped publisher's confirms, and removes each only after its confirm.
//
// Order per producer holds: while anything is in the outbox (or being written to it),
// every new Publish goes to the outbox behind it, so a caller that publishes one message
// after the other sees them reach the broker in that order. Delivery is at-least-once: a
// direct publish whose confirm was lost in a failure, or a forwarded batch confirmed but
// not yet removed when the process died, is published again, with the message's UUID as
// every copy's message id, so that the consumer's idempotency step runs its handler once
// (see the package documentation).
type Publisher struct {
	pub   message.Publisher
	cfg   Config
	store *outboxstore.Store

	mu     sync.Mutex
	queued int // entries in the store or being written to it

	kick    chan struct{}
	closing chan struct{}
	done    chan struct{}
	once    sync.Once

	direct, kept, forwarded, rejected, unconfirmed atomic.Uint64
}

// Stats counts what a Publisher did since it was created.
type Stats struct {
	// Direct is the number of messages the broker confirmed on the direct path.
	Direct uint64
	// Kept is the number of messages written to the outbox.
	Kept uint64
	// Forwarded is the number of outbox entries confirmed and removed.
	Forwarded uint64
	// Rejected is the number of entries set aside with a permanent error.
	Rejected uint64
	// Unconfirmed counts forwarded entries whose attempt failed without a confirm: each
	// may have reached the broker anyway and come out twice.
	Unconfirmed uint64
	// Pending is the number of entries in the outbox now.
	Pending int
	// PendingBytes is their encoded size.
	PendingBytes int64
}

// New opens the outbox in cfg.Dir and returns a publisher in front of pub. Entries left
// by an earlier run are forwarded first, and new publishes queue behind them. Close does
// not close pub.
func New(pub message.Publisher, cfg Config) (*Publisher, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	store, err := outboxstore.OpenStore(cfg.Dir, cfg.MaxMessages, cfg.MaxBytes)
	if err != nil {
		return nil, err
	}
	p := &Publisher{
		pub: pub, cfg: cfg, store: store,
		kick:    make(chan struct{}, 1),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
	}
	p.queued, _ = store.Len()
	if p.queued > 0 {
		cfg.Logger.Info("outbox: forwarding messages left by an earlier run", "dir", cfg.Dir, "messages", p.queued)
	}
	go p.forward()
	return p, nil
}

// Publish publishes messages to topic: confirmed by the broker, or kept durably in the
// outbox. It fails only when the messages are neither (ErrFull, ErrClosed, a disk error)
// or with an error Config.Permanent names.
func (p *Publisher) Publish(topic string, messages ...*message.Message) error {
	if len(messages) == 0 {
		return nil
	}
	select {
	case <-p.closing:
		return ErrClosed
	default:
	}
	p.mu.Lock()
	behind := p.queued > 0
	if behind {
		p.queued += len(messages)
	}
	p.mu.Unlock()
	if !behind {
		err := p.publishDirect(topic, messages)
		if err == nil {
			p.direct.Add(uint64(len(messages)))
			return nil
		}
		if p.cfg.Permanent(err) {
			return err
		}
		p.mu.Lock()
		if p.queued == 0 {
			p.cfg.Logger.Warn("outbox: broker did not confirm; keeping messages in the outbox", "topic", topic, "error", err)
		}
		p.queued += len(messages)
		p.mu.Unlock()
	}
	return p.keep(topic, messages)
}

func (p *Publisher) publishDirect(topic string, messages []*message.Message) error {
	// The deadline is ours and the values (a trace span) are the caller's.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(messages[0].Context()), p.cfg.DirectTimeout)
	defer cancel()
	return sluice.PublishContext(ctx, p.pub, topic, messages...)
}

func (p *Publisher) keep(topic string, messages []*message.Message) error {
	entries := make([]outboxstore.Entry, len(messages))
	for i, m := range messages {
		entries[i] = outboxstore.NewEntry(topic, m)
	}
	if err := p.store.Append(entries); err != nil {
		p.mu.Lock()
		p.queued -= len(messages)
		p.mu.Unlock()
		return fmt.Errorf("publish %d message(s) to %q: %w", len(messages), topic, err)
	}
	p.kept.Add(uint64(len(messages)))
	select {
	case p.kick <- struct{}{}:
	default:
	}
	return nil
}

// Stats returns the publisher's counts.
func (p *Publisher) Stats() Stats {
	n, b := p.store.Len()
	return Stats{
		Direct: p.direct.Load(), Kept: p.kept.Load(), Forwarded: p.forwarded.Load(),
		Rejected: p.rejected.Load(), Unconfirmed: p.unconfirmed.Load(), Pending: n, PendingBytes: b,
	}
}

// RejectedMessage is a message the forwarder set aside because publishing it failed with
// an error Config.Permanent names (no queue bound any more, say), so that it does not block
// the messages behind it. It stays in the outbox file's rejected set.
type RejectedMessage struct {
	// Topic is the topic Publish was given.
	Topic string
	// Message is the message: its UUID, metadata and payload.
	Message *message.Message
	// Reason is the error it was set aside with.
	Reason string
}

// Rejected returns the messages the outbox file holds set aside as rejected, by this
// publisher or an earlier one on the same directory, oldest first. It fails with ErrClosed
// once the publisher is closed.
func (p *Publisher) Rejected() ([]RejectedMessage, error) {
	select {
	case <-p.closing:
		return nil, ErrClosed
	default:
	}
	entries, err := p.store.Rejected()
	if err != nil {
		return nil, err
	}
	out := make([]RejectedMessage, len(entries))
	for i, e := range entries {
		out[i] = RejectedMessage{Topic: e.Topic, Message: e.Message(), Reason: e.Reason}
	}
	return out, nil
}

// Close stops the forwarder and closes the outbox file; what is still in it is forwarded
// by the next publisher opened on the same directory. It does not close the wrapped
// publisher.
func (p *Publisher) Close() error {
	var err error
	p.once.Do(func() {
		close(p.closing)
		<-p.done
		err = p.store.Close()
	})
	return err
}
