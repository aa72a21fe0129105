package amqp

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/broker"
)

// nativeRetryVersion is the first RabbitMQ release with delayed retry on quorum queues.
var nativeRetryVersion = [2]int{4, 3}

var _ broker.NativeRetrier = (*Broker)(nil)

// DeclareNativeRetryQueue declares queue as DeclareQueue does, with RabbitMQ 4.3's delayed
// retry (x-delayed-retry-type "failed", x-delayed-retry-min r.Min, x-delayed-retry-max
// r.Max): a delivery rejected with requeue is held back Min × its delivery count, at most
// Max, before it is delivered again. Only rejections are delayed: a message given back
// unprocessed (basic.nack, a paused handler, a stopping consumer) comes back at once.
//
// It needs a RabbitMQ 4.3 node, Config.QueueType quorum, and r.MaxRetries below
// Config.DeliveryLimit, since every retry is a rejection the limit counts (what is left
// of it is the margin for failed dead-letter publishes and lost connections); otherwise
// it declares nothing and returns an error wrapping broker.ErrNativeRetry naming what
// is missing. A queue declared before with other delays is an *InequivalentError naming
// the argument.
func (b *Broker) DeclareNativeRetryQueue(ctx context.Context, queue string, r broker.NativeRetry) error {
	if err := r.Validate(); err != nil {
		return err
	}
	if b.cfg.QueueType != QueueQuorum {
		return fmt.Errorf("queue %q: %w: it needs quorum queues (Config.QueueType is %s)", queue, broker.ErrNativeRetry, b.cfg.QueueType)
	}
	if b.cfg.DeliveryLimit > 0 && r.MaxRetries >= b.cfg.DeliveryLimit {
		return fmt.Errorf("queue %q: %w: MaxRetries %d must be below Config.DeliveryLimit %d, which counts every retry", queue, broker.ErrNativeRetry, r.MaxRetries, b.cfg.DeliveryLimit)
	}
	conn, err := b.conn.get(ctx)
	if err != nil {
		return fmt.Errorf("queue %q: native delayed retry: %w", queue, err)
	}
	if v := nodeVersion(conn); !atLeast(v, nativeRetryVersion) {
		return fmt.Errorf("queue %q: %w: it needs RabbitMQ %d.%d or later, the node is %q", queue, broker.ErrNativeRetry, nativeRetryVersion[0], nativeRetryVersion[1], v)
	}
	native := amqp.Table{
		// "failed" only: RabbitMQ accepts any value here without a word, and the others
		// would also delay what sluice gives back unprocessed.
		"x-delayed-retry-type": "failed",
		"x-delayed-retry-min":  r.Min.Milliseconds(),
		"x-delayed-retry-max":  r.Max.Milliseconds(),
	}
	if err := b.declareQueue(ctx, queue, native); err != nil {
		return inequivalent(err, "queue", queue)
	}
	b.declared.Store(queue, native)
	return nil
}

// nodeVersion is the version conn's RabbitMQ node reported when it connected ("4.3.6").
func nodeVersion(conn *amqp.Connection) string {
	v, _ := conn.Properties["version"].(string)
	return v
}

// atLeast reports whether version ("4.3.6") is want's major.minor or later; an unreadable
// version is not.
func atLeast(version string, want [2]int) bool {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return major > want[0] || major == want[0] && minor >= want[1]
}
