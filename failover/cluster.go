package failover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v4"

	"github.com/sluice-go/sluice/broker/amqp"
)

// errClusterNotConnected is returned by a Cluster's publisher while the cluster's first
// connection has not been made.
var errClusterNotConnected = errors.New("failover: cluster not connected yet")

// ClusterConfig configures Dial. Only AMQP is needed.
type ClusterConfig struct {
	// AMQP configures the cluster's broker (its nodes in AMQP.URLs).
	AMQP amqp.Config
	// OnConnect, when set, runs once the first connection is made and before the cluster
	// is used, typically to declare the queues its publishes go to. An error closes that
	// connection and the next attempt starts over.
	OnConnect func(ctx context.Context, b *amqp.Broker) error
	// ConnectTimeout bounds one attempt, OnConnect included. Zero means 30s.
	ConnectTimeout time.Duration
	// RetryMaxInterval caps the wait between attempts. Zero means 5s.
	RetryMaxInterval time.Duration
}

// Cluster is a RabbitMQ cluster connected in the background: Dial returns at once, and
// the first connection is tried again until it succeeds or Close, so that a producer can
// start while the cluster is unreachable (amqp.New alone fails then). Once connected, the
// broker repairs later losses itself. A Cluster's Publisher is the primary (or secondary)
// of a failover Publisher: it reports itself not connected until the first connection, so
// publishes go to the other cluster meanwhile.
type Cluster struct {
	cfg    ClusterConfig
	logger *slog.Logger

	mu     sync.Mutex
	broker *amqp.Broker

	ready   chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}
	closeMu sync.Once
}

// Dial starts connecting to the cluster cfg.AMQP names and returns at once.
func Dial(cfg ClusterConfig) (*Cluster, error) {
	if cfg.ConnectTimeout < 0 || cfg.RetryMaxInterval < 0 {
		return nil, fmt.Errorf("failover: negative ConnectTimeout (%s) or RetryMaxInterval (%s)", cfg.ConnectTimeout, cfg.RetryMaxInterval)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 30 * time.Second
	}
	if cfg.RetryMaxInterval == 0 {
		cfg.RetryMaxInterval = 5 * time.Second
	}
	logger := cfg.AMQP.Logger
	if logger == nil {
		logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Cluster{cfg: cfg, logger: logger, ready: make(chan struct{}), cancel: cancel, done: make(chan struct{})}
	go c.connect(ctx)
	return c, nil
}

// connect makes the first connection, retrying with backoff until it succeeds or ctx ends.
func (c *Cluster) connect(ctx context.Context) {
	defer close(c.done)
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 100 * time.Millisecond
	bo.MaxInterval = c.cfg.RetryMaxInterval
	bo.MaxElapsedTime = 0
	for attempt := 1; ; attempt++ {
		b, err := c.attempt(ctx)
		if err == nil {
			c.mu.Lock()
			c.broker = b
			c.mu.Unlock()
			close(c.ready)
			if attempt > 1 {
				c.logger.Info("failover: cluster reachable; connected", "attempts", attempt)
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		if attempt == 1 {
			c.logger.Warn("failover: cluster unreachable; connecting in the background", "error", err)
		}
		t := time.NewTimer(bo.NextBackOff())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

func (c *Cluster) attempt(ctx context.Context) (*amqp.Broker, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ConnectTimeout)
	defer cancel()
	b, err := amqp.New(ctx, c.cfg.AMQP)
	if err != nil {
		return nil, err
	}
	if c.cfg.OnConnect != nil {
		if err := c.cfg.OnConnect(ctx, b); err != nil {
			_ = b.Close()
			return nil, fmt.Errorf("failover: on connect: %w", err)
		}
	}
	return b, nil
}

// Ready is closed once the first connection is made (and OnConnect succeeded).
func (c *Cluster) Ready() <-chan struct{} { return c.ready }

// Broker returns the cluster's broker, nil before the first connection.
func (c *Cluster) Broker() *amqp.Broker {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.broker
}

// connected reports whether one of the cluster's nodes is connected now.
func (c *Cluster) connected() bool {
	b := c.Broker()
	return b != nil && b.Publisher().Connected()
}

// Publisher returns a confirmed publisher to the cluster: the broker's once connected,
// before, an error saying the cluster is not connected yet (errClusterNotConnected).
func (c *Cluster) Publisher() message.Publisher { return &clusterPublisher{c: c} }

// Close stops connecting (waiting for an attempt under way, at most ConnectTimeout) and
// closes the broker if it was connected.
func (c *Cluster) Close() error {
	var err error
	c.closeMu.Do(func() {
		c.cancel()
		<-c.done
		if b := c.Broker(); b != nil {
			err = b.Close()
		}
	})
	return err
}

// clusterPublisher publishes to a Cluster. Close does nothing: the Cluster owns the
// connection.
type clusterPublisher struct{ c *Cluster }

// Publish publishes messages to the queue topic names and waits for their confirms, as
// the broker's amqp.Publisher.Publish does (the first message's deadline, else
// amqp.Config.PublishTimeout).
func (p *clusterPublisher) Publish(topic string, messages ...*message.Message) error {
	b := p.c.Broker()
	if b == nil {
		return fmt.Errorf("publish %d message(s) to %q: %w", len(messages), topic, errClusterNotConnected)
	}
	return b.Publisher().Publish(topic, messages...)
}

// PublishContext publishes messages to the queue topic names within ctx, confirmed.
func (p *clusterPublisher) PublishContext(ctx context.Context, topic string, messages ...*message.Message) error {
	b := p.c.Broker()
	if b == nil {
		return fmt.Errorf("publish %d message(s) to %q: %w", len(messages), topic, errClusterNotConnected)
	}
	return b.Publisher().PublishTo(ctx, "", topic, messages...)
}

// Connected reports whether the cluster is connected now (failover.Config.PrimaryUp uses
// it when the publisher is a primary).
func (p *clusterPublisher) Connected() bool { return p.c.connected() }

// Close does nothing.
func (p *clusterPublisher) Close() error { return nil }
