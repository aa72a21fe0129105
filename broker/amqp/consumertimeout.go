package amqp

import (
	"errors"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/broker"
)

// RabbitMQ's consumer timeout takes back a delivery held unacknowledged longer than the
// node's consumer_timeout: RabbitMQ 4.x cancels a quorum queue's consumer (basic.cancel),
// 3.x closes the channel (measured on 3.10: at its next channel tick, up to a minute
// late). The stack settles every delivery within its settle bound
// (broker.SubscribeOptions.SettleWithin); a timeout below it would take back a delivery the stack
// still decides about, and hand it to another consumer while the first attempt runs. What
// the node does with a consumer's own timeout, measured on 4.3.x and 3.10:
//
//   - 4.3 quorum queue: basic.consume's x-consumer-timeout (milliseconds) replaces the
//     node's consumer_timeout and the queue's for that consumer, above or below them (so
//     it is sent only above the node's); 0 cancels at once.
//   - 4.3 classic queue: no consumer timeout is enforced at all (a delivery held 75 s on a
//     node with consumer_timeout 3000 stayed), and the argument is refused with 406
//     PRECONDITION_FAILED "invalid arg 'x-consumer-timeout' ... of queue type
//     rabbit_classic_queue", which closes the channel.
//   - 3.10: the argument is accepted and ignored, as is the queue argument; only
//     consumer_timeout in rabbitmq.conf counts.
//
// The queue argument is not used: RabbitMQ 4.x checks it for equivalence, so an existing
// queue could not be declared again with a new bound.

// defaultConsumerTimeout is RabbitMQ's consumer_timeout default (Config.ConsumerTimeout's
// zero value).
const defaultConsumerTimeout = 30 * time.Minute

// consumerTimeoutArg is basic.consume's argument raising the consumer timeout of one
// consumer, in milliseconds (RabbitMQ 4.x quorum queues).
const consumerTimeoutArg = "x-consumer-timeout"

// errConsumerTimeoutRefused ends a consume whose x-consumer-timeout the queue refused
// (a classic queue on 4.x): the subscriber consumes again at once, without it.
var errConsumerTimeoutRefused = errors.New("amqp: queue refused x-consumer-timeout")

// consumerTimeouts is what a broker's subscribers learned, per queue, about its consumer
// timeout, so that each thing is tried and logged once per queue.
type consumerTimeouts struct {
	refused sync.Map // queue → struct{}: refused x-consumer-timeout (no consumer timeout there)
	logged  sync.Map // queue → struct{}: the raise, or what the operator sets, was logged
}

// once reports whether queue is seen in m for the first time.
func once(m *sync.Map, queue string) bool {
	_, seen := m.LoadOrStore(queue, struct{}{})
	return !seen
}

// settleWithin is the subscription's settle bound for a consumer with opts: a pause gate's
// limit (a breaker's half-open probes) may let the prefetch hold more turns of the handler
// slots than the subscription's own, and the bound grows with the turns.
func (s *Subscriber) settleWithin(opts broker.SubscribeOptions) time.Duration {
	within := s.opts.SettleWithin
	base, now := turns(s.opts), turns(opts)
	if within <= 0 || now <= base {
		return within
	}
	k := time.Duration((now + base - 1) / base)
	if within > time.Duration(1<<63-1)/k {
		return time.Duration(1<<63 - 1)
	}
	return within * k
}

// turns is how many turns of the handler slots the prefetch buffer holds.
func turns(o broker.SubscribeOptions) int {
	c := max(o.Concurrency, 1)
	return (max(o.Prefetch, c) + c - 1) / c
}

// consumeArgs returns basic.consume's arguments for queue: x-consumer-timeout when the
// settle bound exceeds the node's consumer timeout on RabbitMQ 4.x and queue has not
// refused it; nil otherwise. On 3.x it logs, once per queue, what the operator sets.
func (s *Subscriber) consumeArgs(queue string, opts broker.SubscribeOptions) amqp.Table {
	within, node := s.settleWithin(opts), s.cfg.ConsumerTimeout
	if within <= 0 || node < 0 || within <= node {
		return nil
	}
	if _, refused := s.timeouts.refused.Load(queue); refused {
		return nil
	}
	conn := s.conn.current()
	if conn == nil {
		return nil // lost meanwhile: this consume fails, the next one decides
	}
	version := nodeVersion(conn)
	if !atLeast(version, [2]int{4, 0}) {
		if once(&s.timeouts.logged, queue) {
			s.logger.Warn("RabbitMQ's consumer timeout is below the time sluice may hold a delivery of this queue, and this node takes no per-consumer timeout: set consumer_timeout in rabbitmq.conf (milliseconds) to at least the bound, or the node may take a delivery back, and redeliver it, while its handler still runs",
				"queue", queue, "rabbitmq", version, "settle_within", within, "consumer_timeout", node,
				"set_consumer_timeout_ms", roundUpSecond(within).Milliseconds())
		}
		return nil
	}
	ms := roundUpSecond(within).Milliseconds()
	if once(&s.timeouts.logged, queue) {
		s.logger.Info("consumer timeout raised for this queue's consumers to the settle bound (x-consumer-timeout)",
			"queue", queue, "settle_within", within, "consumer_timeout", node, "x_consumer_timeout_ms", ms)
	}
	return amqp.Table{consumerTimeoutArg: ms}
}

// roundUpSecond rounds d up to a whole second, as x-consumer-timeout is sent: a bound of
// 10.2 s must not become a timeout of 10 s.
func roundUpSecond(d time.Duration) time.Duration {
	r := d.Truncate(time.Second)
	if r < d && r <= time.Duration(1<<63-1)-time.Second {
		r += time.Second
	}
	return r
}

// timeoutRefused reports whether err is queue refusing x-consumer-timeout for its type (a
// classic queue on RabbitMQ 4.x, which enforces no consumer timeout), and remembers it so
// the subscriber consumes queue without the argument from now on, logged once.
func (s *Subscriber) timeoutRefused(queue string, err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed || !strings.Contains(ae.Reason, consumerTimeoutArg) {
		return false
	}
	if _, seen := s.timeouts.refused.LoadOrStore(queue, struct{}{}); !seen {
		s.logger.Info("queue refuses x-consumer-timeout (a classic queue: RabbitMQ 4.x enforces no consumer timeout on it); consuming without it",
			"queue", queue, "reason", ae.Reason)
	}
	return true
}
