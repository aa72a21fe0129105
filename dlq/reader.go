package dlq

import (
	"context"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultWindow is how many messages a read has in flight from RabbitMQ.
const DefaultWindow = 2000

// idleCheck is how long a read waits for a delivery before it asks RabbitMQ whether the
// queue still has ready messages (another client may have taken them).
const idleCheck = 300 * time.Millisecond

// reader takes the messages of a queue in order, head first, on ch, acknowledging
// nothing itself: what the caller does not acknowledge stays unacknowledged until ch
// closes, and RabbitMQ then gives all of it back at once.
//
// Why consumers and not basic.get: a basic.get is a round trip per message, so reading
// 100,000 messages cost minutes, and a selective replay paid that for every message it
// skipped. A consumer streams the queue. But its prefetch window also counts the
// messages the caller keeps unacknowledged on purpose (the ones it skips, and every
// message of a read-only scan), and a consumer's window cannot grow after it started
// (RabbitMQ applies basic.qos to new consumers only; the count is 16 bits anyway). So once
// a consumer holds nearly a window of kept messages, the reader cancels it, reads what it
// had already received, and starts the next consumer on the same channel. Deliveries of a
// cancelled consumer stay unacknowledged on the channel, so the caller can still
// acknowledge them, and RabbitMQ delivers the queue in order across the consumers. The
// client holds at most one window of messages at a time: memory stays flat however long
// the queue is.
type reader struct {
	conn  *amqp.Connection
	ch    *amqp.Channel
	queue string
	// total is how many messages to read: the ready count when the read started.
	total int
	// window is each consumer's prefetch; reserve is how many of a consumer's messages
	// the caller may hold for acknowledgement at once (its batch), so a consumer is
	// replaced while it can still deliver them.
	window, reserve int

	read       int
	seq        int
	tag        string
	deliveries <-chan amqp.Delivery
	held       int // messages of the current consumer the caller keeps unacknowledged
	pending    []amqp.Delivery
	probe      *amqp.Channel
}

func newReader(conn *amqp.Connection, ch *amqp.Channel, queue string, total, window, reserve int) (*reader, error) {
	if window <= 0 {
		window = DefaultWindow
	}
	window = min(window, 65535) // basic.qos's prefetch count is 16 bits
	reserve = min(reserve, window/2)
	if err := ch.Qos(window, 0, false); err != nil {
		return nil, fmt.Errorf("set prefetch on %q: %w", queue, err)
	}
	return &reader{conn: conn, ch: ch, queue: queue, total: total, window: window, reserve: reserve}, nil
}

// next returns the next message, or ok=false once total messages were read or the queue
// has no ready message left.
func (r *reader) next(ctx context.Context) (d amqp.Delivery, ok bool, err error) {
	if r.read >= r.total {
		return amqp.Delivery{}, false, nil
	}
	if len(r.pending) > 0 {
		d, r.pending = r.pending[0], r.pending[1:]
		r.read++
		return d, true, nil
	}
	if r.deliveries != nil && r.held >= r.window-r.reserve {
		if err := r.rotate(); err != nil {
			return amqp.Delivery{}, false, err
		}
		return r.next(ctx)
	}
	if r.deliveries == nil {
		if err := r.consume(); err != nil {
			return amqp.Delivery{}, false, err
		}
	}
	idle := time.NewTimer(idleCheck)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return amqp.Delivery{}, false, ctx.Err()
		case d, open := <-r.deliveries:
			if !open {
				return amqp.Delivery{}, false, fmt.Errorf("read %q: consumer cancelled by RabbitMQ (queue deleted?)", r.queue)
			}
			r.read++
			return d, true, nil
		case <-idle.C:
			ready, err := r.ready()
			if err != nil {
				return amqp.Delivery{}, false, err
			}
			if ready == 0 {
				return amqp.Delivery{}, false, nil // taken by someone else meanwhile
			}
			// Ready messages, none delivered: this consumer is out of window.
			if err := r.rotate(); err != nil {
				return amqp.Delivery{}, false, err
			}
			return r.next(ctx)
		}
	}
}

// hold tells the reader the caller keeps d unacknowledged until the channel closes.
func (r *reader) hold(d amqp.Delivery) {
	if d.ConsumerTag == r.tag {
		r.held++
	}
}

func (r *reader) consume() error {
	r.seq++
	r.tag = "sluice-dlq-" + strconv.Itoa(r.seq)
	r.held = 0
	ds, err := r.ch.Consume(r.queue, r.tag, false, false, false, false, nil)
	if err != nil {
		if isNotFound(err) {
			return fmt.Errorf("read %q: %w", r.queue, ErrQueueNotFound)
		}
		return fmt.Errorf("read %q: %w", r.queue, err)
	}
	r.deliveries = ds
	return nil
}

// rotate cancels the current consumer and keeps what it had received, in order.
func (r *reader) rotate() error {
	if err := r.ch.Cancel(r.tag, false); err != nil {
		return fmt.Errorf("read %q: cancel consumer: %w", r.queue, err)
	}
	for d := range r.deliveries {
		r.pending = append(r.pending, d)
	}
	r.deliveries = nil
	return nil
}

// ready asks RabbitMQ how many ready messages the queue has.
func (r *reader) ready() (int, error) {
	if r.probe == nil {
		ch, err := r.conn.Channel()
		if err != nil {
			return 0, fmt.Errorf("open channel: %w", err)
		}
		r.probe = ch
	}
	q, err := r.probe.QueueDeclarePassive(r.queue, true, false, false, false, nil)
	if err != nil {
		r.probe = nil // a failed passive declare closes the channel
		if isNotFound(err) {
			return 0, fmt.Errorf("read %q: %w", r.queue, ErrQueueNotFound)
		}
		return 0, fmt.Errorf("check %q: %w", r.queue, err)
	}
	return q.Messages, nil
}

// close releases the reader's probe channel; the caller closes ch.
func (r *reader) close() {
	if r.probe != nil {
		_ = r.probe.Close()
	}
}

// settleTimeout bounds how long a read waits for the messages it gave back to be ready
// again.
const settleTimeout = 10 * time.Second

// closeAndSettle closes ch, which gives back every message it held unacknowledged, and
// waits until queue has at least want ready messages again (or settleTimeout passed): a
// quorum queue takes a closed channel's messages back asynchronously, and an operation
// started right after would otherwise count, and read, only part of the queue.
func closeAndSettle(conn *amqp.Connection, ch *amqp.Channel, queue string, want int) {
	_ = ch.Close()
	if want <= 0 {
		return
	}
	probe, err := conn.Channel()
	if err != nil {
		return
	}
	defer probe.Close()
	deadline := time.Now().Add(settleTimeout)
	for time.Now().Before(deadline) {
		q, err := probe.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil || q.Messages >= want {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
