// Package failover publishes to a second RabbitMQ cluster when no node of the first can be
// reached, and consumes from both.
//
// A cluster's broker (amqp.New) needs its first connection to succeed; Dial connects one
// in the background instead, so that a producer can start while its primary is
// unreachable: Dial's publisher reports itself not connected until then, and Publisher
// sends to the secondary meanwhile and to the primary once it appears.
//
// The clusters do not share messages: what was published to the secondary stays there
// until a consumer of the secondary takes it (Subscriber consumes both). Copying messages
// between clusters is the job of RabbitMQ's federation or shovel plugins, not sluice's.
package failover

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
)

// Config configures a Publisher. The zero value is usable.
type Config struct {
	// PrimaryTimeout is how long a publish waits for the primary's confirm before it is
	// published to the secondary. Zero means 2s.
	PrimaryTimeout time.Duration
	// RetryPrimaryEvery is how often, while publishing to the secondary, one publish tries
	// the primary again when it seems connected (or cannot say, see PrimaryUp) but failed.
	// A primary that reconnects after being unreachable is tried at once. Zero means 1s.
	RetryPrimaryEvery time.Duration
	// PrimaryUp reports whether a primary node can be reached now. Nil means the primary
	// publisher's Connected method (sluice's *amqp.Publisher has one), else unknown: then
	// the primary is tried again every RetryPrimaryEvery.
	PrimaryUp func() bool
	// Permanent tells an error the secondary cannot cure (it is returned as it is). Nil
	// means amqp.ErrUnroutable.
	Permanent func(error) bool
	// Logger receives the switches between clusters. Nil means slog.Default().
	Logger *slog.Logger
}

// validate fills in the defaults and refuses negative durations.
func (c *Config) validate() error {
	if c.PrimaryTimeout < 0 || c.RetryPrimaryEvery < 0 {
		return errors.New("failover: negative PrimaryTimeout or RetryPrimaryEvery")
	}
	if c.PrimaryTimeout == 0 {
		c.PrimaryTimeout = 2 * time.Second
	}
	if c.RetryPrimaryEvery == 0 {
		c.RetryPrimaryEvery = time.Second
	}
	if c.Permanent == nil {
		c.Permanent = func(err error) bool { return errors.Is(err, amqp.ErrUnroutable) }
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Publisher publishes within a caller's context (sluice.PublishContext uses that).
var _ sluice.ContextPublisher = (*Publisher)(nil)

// Publisher publishes to the primary cluster while one of its nodes can be reached, and to
// the secondary otherwise; it returns to the primary as soon as the primary is back. Both
// are confirmed publishers, so success means one cluster confirmed the message. A message
// whose primary confirm was lost in the failure may be on both clusters (at-least-once),
// and order holds within a cluster, not across a switch.
type Publisher struct {
	primary, secondary message.Publisher
	cfg                Config
	up                 func() bool

	mu          sync.Mutex
	onSecondary bool
	lastTry     time.Time

	toPrimary, toSecondary atomic.Uint64
}

// NewPublisher returns a publisher over primary and secondary, or an error for a negative
// PrimaryTimeout or RetryPrimaryEvery. Close closes neither.
func NewPublisher(primary, secondary message.Publisher, cfg Config) (*Publisher, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	p := &Publisher{primary: primary, secondary: secondary, cfg: cfg, up: cfg.PrimaryUp}
	if p.up == nil {
		if c, ok := primary.(interface{ Connected() bool }); ok {
			p.up = c.Connected
		}
	}
	return p, nil
}

// Publish publishes messages to topic on the cluster in use, within the first message's
// context deadline (else the wrapped publishers' own).
func (p *Publisher) Publish(topic string, messages ...*message.Message) error {
	ctx := context.Background()
	if len(messages) > 0 {
		ctx = messages[0].Context()
	}
	return p.PublishContext(ctx, topic, messages...)
}

// PublishContext is Publish within ctx.
func (p *Publisher) PublishContext(ctx context.Context, topic string, messages ...*message.Message) error {
	if p.tryPrimary() {
		pctx, cancel := context.WithTimeout(ctx, p.cfg.PrimaryTimeout)
		err := sluice.PublishContext(pctx, p.primary, topic, messages...)
		cancel()
		if err == nil {
			p.toPrimary.Add(uint64(len(messages)))
			p.use(false, nil)
			return nil
		}
		if p.cfg.Permanent(err) || ctx.Err() != nil {
			return err
		}
		p.use(true, err)
	}
	if err := sluice.PublishContext(ctx, p.secondary, topic, messages...); err != nil {
		return err
	}
	p.toSecondary.Add(uint64(len(messages)))
	return nil
}

// tryPrimary says whether this publish goes to the primary first: not while no primary
// node is connected, and, after a failure, once every RetryPrimaryEvery (a connected but
// blocked primary must not cost every publish PrimaryTimeout).
func (p *Publisher) tryPrimary() bool {
	if p.up != nil && !p.up() {
		p.use(true, errNotConnected)
		p.mu.Lock()
		p.lastTry = time.Time{} // back and connected: try it at once
		p.mu.Unlock()
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.onSecondary || time.Since(p.lastTry) >= p.cfg.RetryPrimaryEvery {
		p.lastTry = time.Now()
		return true
	}
	return false
}

var errNotConnected = errors.New("no primary node connected")

func (p *Publisher) use(secondary bool, why error) {
	p.mu.Lock()
	changed := p.onSecondary != secondary
	p.onSecondary = secondary
	p.mu.Unlock()
	switch {
	case changed && secondary:
		p.cfg.Logger.Warn("failover: primary RabbitMQ cluster unreachable; publishing to the secondary", "error", why)
	case changed:
		p.cfg.Logger.Info("failover: primary RabbitMQ cluster back; publishing to it again")
	}
}

// OnSecondary reports whether publishes go to the secondary now.
func (p *Publisher) OnSecondary() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.onSecondary
}

// counts returns how many messages each cluster confirmed.
func (p *Publisher) counts() (primary, secondary uint64) {
	return p.toPrimary.Load(), p.toSecondary.Load()
}

// Close does nothing: the wrapped publishers belong to the caller.
func (p *Publisher) Close() error { return nil }
