package amqp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice"
)

// Publish errors.
var (
	// ErrUnroutable means RabbitMQ returned a mandatory message: no queue was bound for it.
	ErrUnroutable = errors.New("amqp: message unroutable (returned by broker)")
	// ErrNacked means RabbitMQ refused to take responsibility for a message (basic.nack).
	ErrNacked = errors.New("amqp: message nacked by broker")
	// errChannelLost means the channel closed before the confirm; the publish is retried.
	errChannelLost = errors.New("amqp: channel closed before confirm")
)

// Publisher publishes within a caller's context (sluice.PublishContext uses that).
var _ sluice.ContextPublisher = (*Publisher)(nil)

// Publisher is a confirmed publisher: every message is published mandatory on a channel in
// confirm mode, many in flight at once, and Publish returns only when each of its messages
// is confirmed by RabbitMQ, or with an error on nack, return or timeout. It is safe for
// concurrent callers. When the connection drops it waits for the reconnect within the
// publish's deadline and publishes again what was not confirmed; it never reports success
// for an unconfirmed message (a message confirmed twice is possible: at-least-once). A
// connection whose node stops confirming (Config.ConfirmStallTimeout) is closed and
// treated the same way, reconnecting through the next URL.
//
// Publish(topic) sends to the default exchange with the topic as routing key, i.e. to the
// queue named topic. PublishTo sends to any exchange.
type Publisher struct {
	conn *connection
	cfg  Config

	mu sync.Mutex
	cc *confirmChannel
	// closing counts channels being closed aside (see forgetChannel).
	closing sync.WaitGroup
	// stall moves the connection to another node when its node stops confirming (nil when
	// Config.ConfirmStallTimeout turned that off).
	stall *stallWatch
}

func newPublisher(conn *connection, cfg Config) *Publisher {
	p := &Publisher{conn: conn, cfg: cfg}
	p.stall = startStallWatch(p, cfg.ConfirmStallTimeout)
	return p
}

// Publish publishes messages to the queue named topic and waits for their confirms. The
// deadline is the first message's context deadline, else Config.PublishTimeout.
func (p *Publisher) Publish(topic string, messages ...*message.Message) error {
	ctx := context.Background()
	if len(messages) > 0 && messages[0].Context() != nil {
		ctx = messages[0].Context()
	}
	if ctx.Done() != nil {
		// Keep the deadline, not the cancellation: a handler's context is cancelled right
		// after it returns, while its output may still be confirming. (A context that can
		// never be cancelled has no deadline either and is used as it is.)
		parent := ctx
		ctx = context.WithoutCancel(parent)
		if dl, ok := parent.Deadline(); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, dl)
			defer cancel()
		}
	}
	return withQueueHint(p.PublishTo(ctx, "", topic, messages...), topic)
}

// PublishContext publishes messages to the queue named topic (through the default
// exchange) within ctx and waits for their confirms: PublishTo(ctx, "", topic, ...).
func (p *Publisher) PublishContext(ctx context.Context, topic string, messages ...*message.Message) error {
	return p.PublishTo(ctx, "", topic, messages...)
}

// PublishTo publishes messages to exchange with routingKey and waits for their confirms.
func (p *Publisher) PublishTo(ctx context.Context, exchange, routingKey string, messages ...*message.Message) error {
	// A hand-off publishes one message: its publishing stays on the stack.
	var one [1]amqp.Publishing
	pubs := one[:]
	if len(messages) != 1 {
		pubs = make([]amqp.Publishing, len(messages))
	}
	// A header frame over the negotiated frame_max closes the connection: fit to that.
	marshaler := Marshaler{FrameMax: p.conn.frameMax()}
	for i, m := range messages {
		pub, err := marshaler.Marshal(m)
		if err != nil {
			return fmt.Errorf("marshal message %s: %w", m.UUID, err)
		}
		pubs[i] = pub
	}
	return p.publishRaw(ctx, exchange, routingKey, pubs)
}

func (p *Publisher) publishRaw(ctx context.Context, exchange, routingKey string, pubs []amqp.Publishing) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.PublishTimeout)
		defer cancel()
	}
	pending := pubs
	for {
		cc, err := p.channel(ctx)
		if err != nil {
			return fmt.Errorf("publish to exchange %q key %q: %w", exchange, routingKey, err)
		}
		waits := make([]*inflight, len(pending))
		for i := range pending {
			w, err := cc.publish(ctx, exchange, routingKey, pending[i])
			if err != nil && !errors.Is(err, errChannelLost) {
				// This call's deadline passed: its own failure, and no reason to close
				// the channel other callers are waiting for confirms on.
				return fmt.Errorf("publish message %s to exchange %q key %q: %w", pending[i].MessageId, exchange, routingKey, err)
			}
			if err != nil {
				// Publishes after a failed one are not attempted; they are retried below.
				for j := i; j < len(pending); j++ {
					waits[j] = nil
				}
				break
			}
			waits[i] = w
		}
		var retry []amqp.Publishing
		for i, w := range waits {
			if w == nil {
				retry = append(retry, pending[i])
				continue
			}
			select {
			case err := <-w.result:
				w.release()
				switch {
				case err == nil:
				case errors.Is(err, errChannelLost):
					retry = append(retry, pending[i])
				case errors.Is(err, ErrNacked):
					// The stuck channel below also nacks (a quorum queue client that gives
					// up on the old leader): the next publish gets a fresh channel too.
					_ = p.forgetChannel(cc, "nack")
					return fmt.Errorf("publish message %s to exchange %q key %q: %w", pending[i].MessageId, exchange, routingKey, err)
				default:
					return fmt.Errorf("publish message %s to exchange %q key %q: %w", pending[i].MessageId, exchange, routingKey, err)
				}
			case <-ctx.Done():
				// Name the alarm when there is one: a deadline alone says nothing of why.
				if blocked := p.forgetChannel(cc, "no confirm before the deadline"); blocked != nil {
					return fmt.Errorf("publish message %s to exchange %q key %q: waiting for confirm: %w: %w", pending[i].MessageId, exchange, routingKey, blocked, ctx.Err())
				}
				return fmt.Errorf("publish message %s to exchange %q key %q: waiting for confirm: %w", pending[i].MessageId, exchange, routingKey, ctx.Err())
			}
		}
		if len(retry) == 0 {
			return nil
		}
		p.dropChannel(cc)
		pending = retry
	}
}

// channel returns the shared confirm channel, opening one when there is none or it died.
func (p *Publisher) channel(ctx context.Context) (*confirmChannel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cc != nil && !p.cc.isClosed() {
		return p.cc, nil
	}
	ch, err := p.conn.channel(ctx)
	if err != nil {
		return nil, err
	}
	cc, err := newConfirmChannel(ch, p.stall)
	if err != nil {
		return nil, err
	}
	p.cc = cc
	return cc, nil
}

// forgetChannel handles a publish whose deadline passed before its confirm, or that was
// nacked (why says which). It returns the alarm when RabbitMQ blocks the connection: the
// channel is fine then, and other callers keep it. Otherwise the channel is forgotten, so
// the next publish opens a fresh one: a channel can stop confirming for good. Seen with
// RabbitMQ 3.10 in the partition scenario: a channel opened on a majority node while it
// was dropping the minority node (the quorum queue's old leader) never confirmed again,
// or only nacked, while a new channel on the same node was confirmed in milliseconds;
// reusing it failed every later publish. Publishes still waiting on it see it close and
// are published again (at-least-once); a queue that nacks for another reason (overflow
// reject-publish) costs a channel per nack.
func (p *Publisher) forgetChannel(cc *confirmChannel, why string) error {
	if blocked := p.conn.blockedErr(); blocked != nil {
		return blocked
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// Counted even when another caller replaced the channel: a node that nacks everything
	// is told apart from one that nacks now and then by the confirms between (stallWatch).
	p.stall.failed()
	if p.cc != cc {
		return nil // already replaced by another caller
	}
	p.cc = nil
	p.conn.logger.Warn("publish failed on an unblocked connection; publishing on a new channel", "reason", why, "connection", p.conn.name)
	// channel.close waits for RabbitMQ's answer, which a stuck channel may be slow to
	// give: close it aside, not within this caller's already passed deadline. Close waits
	// for it (Broker.Close closes the connection first, which ends the wait).
	p.closing.Add(1)
	go func() {
		defer p.closing.Done()
		cc.close()
	}()
	return nil
}

func (p *Publisher) dropChannel(cc *confirmChannel) {
	p.mu.Lock()
	if p.cc == cc {
		p.cc = nil
	}
	p.mu.Unlock()
	cc.close()
}

// Close closes the publisher's channel. Publishes still waiting fail. Broker.Close closes
// the publishing connection first, so this never waits on a node that does not answer.
func (p *Publisher) Close() error {
	p.stall.close()
	p.mu.Lock()
	cc := p.cc
	p.cc = nil
	p.mu.Unlock()
	if cc != nil {
		cc.close()
	}
	p.closing.Wait()
	return nil
}

// confirmChannel is one AMQP channel in confirm mode with its in-flight publishes.
type confirmChannel struct {
	ch *amqp.Channel

	pubMu sync.Mutex // keeps sequence numbers in publish order

	mu      sync.Mutex
	pending map[uint64]*inflight
	closed  bool
	// stall counts the channel's positive confirms (nil counts nothing).
	stall *stallWatch

	done chan struct{}
}

type inflight struct {
	exchange, key, messageID string
	returned                 bool
	result                   chan error // receives the one result
}

// inflightPool recycles a publish's record and result channel, three allocations per
// publish otherwise.
var inflightPool = sync.Pool{New: func() any { return &inflight{result: make(chan error, 1)} }}

func newInflight(exchange, key, messageID string) *inflight {
	f := inflightPool.Get().(*inflight)
	f.exchange, f.key, f.messageID, f.returned = exchange, key, messageID, false
	return f
}

// release recycles f once its result was received: nothing holds it then, since a
// record leaves pending before its one result is sent. One whose result was never
// received (its publish gave up waiting) may still be sent to, and is not released.
func (f *inflight) release() {
	f.exchange, f.key, f.messageID = "", "", ""
	inflightPool.Put(f)
}

func newConfirmChannel(ch *amqp.Channel, stall *stallWatch) (*confirmChannel, error) {
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	cc := &confirmChannel{ch: ch, pending: map[uint64]*inflight{}, done: make(chan struct{}), stall: stall}
	// Both are read by one goroutine. returns is unbuffered: amqp091 delivers a
	// basic.return before the basic.ack of the same message from its single reader
	// goroutine, and that send completes only once dispatch took the return, so the
	// return is recorded before the message's confirm can be read. confirms is buffered,
	// as amqp091 asks: unbuffered, its reader waited for dispatch on every confirm (while
	// holding its confirms lock), one goroutine hand-off per message.
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, confirmBuffer))
	returns := ch.NotifyReturn(make(chan amqp.Return))
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	go cc.dispatch(confirms, returns, closed)
	return cc, nil
}

func (cc *confirmChannel) dispatch(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return, closed <-chan *amqp.Error) {
	defer close(cc.done)
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			cc.markReturned(r)
		case c, ok := <-confirms:
			if !ok {
				cc.failAll(closeReason(closed))
				// amqp091 closes returns with the channel; drain what is left so its
				// reader is never blocked on us.
				if returns != nil {
					for range returns {
					}
				}
				return
			}
			cc.mu.Lock()
			f := cc.pending[c.DeliveryTag]
			delete(cc.pending, c.DeliveryTag)
			cc.mu.Unlock()
			if f == nil {
				continue
			}
			switch {
			case f.returned:
				f.result <- ErrUnroutable
			case !c.Ack:
				f.result <- ErrNacked
			default:
				cc.stall.acked()
				f.result <- nil
			}
		}
	}
}

// markReturned finds the oldest in-flight publish the return belongs to. A return carries
// no delivery tag; exchange, routing key and message id identify it (two in-flight copies
// with the same id and route are routable or not alike).
func (cc *confirmChannel) markReturned(r amqp.Return) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	var best uint64
	for tag, f := range cc.pending {
		if f.returned || f.exchange != r.Exchange || f.key != r.RoutingKey || f.messageID != r.MessageId {
			continue
		}
		if best == 0 || tag < best {
			best = tag
		}
	}
	if best != 0 {
		cc.pending[best].returned = true
	}
}

// closeReason says why a channel closed: a channel exception the broker raised for this
// publish (no such exchange, access refused) is final; anything else (connection lost)
// means publish again on a new channel.
func closeReason(closed <-chan *amqp.Error) error {
	select {
	case e := <-closed:
		if e != nil {
			switch e.Code {
			case amqp.NotFound, amqp.AccessRefused, amqp.PreconditionFailed:
				return fmt.Errorf("broker closed the channel: %w", e)
			case amqp.FrameError, amqp.SyntaxError, amqp.InternalError:
				// amqp091 reports its own I/O failures (a missed heartbeat, a reset) as a
				// 501 frame error too: only the broker's own verdict is final.
				if !e.Server {
					break
				}
				// The broker refused this message itself (too large a header frame, a
				// value it cannot store): publishing it again would fail the same way.
				return fmt.Errorf("broker refused the message and closed the connection: %w", e)
			}
		}
	default:
	}
	return errChannelLost
}

func (cc *confirmChannel) failAll(reason error) {
	cc.mu.Lock()
	cc.closed = true
	pending := cc.pending
	cc.pending = map[uint64]*inflight{}
	cc.mu.Unlock()
	for _, f := range pending {
		f.result <- reason
	}
}

// publish sends pub and returns its in-flight record, whose result channel receives the
// confirm's verdict.
func (cc *confirmChannel) publish(ctx context.Context, exchange, key string, pub amqp.Publishing) (*inflight, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f := newInflight(exchange, key, pub.MessageId)
	cc.pubMu.Lock()
	defer cc.pubMu.Unlock()
	cc.mu.Lock()
	if cc.closed {
		cc.mu.Unlock()
		return nil, errChannelLost
	}
	seq := cc.ch.GetNextPublishSeqNo()
	cc.pending[seq] = f
	cc.mu.Unlock()
	if err := cc.ch.PublishWithContext(ctx, exchange, key, true, false, pub); err != nil {
		cc.mu.Lock()
		delete(cc.pending, seq)
		cc.mu.Unlock()
		// Not released: the channel may have failed it (failAll) before the delete.
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, errChannelLost
	}
	return f, nil
}

func (cc *confirmChannel) isClosed() bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.closed || cc.ch.IsClosed()
}

func (cc *confirmChannel) close() {
	_ = cc.ch.Close()
	<-cc.done
}

// confirmBuffer is the capacity of a confirm channel's confirmation queue: amqp091's reader
// hands confirms over without waiting for dispatch until this many are queued.
const confirmBuffer = 1024
