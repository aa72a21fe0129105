package amqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/pausegate"
)

func normalized(o broker.SubscribeOptions) broker.SubscribeOptions {
	if o.Concurrency <= 0 {
		o.Concurrency = 1
	}
	if o.Prefetch < o.Concurrency {
		o.Prefetch = o.Concurrency
	}
	return o
}

// Subscriber consumes queues that already exist (Broker.DeclareQueue). Each delivery becomes
// a Watermill message; its ack or nack is sent to RabbitMQ when the handler decides (an
// ack may wait up to Config.AckDelay to leave with others as one multiple ack). Up to
// Concurrency messages are out at once. A nacked delivery is settled as its
// broker.Delivery says (broker.Settlement): a failure, the default, is requeued after a
// backoff that grows with consecutive rejections, so a failing hand-off does not spin.
// When the connection drops, unacked deliveries return to the queue (RabbitMQ's own rule)
// and consumption resumes on the new connection.
type Subscriber struct {
	conn   *connection
	opts   broker.SubscribeOptions
	cfg    Config
	logger *slog.Logger

	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	nacks atomic.Int64 // consecutive nacks, for the requeue backoff

	gate pausegate.Gate // Pause and Resume (pause.go)

	// timeouts is shared by the broker's subscribers (consumertimeout.go).
	timeouts *consumerTimeouts

	// redeclare declares a queue again after it was deleted under its consumer; it fails
	// for a queue its broker did not declare. Nil means never.
	redeclare func(ctx context.Context, queue string) error
}

func newSubscriber(conn *connection, cfg Config, opts broker.SubscribeOptions) *Subscriber {
	return &Subscriber{conn: conn, opts: normalized(opts), cfg: cfg, logger: cfg.Logger, closing: make(chan struct{}), timeouts: &consumerTimeouts{}}
}

// Subscribe starts consuming queue. The channel closes when ctx is done or Close is called,
// after in-flight messages were acked or given back.
func (s *Subscriber) Subscribe(ctx context.Context, queue string) (<-chan *message.Message, error) {
	select {
	case <-s.closing:
		return nil, fmt.Errorf("subscribe to queue %q: %w", queue, broker.ErrClosed)
	default:
	}
	// Fail fast on a queue that does not exist, instead of looping on channel errors.
	if err := s.checkQueue(ctx, queue); err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		// Handlers left running on a closed channel may still hand a message to out:
		// out closes only after them.
		var orphans sync.WaitGroup
		defer close(out)
		defer orphans.Wait()
		s.consumeLoop(ctx, queue, out, &orphans)
	}()
	return out, nil
}

func (s *Subscriber) checkQueue(ctx context.Context, queue string) error {
	ch, err := s.conn.channel(ctx)
	if err != nil {
		return fmt.Errorf("subscribe to queue %q: %w", queue, err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("subscribe to queue %q: %w", queue, err)
	}
	return nil
}

// consumeLoop consumes until the subscriber stops, resuming after every channel or
// connection loss. A queue deleted under its consumer (RabbitMQ cancels the consumer and
// closes its delivery channel, so no empty delivery reaches a handler) is reported at
// error level and declared again when this broker declared it (Broker.DeclareQueue);
// otherwise the subscriber waits, with a growing pause, for someone to declare it.
func (s *Subscriber) consumeLoop(ctx context.Context, queue string, out chan<- *message.Message, orphans *sync.WaitGroup) {
	wait := 200 * time.Millisecond
	for {
		st := s.gate.State()
		if st.Paused {
			select {
			case <-st.Changed:
				continue
			case <-s.closing:
				return
			case <-ctx.Done():
				return
			}
		}
		err := s.consumeOnce(ctx, queue, out, st, orphans)
		if s.stopping(ctx) {
			return
		}
		if errors.Is(err, errGateChanged) || errors.Is(err, errConsumerTimeoutRefused) {
			continue
		}
		var amqpErr *amqp.Error
		switch {
		case errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound:
			if s.redeclare != nil && s.redeclare(ctx, queue) == nil {
				s.logger.Error("queue deleted under its consumer; declared it again (what it held is gone)", "queue", queue, "error", err)
				wait = 200 * time.Millisecond
				continue
			}
			s.logger.Error("queue deleted under its consumer; waiting for it to be declared again", "queue", queue, "error", err, "retry_in", wait)
			wait = min(2*wait, max(s.cfg.NackBackoffMax, time.Second))
		default:
			s.logger.Warn("consumer stopped; resuming", "queue", queue, "error", err)
			wait = 200 * time.Millisecond
		}
		select {
		case <-time.After(wait):
		case <-s.closing:
			return
		case <-ctx.Done():
			return
		}
	}
}

func (s *Subscriber) stopping(ctx context.Context) bool {
	select {
	case <-s.closing:
		return true
	case <-ctx.Done():
		return true
	default:
		return false
	}
}

// consumeOnce consumes on one channel until it closes or the subscriber stops. When the
// channel closes under running handlers it returns at once and leaves them to orphans.
func (s *Subscriber) consumeOnce(ctx context.Context, queue string, out chan<- *message.Message, st pausegate.State, orphans *sync.WaitGroup) error {
	opts := optsFor(s.opts, st)
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-waitCtx.Done():
		}
	}()
	ch, err := s.conn.channel(waitCtx)
	if err != nil {
		return err
	}
	// Closed on return, unless handlers still run on it after a broker cancel (below):
	// then the last of them closes it, so their acks can still reach RabbitMQ.
	keepOpen := false
	defer func() {
		if !keepOpen {
			_ = ch.Close()
		}
	}()
	if err := ch.Qos(opts.Prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch %d: %w", opts.Prefetch, err)
	}
	tag := fmt.Sprintf("sluice-%s-%d", queue, rand.Uint64())
	args := s.consumeArgs(queue, opts)
	deliveries, err := ch.Consume(queue, tag, false, false, false, false, args)
	if err != nil {
		if args != nil && s.timeoutRefused(queue, err) {
			return errConsumerTimeoutRefused // consume again at once, on a new channel, without it
		}
		return fmt.Errorf("consume queue %q: %w", queue, err)
	}
	// Stop the consumer on Close (or Pause, Resume) so no new deliveries arrive while
	// in-flight ones drain.
	stopped := make(chan struct{})
	go func() {
		select {
		case <-waitCtx.Done():
			_ = ch.Cancel(tag, false)
		case <-st.Changed:
			_ = ch.Cancel(tag, false)
		case <-stopped:
		}
	}()
	defer close(stopped)

	// closed ends the nack backoff early: once the channel is gone RabbitMQ has requeued
	// every unacked delivery itself, and waiting would only delay the new consumer.
	closed := make(chan struct{})
	var closeErr *amqp.Error // set before closed is closed
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		closeErr = <-chClosed
		close(closed)
	}()
	// RabbitMQ 4.x cancels a consumer of a quorum queue that overran consumer_timeout with
	// a basic.cancel to that consumer alone, where 3.x closed the channel: the channel stays
	// open, the delivery channel closes once the handlers return.
	cancelledBy := ch.NotifyCancel(make(chan string, 1))
	acks := newAcker(ch, (opts.Prefetch-opts.Concurrency)/2, s.cfg.AckDelay, s.logger, queue)
	acks.gateGrace = s.cfg.DrainTimeout
	back := &returns{changed: st.Changed}
	// Every message's context is a child of this one, built once and not per delivery.
	msgBase := context.WithoutCancel(ctx)
	var workers sync.WaitGroup
	for i := 0; i < opts.Concurrency; i++ {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for d := range deliveries {
				s.handle(ctx, msgBase, d, out, acks, closed, back)
			}
		}()
	}
	settle := func() {
		workers.Wait()
		back.flush(acks, s.logger)
		acks.close() // before ch.Close: a waiting ack must still leave
	}
	allDone := make(chan struct{})
	go func() {
		workers.Wait()
		close(allDone)
	}()
	select {
	case <-allDone:
	case <-cancelledBy:
		// Consume again now, on a new channel, as after a closed channel (below). The
		// handlers still running finish on this one and their acks go on it; RabbitMQ may
		// already have returned their messages (an ack of one fails, logged, and closes
		// this channel only). The last of them closes the channel.
		if closedChan(allDone) {
			break
		}
		keepOpen = true
		orphans.Add(1)
		go func() {
			defer orphans.Done()
			settle()
			// An ack RabbitMQ refuses closes the channel, asynchronously: say so if it does.
			select {
			case <-closed:
				if closeErr != nil {
					s.logger.Warn("ack failed; RabbitMQ will redeliver (it had taken back the deliveries of the consumer it cancelled)",
						"queue", queue, "consumer", tag, "error", closeErr)
				}
			case <-time.After(time.Second):
			}
			_ = ch.Close()
		}()
		return fmt.Errorf("consumer %s of queue %q: %w", tag, queue, errConsumerCancelled)
	case <-closed:
		// The channel is gone under its handlers (RabbitMQ closed it: consumer_timeout,
		// or the connection dropped), and RabbitMQ requeued every delivery it had. Consume
		// again now, not once the slowest handler returns (up to HandlerTimeout, or never
		// for one that ignores its context): the handlers still running finish on their
		// own, and their acks fail on the dead channel, logged. Close still waits for them.
		// Meanwhile the handler runs more messages at once than Concurrency, by as many as
		// were left running.
		orphans.Add(1)
		go func() {
			defer orphans.Done()
			settle()
		}()
		return closedErr(closeErr)
	}
	settle()
	if closedChan(st.Changed) {
		return errGateChanged
	}
	if closedChan(closed) {
		return closedErr(closeErr)
	}
	return errors.New("delivery channel closed")
}

// errConsumerCancelled is why a consumer stopped when RabbitMQ cancelled it (basic.cancel):
// on 4.x, a quorum queue's consumer that held a delivery past consumer_timeout. The
// subscriber consumes again at once.
var errConsumerCancelled = errors.New("amqp: consumer cancelled by RabbitMQ (consumer_timeout on RabbitMQ 4.x, or its queue deleted)")

// closedErr says why a consumer's channel closed: the broker's reason (a consumer_timeout
// is PRECONDITION_FAILED) or the connection's loss.
func closedErr(e *amqp.Error) error {
	if e == nil {
		return errors.New("delivery channel closed")
	}
	return fmt.Errorf("delivery channel closed: %w", e)
}

// handle hands one delivery out and settles it with RabbitMQ. msgBase is ctx without its
// cancellation, the parent of the message's context.
func (s *Subscriber) handle(ctx, msgBase context.Context, d amqp.Delivery, out chan<- *message.Message, acks *acker, chClosed <-chan struct{}, back *returns) {
	gateChanged := back.changed
	msg := unmarshal(d)
	msgCtx, cancel := context.WithCancel(msgBase)
	defer cancel()
	msgCtx, dl := broker.WithDelivery(msgCtx)
	msg.SetContext(msgCtx)

	// Given back unhandled (closing): a nack, which RabbitMQ 4.x does not count as a
	// failed delivery (broker.SettleReturn).
	giveBack := func() {
		_ = d.Nack(false, true)
		acks.nacked(d.DeliveryTag)
	}
	if s.stopping(ctx) {
		giveBack()
		return
	}
	if closedChan(gateChanged) {
		back.add(d)
		return
	}
	select {
	case out <- msg:
	case <-s.closing:
		giveBack()
		return
	case <-ctx.Done():
		giveBack()
		return
	case <-gateChanged:
		back.add(d)
		return
	}

	// The message is with a handler now: wait for its verdict. On Close it gets
	// DrainTimeout to finish, then goes back to the queue.
	var drain <-chan time.Time
	closing := s.closing
	for {
		select {
		case <-msg.Acked():
			s.nacks.Store(0)
			if wait := dl.HeldAck(); wait != nil {
				// A step holds the ack (its journal record's confirm): the worker takes
				// the next delivery meanwhile.
				acks.gate(wait, s.released(acks, d, msg.UUID))
				return
			}
			acks.ack(d.DeliveryTag)
			return
		case <-msg.Nacked():
			if wait := dl.HeldAck(); wait != nil {
				acks.gate(wait, func(error) {}) // it settles the step's own state; the nack stands
			}
			if s.requeueLater(d, msg, dl.Settlement(), chClosed, gateChanged) {
				acks.nacked(d.DeliveryTag)
			}
			return
		case <-closing:
			closing = nil
			t := time.NewTimer(s.cfg.DrainTimeout)
			defer t.Stop()
			drain = t.C
		case <-drain:
			// Cancel the handler and give it a moment to answer, so a hand-off it is
			// making is not doubled by our requeue.
			cancel()
			select {
			case <-msg.Acked():
				if wait := dl.HeldAck(); wait != nil {
					acks.gate(wait, s.released(acks, d, msg.UUID))
					return
				}
				acks.ack(d.DeliveryTag)
				return
			case <-msg.Nacked():
				if wait := dl.HeldAck(); wait != nil {
					acks.gate(wait, func(error) {})
				}
			case <-time.After(time.Second):
			}
			s.logger.Warn("handler did not finish within the drain timeout; message returned to the queue", "message_id", msg.UUID)
			giveBack()
			return
		}
	}
}

// released settles d once a held ack's wait (broker.Delivery.HoldAck) returned: an ack, or,
// when the wait failed, a nack with requeue (the step's work was not confirmed, so the
// message is not done, and no fault of it: broker.SettleReturn).
func (s *Subscriber) released(acks *acker, d amqp.Delivery, id string) func(error) {
	return func(err error) {
		if err == nil {
			acks.ack(d.DeliveryTag)
			return
		}
		s.logger.Debug("held ack failed; message returned to the queue", "message_id", id, "error", err)
		_ = d.Nack(false, true)
		acks.nacked(d.DeliveryTag)
	}
}

// requeueLater settles a nacked delivery as its step said (broker.Settlement): returned
// unprocessed with a basic.nack, at once, which RabbitMQ 4.x does not count toward a quorum
// queue's delivery limit; held back by its queue (native delayed retry) with a basic.reject
// at once, since a delay here would only add to the queue's and hold a handler slot
// meanwhile; or, a failure, with a basic.reject after a backoff that grows with consecutive
// rejections, so that a hand-off that keeps failing does not spin and, counted, ends in
// the queue's DLQ on a quorum queue's delivery limit. It reports whether it settled d: not
// when the channel closed first.
func (s *Subscriber) requeueLater(d amqp.Delivery, msg *message.Message, how broker.Settlement, chClosed, gateChanged <-chan struct{}) bool {
	switch how {
	case broker.SettleReturn:
		if err := d.Nack(false, true); err != nil {
			s.logger.Warn("nack failed; RabbitMQ will redeliver", "message_id", msg.UUID, "error", err)
		}
		return true
	case broker.SettleHoldBack:
		if err := d.Reject(true); err != nil {
			s.logger.Warn("reject failed; RabbitMQ will redeliver", "message_id", msg.UUID, "error", err)
		}
		return true
	}
	n := s.nacks.Add(1)
	wait := time.Duration(0)
	if n > 1 {
		wait = 50 * time.Millisecond << min(n-2, 10)
		if wait > s.cfg.NackBackoffMax {
			wait = s.cfg.NackBackoffMax
		}
		wait = wait/2 + rand.N(wait/2+1)
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-s.closing:
			t.Stop()
		case <-gateChanged:
			// Paused: nobody takes the message before Resume, so the backoff has no use.
			t.Stop()
		case <-chClosed:
			t.Stop()
			return false // RabbitMQ already requeued it with the channel
		}
	}
	if err := d.Reject(true); err != nil {
		s.logger.Warn("reject failed; RabbitMQ will redeliver", "message_id", msg.UUID, "error", err)
	}
	return true
}

// Close stops consuming, lets in-flight messages finish within DrainTimeout, and returns
// once every goroutine of the subscriber has ended.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	s.wg.Wait()
	return nil
}
