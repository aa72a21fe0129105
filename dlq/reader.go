package dlq

import (
	"context"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// defaultWindow is how many messages a read has in flight from RabbitMQ.
const defaultWindow = 2000

// idleCheck is how long a read waits for a delivery before it asks RabbitMQ whether the
// queue still has ready messages (another client may have taken them); after idleChecks
// answers of none in a row it ends.
const (
	idleCheck  = 300 * time.Millisecond
	idleChecks = 3
)

// reader takes the messages of a queue in order, head first, acknowledging nothing
// itself: what the caller does not acknowledge stays unacknowledged until its channel
// closes, and RabbitMQ then gives all of it back at once.
//
// Why consumers and not basic.get: a basic.get is a round trip per message, so reading
// 100,000 messages cost minutes, and a selective replay paid that for every message it
// skipped. A consumer streams the queue. But its prefetch window also counts the
// messages the caller keeps unacknowledged on purpose (the ones it skips, and every
// message of a read-only scan), and a consumer's window cannot grow after it started
// (RabbitMQ applies basic.qos to new consumers only; the count is 16 bits anyway). So once
// a consumer holds nearly a window of kept messages, the reader cancels it, hands out what
// it had already received, and starts the next consumer on a new channel. The old channel
// stays open, holding its kept messages, until close: a channel acknowledges a message by
// scanning its unacknowledged messages from the oldest (RabbitMQ's channel keeps them in
// one queue), so acknowledging on a channel that also holds thousands of skipped messages
// made each batch's commit slower than the last (measured: 0.4 s for the first 500 of a
// selective replay, 21 s for the tenth). RabbitMQ delivers the queue in order across the
// consumers, and the client holds at most one window of messages at a time: memory stays
// flat however long the queue is.
type reader struct {
	conn  *amqp.Connection
	queue string
	// total is how many messages to read: the ready count when the read started.
	total int
	// window is each consumer's prefetch; reserve is how many of a consumer's messages
	// the caller may hold for acknowledgement at once (its batch), so a consumer is
	// replaced while it can still deliver them.
	window, reserve int
	// setup prepares each channel the reader opens (a transaction, a return listener).
	setup func(*amqp.Channel) error
	// settle bounds how long close waits for the given-back messages (see readSettle).
	settle time.Duration

	read      int
	seq       int
	ch        *amqp.Channel   // the current consumer's channel
	chans     []*amqp.Channel // every channel used, oldest first
	tag       string
	channelOf map[string]*amqp.Channel // consumer tag -> its channel
	// out counts, per channel, the messages delivered to it and not acknowledged: what
	// closing it gives back.
	out        map[*amqp.Channel]int
	deliveries <-chan amqp.Delivery
	held       int // messages of the current consumer the caller keeps unacknowledged
	delivered  int // messages the current consumer delivered
	acked      int // of those, acknowledged by the caller
	pending    []amqp.Delivery
	probe      *amqp.Channel
	// tapered: the consumer was replaced, on the same channel, by one whose prefetch is
	// what the run still needs (see taper).
	tapered bool
}

func newReader(conn *amqp.Connection, ch *amqp.Channel, queue string, total, window, reserve int, setup func(*amqp.Channel) error) (*reader, error) {
	settle := readSettle
	if setup != nil {
		settle = operationSettle
	}
	if window <= 0 {
		window = defaultWindow
	}
	window = min(window, 65535) // basic.qos's prefetch count is 16 bits
	reserve = min(reserve, window/2)
	r := &reader{conn: conn, queue: queue, total: total, window: window, reserve: reserve, setup: setup, settle: settle,
		channelOf: map[string]*amqp.Channel{}, out: map[*amqp.Channel]int{}}
	if err := r.use(ch); err != nil {
		return nil, err
	}
	return r, nil
}

// use makes ch the channel of the next consumer.
func (r *reader) use(ch *amqp.Channel) error {
	r.chans = append(r.chans, ch)
	r.ch = ch
	if err := ch.Qos(r.window, 0, false); err != nil {
		return fmt.Errorf("set prefetch on %q: %w", r.queue, err)
	}
	if r.setup != nil {
		return r.setup(ch)
	}
	return nil
}

// next returns the next message and the channel it was delivered on (where it is
// acknowledged), or ok=false once total messages were read or the queue has no ready
// message left.
func (r *reader) next(ctx context.Context) (d amqp.Delivery, ch *amqp.Channel, ok bool, err error) {
	if r.read >= r.total {
		return amqp.Delivery{}, nil, false, nil
	}
	if len(r.pending) > 0 {
		d, r.pending = r.pending[0], r.pending[1:]
		r.read++
		return d, r.channelOf[d.ConsumerTag], true, nil
	}
	if r.setup != nil && !r.tapered && r.deliveries != nil && r.total-r.read < r.window/2 {
		if err := r.taper(); err != nil {
			return amqp.Delivery{}, nil, false, err
		}
		return r.next(ctx)
	}
	if r.deliveries != nil && r.held >= r.window-r.reserve {
		// For a read (reserve 0) the consumer has its whole window unacknowledged:
		// RabbitMQ sends it nothing more and nothing is in flight, so cancelling it loses
		// no delivery (amqp091-go drops a delivery that arrives for a cancelled consumer).
		// An operation holds messages only while canHold, so it never gets here; a dry run
		// reads with reserve 0, like a read.
		if err := r.rotate(); err != nil {
			return amqp.Delivery{}, nil, false, err
		}
		return r.next(ctx)
	}
	if r.deliveries == nil {
		if err := r.consume(); err != nil {
			return amqp.Delivery{}, nil, false, err
		}
	}
	idle := time.NewTicker(idleCheck)
	defer idle.Stop()
	empty := 0
	for {
		select {
		case <-ctx.Done():
			return amqp.Delivery{}, nil, false, ctx.Err()
		case d, open := <-r.deliveries:
			if !open {
				return amqp.Delivery{}, nil, false, fmt.Errorf("read %q: consumer cancelled by RabbitMQ (queue deleted?)", r.queue)
			}
			r.read++
			r.delivered++
			r.out[r.ch]++
			return d, r.ch, true, nil
		case <-idle.C:
			ready, err := r.ready()
			if err != nil {
				return amqp.Delivery{}, nil, false, err
			}
			// No ready message, and none arrived for a while: the rest was taken by
			// someone else meanwhile. (Messages on their way to this consumer are not
			// ready either, hence the several checks.)
			if ready > 0 {
				empty = 0
			} else if empty++; empty >= idleChecks {
				return r.settleIdle(ctx)
			}
		}
	}
}

// settleIdle decides whether a read whose queue shows no ready message is over. Messages
// RabbitMQ delivered to the consumer are not ready either, while their bytes may still be
// on their way: a 20 MB message can take longer to arrive than the idle checks, and
// ending then cut the read short. Cancelling the consumer settles it: RabbitMQ sends
// cancel-ok after the last delivery it sent the consumer, and the client queues those
// before it closes the consumer's channel. What arrived is read on; with nothing, the
// read is over.
func (r *reader) settleIdle(ctx context.Context) (amqp.Delivery, *amqp.Channel, bool, error) {
	if err := r.ch.Cancel(r.tag, false); err != nil {
		return amqp.Delivery{}, nil, false, fmt.Errorf("read %q: cancel consumer: %w", r.queue, err)
	}
	r.drain()
	if len(r.pending) == 0 {
		return amqp.Delivery{}, nil, false, nil
	}
	return r.next(ctx)
}

// ack tells the reader the caller acknowledged d (its batch committed).
func (r *reader) ack(d amqp.Delivery) {
	if d.ConsumerTag == r.tag {
		r.acked++
	}
	r.out[r.channelOf[d.ConsumerTag]]--
}

// hold tells the reader the caller keeps d unacknowledged until the reader closes.
func (r *reader) hold(d amqp.Delivery) {
	if d.ConsumerTag == r.tag {
		r.held++
	}
}

// canHold reports whether the caller can hold one more message of the current consumer
// without the reader replacing the consumer for it.
func (r *reader) canHold() bool {
	return r.deliveries == nil || r.held+1 < r.window-r.reserve
}

// taper cancels an operation's consumer near the end of its run, keeping what it
// received; the next consumer, on the same channel (the same transaction), gets a prefetch
// of what the run still needs. Otherwise up to a window of messages is delivered past the
// run's end, each given back at close, and a classic queue puts back messages slowly once
// others were acknowledged between them.
func (r *reader) taper() error {
	r.tapered = true
	if err := r.ch.Cancel(r.tag, false); err != nil {
		return fmt.Errorf("read %q: cancel consumer: %w", r.queue, err)
	}
	r.drain()
	return nil
}

func (r *reader) consume() error {
	if need := r.total - r.read - len(r.pending); r.tapered && need > 0 {
		if err := r.ch.Qos(min(need, r.window), 0, false); err != nil {
			return fmt.Errorf("set prefetch on %q: %w", r.queue, err)
		}
	}
	r.seq++
	r.tag = "sluice-dlq-" + strconv.Itoa(r.seq)
	r.held, r.delivered, r.acked = 0, 0, 0
	ds, err := r.ch.Consume(r.queue, r.tag, false, false, false, false, nil)
	if err != nil {
		if isNotFound(err) {
			return fmt.Errorf("read %q: %w", r.queue, ErrQueueNotFound)
		}
		return fmt.Errorf("read %q: %w", r.queue, err)
	}
	r.channelOf[r.tag] = r.ch
	r.deliveries = ds
	return nil
}

// rotate cancels the current consumer, keeps what it had received, in order, and moves
// on to a new channel.
func (r *reader) rotate() error {
	if err := r.ch.Cancel(r.tag, false); err != nil {
		return fmt.Errorf("read %q: cancel consumer: %w", r.queue, err)
	}
	r.drain()
	ch, err := r.conn.Channel()
	if err != nil {
		return fmt.Errorf("read %q: open channel: %w", r.queue, err)
	}
	return r.use(ch)
}

// drain takes what the cancelled current consumer had received, in order, into pending.
func (r *reader) drain() {
	for d := range r.deliveries {
		r.pending = append(r.pending, d)
		r.out[r.ch]++
	}
	r.deliveries = nil
}

// close cancels the current consumer (counting what it received beyond the run's end),
// then closes the reader's channels, oldest first, each giving back the messages it held,
// and waits after each until the queue counts them as ready again: a quorum queue takes a
// closed channel's messages back asynchronously, at its head, so waiting keeps the
// channels' messages in order, and an operation started right after sees them all. A
// classic queue puts each message back at its place, whatever the order of the closes,
// but slowly when there are many (see operationSettle): once one wait runs out, the rest
// close without waiting.
func (r *reader) close() {
	if r.deliveries != nil {
		// After cancel-ok RabbitMQ sends the consumer nothing more, and amqp091-go has
		// queued what came before it: the count of what the channel gives back is exact.
		if err := r.ch.Cancel(r.tag, false); err == nil {
			r.drain()
		}
	}
	base := -1
	if n, err := r.ready(); err == nil {
		base = n
	}
	back := 0
	waiting := base >= 0
	for _, ch := range r.chans {
		_ = ch.Close()
		back += r.out[ch]
		if waiting && r.out[ch] > 0 {
			waiting = r.waitReady(base+back, time.Now().Add(r.settle))
		}
	}
	if r.probe != nil {
		_ = r.probe.Close()
	}
}

// How long close waits for the messages it gave back to be ready again: a read gives
// back every message, and the next read must see them all; an operation gives back the
// messages it skipped, which a classic queue puts back one at a time, each at its place
// (measured: about 100 s for 15,000 skipped messages with the moved ones acknowledged in
// between, on a loaded 2-core machine), so it waits for one channel at most this long and
// returns; they keep coming back after it.
const (
	readSettle      = 30 * time.Second
	operationSettle = 10 * time.Second
)

// waitReady waits until the queue has want ready messages; false when the deadline
// passed first.
func (r *reader) waitReady(want int, deadline time.Time) bool {
	for time.Now().Before(deadline) {
		n, err := r.ready()
		if err != nil {
			return false
		}
		if n >= want {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
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
