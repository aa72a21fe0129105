package amqp

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/sluice-go/sluice/internal/mask"
)

// QueueType is the RabbitMQ queue type sluice declares.
type QueueType string

// Queue types.
const (
	// QueueClassic is a classic durable queue.
	QueueClassic QueueType = "classic"
	// QueueQuorum is a replicated quorum queue (at-least-once dead-lettering, delivery limit).
	QueueQuorum QueueType = "quorum"
)

// defaultAckDelay is Config.AckDelay's zero value: short beside any handler, long enough
// to gather the acks of a busy queue.
const defaultAckDelay = time.Millisecond

// ErrNoURL is returned by New when Config.URLs is empty: the library reads no
// environment, the program passes the URL it read (AMQP_URL in sluice's own commands).
var ErrNoURL = errors.New("amqp: no broker URL configured: set Config.URLs (sluice reads no environment variable; the program passes AMQP_URL's value)")

// Config configures a Broker. URLs is required; the other zero values give classic queues
// and a quorum delay cascade.
type Config struct {
	// URLs are the nodes to connect to, tried in order and failed over between. Required:
	// New refuses none with ErrNoURL (the library reads no environment; a program that
	// takes AMQP_URL splits its comma-separated list into URLs).
	URLs []string
	// TLS is used for amqps:// URLs. Nil means the system roots with the URL's host name.
	TLS *tls.Config
	// QueueType is the type of the consumed queues and their DLQs. Zero means classic.
	QueueType QueueType
	// DelayQueueType is the type of the delay cascade's queues. Zero means quorum, which
	// gives at-least-once dead-lettering so a broker crash cannot drop a delayed message.
	DelayQueueType QueueType
	// DeliveryLimit is x-delivery-limit on quorum consumed queues: after that many
	// redeliveries (consumer crashes, nacks) RabbitMQ dead-letters the message to Q.dlq
	// instead of looping. Zero means 20; negative means no limit. Classic queues ignore it.
	DeliveryLimit int
	// PublishTimeout bounds a publish whose context has no deadline. Zero means 30s.
	PublishTimeout time.Duration
	// ConfirmStallTimeout is how long the publishing connection may go without RabbitMQ
	// confirming what it waits for (one publish unconfirmed that long, or only nacks, missed
	// deadlines and unconfirmed publishes meanwhile) before the publisher closes it and
	// reconnects through the next of URLs, publishing again what was unconfirmed, as after a
	// connection loss. It covers a node that keeps its clients' connections but cannot
	// confirm, as a RabbitMQ 4.x node on the minority side of a partition does. A connection
	// RabbitMQ blocked (memory or disk alarm) is exempt; a publisher that only publishes to
	// queues refusing its messages (overflow reject-publish) reconnects once per period.
	// Zero means 20s; negative turns the check off; a positive value under 1s is refused.
	ConfirmStallTimeout time.Duration
	// ReconnectMaxInterval caps the wait between reconnect attempts. Zero means 5s.
	ReconnectMaxInterval time.Duration
	// DrainTimeout is how long a closing subscriber waits for in-flight messages to be
	// acked before it gives them back to the broker. Zero means 30s.
	DrainTimeout time.Duration
	// ConsumerTimeout is the node's consumer_timeout (rabbitmq.conf): how long RabbitMQ
	// lets a consumer hold a delivery unacknowledged before it takes it back. Zero means
	// RabbitMQ's default, 30 minutes; negative means the node enforces none. When a
	// subscription's settle bound (SubscribeOptions.SettleWithin) exceeds it, a subscriber
	// on RabbitMQ 4.x raises the timeout for its own consumer (x-consumer-timeout; a
	// classic queue enforces none and refuses it), and one on 3.x logs, once per queue,
	// the consumer_timeout the operator must set: see docs/reliability.md. It never
	// lowers the node's.
	ConsumerTimeout time.Duration
	// NackBackoffMax caps how long a subscriber holds a nacked message before it requeues
	// it, so a failing hand-off (broker path broken) does not spin. Zero means 10s.
	NackBackoffMax time.Duration
	// AckDelay is how long a subscriber lets an ack wait for others, so that they reach
	// RabbitMQ as one basic.ack with multiple set. It applies only where the prefetch has
	// room beyond the handlers (Prefetch above Concurrency): waiting acks hold prefetch
	// slots, and at most half of the spare ones wait. Zero means 1ms; negative sends every
	// ack on its own.
	AckDelay time.Duration
	// FrameMax is the largest AMQP frame sluice asks RabbitMQ for; the node may lower it to
	// its own frame_max. Zero means 131072, RabbitMQ's default. Publishes fit
	// their headers to the value the connection negotiated (see Marshaler).
	FrameMax int
	// Logger receives connection and consume events. Nil means slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults() error {
	if len(c.URLs) == 0 {
		return ErrNoURL
	}
	for _, u := range c.URLs {
		parsed, err := url.Parse(u)
		if err != nil {
			return fmt.Errorf("amqp: invalid broker URL %q", mask.URL(u))
		}
		if parsed.Scheme != "amqp" && parsed.Scheme != "amqps" {
			return fmt.Errorf("amqp: broker URL %q: scheme must be amqp or amqps", mask.URL(u))
		}
		// "amqp:user:pass@host" (no "//") parses as an opaque URL without host or user,
		// which amqp091 would dial as guest@localhost: a typo must not connect elsewhere.
		if parsed.Opaque != "" {
			return fmt.Errorf("amqp: broker URL %q: want %s://[user:password@]host[:port]/[vhost]", mask.URL(u), parsed.Scheme)
		}
	}
	if c.QueueType == "" {
		c.QueueType = QueueClassic
	}
	if c.DelayQueueType == "" {
		c.DelayQueueType = QueueQuorum
	}
	for _, qt := range []QueueType{c.QueueType, c.DelayQueueType} {
		if qt != QueueClassic && qt != QueueQuorum {
			return fmt.Errorf("amqp: unknown queue type %q (want classic or quorum)", qt)
		}
	}
	if c.DeliveryLimit == 0 {
		c.DeliveryLimit = 20
	}
	if c.PublishTimeout <= 0 {
		c.PublishTimeout = 30 * time.Second
	}
	if c.ConfirmStallTimeout == 0 {
		c.ConfirmStallTimeout = defaultConfirmStallTimeout
	}
	if c.ConfirmStallTimeout > 0 && c.ConfirmStallTimeout < minConfirmStallTimeout {
		return fmt.Errorf("amqp: ConfirmStallTimeout %s is below the minimum %s (negative turns the check off)", c.ConfirmStallTimeout, minConfirmStallTimeout)
	}
	if c.ReconnectMaxInterval <= 0 {
		c.ReconnectMaxInterval = 5 * time.Second
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.ConsumerTimeout == 0 {
		c.ConsumerTimeout = defaultConsumerTimeout
	}
	if c.NackBackoffMax <= 0 {
		c.NackBackoffMax = 10 * time.Second
	}
	if c.AckDelay == 0 {
		c.AckDelay = defaultAckDelay
	}
	if c.FrameMax == 0 {
		c.FrameMax = defaultFrameMax
	}
	if c.FrameMax < minFrameMax {
		return fmt.Errorf("amqp: FrameMax %d is below AMQP's minimum frame size %d", c.FrameMax, minFrameMax)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// maskErr returns err with its text masked by maskText, for errors amqp091-go builds from
// a URL.
func maskErr(err error, urls []string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if masked := maskText(msg, urls...); masked != msg {
		return errors.New(masked)
	}
	return err
}

// maskText returns s with each of urls, and each of their passwords, masked. Use it on any
// text that may quote a broker URL before it is logged or printed; see internal/mask.Text.
func maskText(s string, urls ...string) string { return mask.Text(s, urls...) }
