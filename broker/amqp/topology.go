package amqp

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/internal/topology"
)

// The delay cascade (docs/DESIGN.md; its names are package topology's): Q's dead letters go to
// Q.dlq through the direct exchange sluice.dlx; the delay cascade sluice.delay.* is shared by
// every queue of a vhost.
const (
	// DelayLevels is the number of binary digits of a delay in the cascade's routing key;
	// a delay is at most 2^DelayLevels-1 units.
	DelayLevels = 26
	// DelayResolution is the cascade's unit: delays are exact to this.
	DelayResolution = 10 * time.Millisecond
	// maxDelay is the longest delay the cascade can give (about 7.8 days).
	maxDelay = time.Duration(1<<DelayLevels-1) * DelayResolution
)

// The cascade holds a delay digit by digit in base 2^delayDigitBits, one queue per nonzero
// value of each digit. Every queue a message waits in is a quorum queue's TTL expiry and
// an at-least-once dead-letter, and each costs lateness: measured on RabbitMQ 3.10, about
// 11 ms a queue on a quiet 2-core broker and 41 ms with the retry path at full speed
// beside it (BENCHMARKS.md, "Delay lateness"). In base 16 a delay up to 40 s crosses at
// most 3 queues, where the binary cascade of sluice 0.1.0 crossed one per set bit, up to
// 12; the price is 15 queues a digit instead of one a bit (93 instead of 26).
const (
	delayDigitBits = 4
	// delayDigits is the number of digits: the last one holds the top DelayLevels bits
	// left over (2 of them).
	delayDigits = (DelayLevels + delayDigitBits - 1) / delayDigitBits
)

// delayDigitWidth is how many bits digit j holds.
func delayDigitWidth(j int) int { return min(delayDigitBits, DelayLevels-j*delayDigitBits) }

// delayEntryExchange is where a delay of units enters the cascade: the exchange of its
// highest nonzero digit. Every digit above would only pass it on, and each exchange hop
// costs the broker.
func delayEntryExchange(units uint64) string {
	return topology.DelayDigit(max(bits.Len64(units)-1, 0) / delayDigitBits)
}

// deliveryBindingKey matches a routing key of DelayLevels digit words followed by queue;
// the fixed count of `*` keeps "a.b" and "b" apart.
func deliveryBindingKey(queue string) string {
	return strings.Repeat("*.", DelayLevels) + queue
}

func queueArgs(qt QueueType, extra amqp.Table) amqp.Table {
	args := amqp.Table{"x-queue-type": string(qt)}
	for k, v := range extra {
		args[k] = v
	}
	return args
}

// declareQueue declares queue and everything its failure paths need: the dead-letter
// exchange and Q.dlq, and the binding that brings delayed copies back to Q. It is
// idempotent; a queue that exists with other arguments is an error naming them.
//
// Every object is declared with no-wait on one channel and a last synchronous call fences
// them: RabbitMQ handles a channel's methods in order, so its answer means everything before
// it was declared, and a failed declaration closes the channel with an error that the fence
// returns. Start-up costs a few round trips instead of one per object (the cascade alone
// is over a hundred), which is what a distant broker makes slow.
//
// native holds arguments the queue is declared with beside sluice's own (the native
// delayed retry's, nativeretry.go); nil means none.
func (b *Broker) declareQueue(ctx context.Context, queue string, native amqp.Table) error {
	return b.declareAgainIfCrashed(ctx, queue, func() error { return b.declareQueueOnce(ctx, queue, native) })
}

func (b *Broker) declareQueueOnce(ctx context.Context, queue string, native amqp.Table) error {
	ch, err := b.conn.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	// The DLQ first, in a round trip of its own: one declared by an earlier sluice may be
	// refused its new arguments, which closes the channel (declareDLQ goes on with another).
	dlq := topology.DLQ(queue)
	if ch, err = b.declareDLQ(ctx, ch, dlq); err != nil {
		return err
	}
	defer ch.Close()
	d := newDeclarer(ch)
	// The delivery exchange the queue's delay route binds to; the cascade's digits come
	// with the first delay that needs them.
	d.exchange(topology.DelayDeliveryExchange, amqp.ExchangeTopic)
	d.exchange(topology.DeadLetterExchange, amqp.ExchangeDirect)
	d.bindQueue(dlq, queue, topology.DeadLetterExchange)
	// RabbitMQ's own dead-lettering (a quorum queue's delivery limit) also lands in Q.dlq,
	// so a message that keeps crashing its consumer stops looping.
	extra := amqp.Table{
		"x-dead-letter-exchange":    topology.DeadLetterExchange,
		"x-dead-letter-routing-key": queue,
	}
	if b.cfg.QueueType == QueueQuorum && b.cfg.DeliveryLimit > 0 {
		extra["x-delivery-limit"] = int64(b.cfg.DeliveryLimit)
	}
	for k, v := range native {
		extra[k] = v
	}
	d.queue(queue, queueArgs(b.cfg.QueueType, extra))
	d.bindQueue(queue, deliveryBindingKey(queue), topology.DelayDeliveryExchange)
	if err := d.fence(ctx); err != nil {
		return fmt.Errorf("declare queue %q (type %s) with its DLQ and delay route: %w", queue, b.cfg.QueueType, err)
	}
	return nil
}

// declareDLQ declares the dead-letter queue dlq on ch (see topology.DeadLetterArgs). A quorum
// DLQ declared by an earlier sluice without the delivery-limit argument cannot take it
// (RabbitMQ refuses to change a queue's arguments and closes ch): it is kept as it is, on a
// new channel, and a warning says how to lift its limit with a policy. It returns the
// channel to go on with.
func (b *Broker) declareDLQ(ctx context.Context, ch *amqp.Channel, dlq string) (*amqp.Channel, error) {
	_, err := ch.QueueDeclare(dlq, true, false, false, false, amqp.Table(topology.DeadLetterArgs(string(b.cfg.QueueType), nil)))
	if err == nil {
		return ch, nil
	}
	var ae *amqp.Error
	if b.cfg.QueueType != QueueQuorum || !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed || !strings.Contains(ae.Reason, "x-delivery-limit") {
		return ch, fmt.Errorf("declare queue %q (type %s): %w", dlq, b.cfg.QueueType, err)
	}
	next, cerr := b.conn.channel(ctx)
	if cerr != nil {
		return ch, cerr
	}
	if _, perr := next.QueueDeclarePassive(dlq, true, false, false, false, nil); perr != nil {
		_ = next.Close()
		return ch, fmt.Errorf("declare queue %q (type %s): %w", dlq, b.cfg.QueueType, err)
	}
	b.cfg.Logger.Warn("dead-letter queue declared without a delivery limit argument by an earlier version; "+
		"on RabbitMQ 4.x set a policy with delivery-limit -1 on it so that reading it never deletes messages",
		"queue", dlq)
	return next, nil
}

// delayUnits is d in the cascade's units, rounded to the nearest.
func delayUnits(d time.Duration) uint64 { return uint64((d + DelayResolution/2) / DelayResolution) }

// digitsFor is how many of the cascade's digits, from the lowest, a delay of units crosses:
// those up to its highest nonzero digit (its entry, delayEntryExchange).
func digitsFor(units uint64) int { return max(bits.Len64(units)-1, 0)/delayDigitBits + 1 }

// declareCascade declares the delivery exchange every queue's delay route binds to; the
// digits come with the delays that need them (cascadeUpTo).
func (b *Broker) declareCascade(ctx context.Context) error { return b.cascadeUpTo(ctx, 0) }

// cascadeFor makes the cascade's lowest n digits ready for a delay: as cascadeUpTo, except
// that digits found declared already (by an earlier run of the service, another instance)
// are used at once and declared again in the background. Declaring again is idempotent
// and repairs what is missing, but on RabbitMQ 4.x every binding is a write to its
// metadata store (Khepri, a Raft log): measured on 4.3.6, some 4 ms a binding, about 200 ms
// for the 48 of three digits against 40 ms on 3.10.8, and every delay of a service's first
// burst of failures waited for it (issue 55). A background declaration that fails is
// logged, and the next delay declares again, in place, and reports its error.
func (b *Broker) cascadeFor(ctx context.Context, n int) error {
	b.cascadeMu.Lock()
	defer b.cascadeMu.Unlock()
	if b.cascadeExchange && b.cascadeDigits >= n || b.cascadeFound(ctx, n) {
		return nil
	}
	return b.cascadeUpToLocked(ctx, n)
}

// cascadeFound reports whether the cascade's lowest n digits are declared on the broker,
// and if so records them as ready and declares them again in the background. The caller
// holds cascadeMu. A digit's
// last queue (value 15, or 3 for the top digit) is declared after every other object of
// it and of the digits below, in one channel's order (cascadeOn), so finding it passively
// finds them too.
func (b *Broker) cascadeFound(ctx context.Context, n int) bool {
	if n == 0 || n > delayDigits {
		return false
	}
	last := topology.DelayDigitQueue(n-1, 1<<delayDigitWidth(n-1)-1)
	// A passive declare is a read, but on a quorum queue it asks the queue's leader: on a
	// connection of its own, as cascadeUpTo's declarations (a refusal during a partition
	// can close the connection).
	err := b.conn.onEachNode(ctx, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(last, true, false, false, false, nil)
		return err
	})
	if err != nil {
		return false
	}
	from := b.cascadeDigits
	b.cascadeExchange, b.cascadeDigits = true, n
	b.cascadeBG.Add(1)
	go func() {
		defer b.cascadeBG.Done()
		if err := b.redeclareCascade(from, n); err != nil {
			b.cfg.Logger.Error("delay cascade found declared, but declaring it again failed; the next delay declares it again",
				"digits", n, "error", err)
		}
	}()
	return true
}

// redeclareCascade declares digits from … to-1 again (cascadeFound), within the broker's
// life; on failure it forgets that they are declared, so that a delay declares them in
// place.
func (b *Broker) redeclareCascade(from, to int) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-b.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := b.declareDigits(ctx, from, to)
	if err != nil {
		b.cascadeMu.Lock()
		b.cascadeDigits = min(b.cascadeDigits, from)
		b.cascadeMu.Unlock()
	}
	return err
}

// cascadeUpTo declares the delivery exchange and the cascade's lowest n digits, once per
// broker: only what is missing (the cascade is shared, and re-declaring the same thing is
// harmless, so a lost race with another instance costs nothing). Declaring on demand keeps
// a vhost whose handlers never delay long from holding the cascade's top digits: each
// digit is 15 quorum queues, a Raft group each on a cluster.
func (b *Broker) cascadeUpTo(ctx context.Context, n int) error {
	b.cascadeMu.Lock()
	defer b.cascadeMu.Unlock()
	return b.cascadeUpToLocked(ctx, n)
}

// cascadeUpToLocked is cascadeUpTo for a caller holding cascadeMu.
func (b *Broker) cascadeUpToLocked(ctx context.Context, n int) error {
	if b.cascadeExchange && b.cascadeDigits >= n {
		return nil
	}
	if err := b.declareDigits(ctx, b.cascadeDigits, n); err != nil {
		return err
	}
	b.cascadeExchange = true
	b.cascadeDigits = max(b.cascadeDigits, n)
	return nil
}

// declareDigits declares the delivery exchange and the cascade's digits from … to-1.
func (b *Broker) declareDigits(ctx context.Context, from, to int) error {
	declare := func(ch *amqp.Channel) error {
		d := newDeclarer(ch)
		b.cascadeOn(d, from, to)
		return d.fence(ctx)
	}
	var err error
	if to > from {
		// Quorum queues, declared while the broker may be in trouble (the first delay into
		// a digit can come during a partition, where RabbitMQ 4.3 answers with a
		// connection-level INTERNAL_ERROR, or cluster_not_formed from a node in the
		// minority): on a connection of their own, so that a refusal never takes the
		// consumers and publishes with it, and on the next node when one refuses.
		err = b.conn.onEachNode(ctx, declare)
	} else {
		var ch *amqp.Channel
		if ch, err = b.conn.channel(ctx); err != nil {
			return err
		}
		defer ch.Close()
		err = declare(ch)
	}
	if err != nil {
		return fmt.Errorf("declare delay cascade up to digit %d (queue type %s): %w", to-1, b.cfg.DelayQueueType, err)
	}
	return nil
}

// cascadeOn queues the declarations of the cascade's digits from … to-1 on d, with the
// delivery exchange; digit j's exchange binds to digit j-1's, so lower digits come first.
//
// A routing key is DelayLevels binary digits, highest first, then the destination queue
// (delayRoutingKey); digit j of the delay in base 16 is binary digits 4j … 4j+3. Digit j has
// a topic exchange sluice.delay.dJ and, for each nonzero value v, a queue sluice.delay.dJ.VV
// with x-message-ttl v·16^j units: the exchange sends a key whose digit j is v to that
// queue, and one whose digit is 0 on to digit j-1's exchange. Every message in a queue has
// the same TTL, so messages expire in arrival order: a long delay never holds back a short
// one. An expired message is dead-lettered, keeping its routing key, to digit j-1's
// exchange; digit 0 dead-letters to the delivery exchange, which routes on the destination.
//
// The binary cascade of sluice 0.1.0 (sluice.delay.00 … 25) is not declared, nor deleted:
// what is parked in it still expires level by level into the same delivery exchange and
// reaches its queue, and an instance of 0.1.0 beside this one keeps using it.
func (b *Broker) cascadeOn(d *declarer, from, to int) {
	d.exchange(topology.DelayDeliveryExchange, amqp.ExchangeTopic)
	for j := from; j < min(to, delayDigits); j++ {
		name := topology.DelayDigit(j)
		next := topology.DelayDeliveryExchange
		if j > 0 {
			next = topology.DelayDigit(j - 1)
		}
		d.exchange(name, amqp.ExchangeTopic)
		width := delayDigitWidth(j)
		for v := 0; v < 1<<width; v++ {
			key := delayDigitBindingKey(j, v)
			if v == 0 {
				d.bindExchange(next, key, name)
				continue
			}
			queue := topology.DelayDigitQueue(j, v)
			ttl := int64(time.Duration(uint64(v)<<(j*delayDigitBits)) * DelayResolution / time.Millisecond)
			extra := amqp.Table{
				"x-message-ttl":          ttl,
				"x-dead-letter-exchange": next,
			}
			if b.cfg.DelayQueueType == QueueQuorum {
				// At-least-once dead-lettering: the message leaves the queue only once the
				// next hop confirmed it, so a node crash mid-cascade cannot drop it.
				extra["x-dead-letter-strategy"] = "at-least-once"
				extra["x-overflow"] = "reject-publish"
			}
			d.queue(queue, queueArgs(b.cfg.DelayQueueType, extra))
			d.bindQueue(queue, key, name)
		}
	}
}

// delayDigitBindingKey matches a routing key whose digit j has value v: a `*` for each
// binary digit above it, its binary digits, then anything.
func delayDigitBindingKey(j, v int) string {
	width := delayDigitWidth(j)
	hi := j*delayDigitBits + width - 1 // highest binary digit of digit j
	var sb strings.Builder
	sb.WriteString(strings.Repeat("*.", DelayLevels-1-hi))
	for k := width - 1; k >= 0; k-- {
		if v&(1<<k) != 0 {
			sb.WriteString("1.")
		} else {
			sb.WriteString("0.")
		}
	}
	sb.WriteString("#")
	return sb.String()
}

// crashedDeclareAttempts bounds the declarations of one queue refused as crashed.
const crashedDeclareAttempts = 5

// declareAgainIfCrashed runs declare, and again, up to crashedDeclareAttempts in all, while
// RabbitMQ refuses it with 404 "has crashed and failed to restart". RabbitMQ 3.10 answers so
// for a new durable queue that other instances declare at the same instant on a busy node
// (instances of a partitioned handler starting together: TestRebalancing_JoinAndKill…
// failed so in CI); the queue is there a moment later. The 404 closed the channel, so
// declare must use a new one each time.
func (b *Broker) declareAgainIfCrashed(ctx context.Context, queue string, declare func() error) error {
	for attempt := 1; ; attempt++ {
		err := declare()
		if err == nil || attempt == crashedDeclareAttempts || !crashedQueue(err) {
			return err
		}
		b.cfg.Logger.Warn("queue declaration refused as crashed; declaring it again", "queue", queue, "attempt", attempt, "error", err)
		t := time.NewTimer(time.Duration(attempt) * 100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// crashedQueue reports whether err is RabbitMQ's 404 for a queue whose process "has crashed
// and failed to restart".
func crashedQueue(err error) bool {
	var e *amqp.Error
	return errors.As(err, &e) && e.Code == amqp.NotFound && strings.Contains(e.Reason, "failed to restart")
}

// declarer sends declarations with no-wait on one channel; fence waits for them all. The
// first error sticks: after it the channel is closed and nothing more is sent.
type declarer struct {
	ch *amqp.Channel
	// closed hears the channel's close: a refused no-wait declaration closes the channel,
	// and the next call on it fails with ErrClosed, which does not say why.
	closed <-chan *amqp.Error
	err    error
	last   string // what was declared last, for errors
}

func newDeclarer(ch *amqp.Channel) *declarer {
	return &declarer{ch: ch, closed: ch.NotifyClose(make(chan *amqp.Error, 1))}
}

// closeReasonWait is how long a call that found the channel closed waits for the close's
// reason: the client marks the channel closed a moment before it tells the listeners.
const closeReasonWait = 5 * time.Second

// reason returns err, or, when err only says the channel is closed, the error RabbitMQ
// closed it with (a refused declaration's, naming the object and the argument).
func (d *declarer) reason(err error) error {
	if !errors.Is(err, amqp.ErrClosed) {
		return err
	}
	t := time.NewTimer(closeReasonWait)
	defer t.Stop()
	select {
	case e, ok := <-d.closed:
		if ok && e != nil {
			return e
		}
	case <-t.C:
	}
	return err
}

func (d *declarer) do(what string, f func() error) {
	if d.err != nil {
		return
	}
	d.last = what
	if err := f(); err != nil {
		if reason := d.reason(err); reason != err {
			// An earlier declaration was refused; the reason names it.
			d.err = fmt.Errorf("declarations up to %s: %w", what, reason)
			return
		}
		d.err = fmt.Errorf("%s: %w", what, err)
	}
}

func (d *declarer) exchange(name, kind string) {
	d.do(fmt.Sprintf("declare exchange %q", name), func() error {
		return d.ch.ExchangeDeclare(name, kind, true, false, false, true, nil)
	})
}

func (d *declarer) queue(name string, args amqp.Table) {
	d.do(fmt.Sprintf("declare queue %q (%v)", name, args["x-queue-type"]), func() error {
		_, err := d.ch.QueueDeclare(name, true, false, false, true, args)
		return err
	})
}

func (d *declarer) bindQueue(queue, key, exchange string) {
	d.do(fmt.Sprintf("bind queue %q to %q", queue, exchange), func() error {
		return d.ch.QueueBind(queue, key, exchange, true, nil)
	})
}

func (d *declarer) bindExchange(dest, key, source string) {
	d.do(fmt.Sprintf("bind exchange %q to %q", dest, source), func() error {
		return d.ch.ExchangeBind(dest, key, source, true, nil)
	})
}

// fence waits, within ctx, until RabbitMQ has handled every declaration sent: a
// synchronous declaration of the delivery exchange, which every topology has, is
// answered only after them. A refused declaration closed the channel; its error (which
// names the object and the argument RabbitMQ objected to) is returned.
func (d *declarer) fence(ctx context.Context) error {
	if d.err != nil {
		return d.err
	}
	res := make(chan error, 1)
	go func() {
		res <- d.ch.ExchangeDeclare(topology.DelayDeliveryExchange, amqp.ExchangeTopic, true, false, false, false, nil)
	}()
	select {
	case err := <-res:
		if err != nil {
			return fmt.Errorf("declarations up to %s: %w", d.last, d.reason(err))
		}
		return nil
	case <-ctx.Done():
		// The deferred channel close ends the call; a channel close on a silent node
		// waits for the connection's heartbeat to fail.
		return fmt.Errorf("declarations up to %s: waiting for RabbitMQ: %w", d.last, ctx.Err())
	}
}

// delayRoutingKey encodes units as DelayLevels binary digits, highest level first, then
// the destination queue.
func delayRoutingKey(units uint64, queue string) string {
	var sb strings.Builder
	sb.Grow(DelayLevels*2 + len(queue))
	for k := DelayLevels - 1; k >= 0; k-- {
		if units&(1<<k) != 0 {
			sb.WriteString("1.")
		} else {
			sb.WriteString("0.")
		}
	}
	sb.WriteString(queue)
	return sb.String()
}
