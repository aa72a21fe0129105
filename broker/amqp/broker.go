package amqp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/topology"
)

// errDelayTooLong refuses a delay beyond the cascade's maximum, (1<<DelayLevels - 1) ×
// DelayResolution: about 7.8 days. The retry step caps its delays far below, so only a
// program calling Delay itself meets it, as error type delay_too_long.
var errDelayTooLong = errors.New("amqp: delay longer than the cascade's maximum")

// Broker is sluice's RabbitMQ broker: one connection for consuming and declaring, another
// for the confirmed publisher shared by every hand-off, and subscribers made per handler.
// Publishing has a connection of its own because RabbitMQ blocks a publishing connection
// under a memory or disk alarm (connection.blocked) and then stops reading it: consumers
// on that connection could no longer ack, so the queues the alarm wants drained would not.
type Broker struct {
	cfg     Config
	conn    *connection // consume and declare
	pubConn *connection // publish
	pub     *Publisher

	cascadeMu sync.Mutex
	// cascadeDigits is how many of the cascade's digits (from the lowest) this broker has
	// declared: Delay declares the ones a delay needs on first use (cascadeUpTo).
	cascadeDigits int
	// cascadeExchange is true once the cascade's delivery exchange is declared.
	cascadeExchange bool
	// cascadeBG counts background declarations of a cascade found declared (topology.go,
	// cascadeFound); closing is closed by Close, which ends them and waits for them.
	cascadeBG sync.WaitGroup
	closing   chan struct{}
	closeOnce sync.Once

	unroutedMu       sync.Mutex // exchange.go
	unroutedDeclared bool

	subsMu sync.Mutex
	subs   []*Subscriber

	declared sync.Map // queue name -> amqp.Table: extra arguments DeclareQueue or DeclareNativeRetryQueue declared it with

	timeouts consumerTimeouts // what the subscribers learned of each queue's consumer timeout (consumertimeout.go)

	journalsRecreated atomic.Int64 // journal.go
}

// errNotDeclared is redeclare's answer for a queue this broker did not declare (a
// partition, or someone else's), whose arguments it does not know.
var errNotDeclared = errors.New("amqp: queue not declared by this broker")

// redeclare declares queue again if DeclareQueue declared it.
func (b *Broker) redeclare(ctx context.Context, queue string) error {
	extra, ok := b.declared.Load(queue)
	if !ok {
		return errNotDeclared
	}
	return b.declareQueue(ctx, queue, extra.(amqp.Table))
}

// New connects to RabbitMQ. The first connection must succeed; later losses are repaired
// in the background.
func New(ctx context.Context, cfg Config) (*Broker, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	conn, err := dialConnection(ctx, cfg, "sluice consume")
	if err != nil {
		return nil, err
	}
	pubConn, err := dialConnection(ctx, cfg, "sluice publish")
	if err != nil {
		_ = conn.close()
		return nil, err
	}
	return &Broker{cfg: cfg, conn: conn, pubConn: pubConn, pub: newPublisher(pubConn, cfg), closing: make(chan struct{})}, nil
}

// Name returns "rabbitmq", the messaging.system of OpenTelemetry's conventions.
func (b *Broker) Name() string { return "rabbitmq" }

// Publisher returns the broker's confirmed publisher.
func (b *Broker) Publisher() *Publisher { return b.pub }

// DeclareQueue declares queue with its dead-letter queue and its place in the delay
// cascade. Declaring is idempotent.
func (b *Broker) DeclareQueue(ctx context.Context, queue string) error {
	if err := b.declareQueue(ctx, queue, nil); err != nil {
		return err
	}
	b.declared.Store(queue, amqp.Table(nil))
	return nil
}

// DeclareDelays declares the part of the shared delay cascade that delays up to max need,
// ahead of the first retry that needs it (Delay declares only the digits a delay needs, on
// its first use; the stack's Run calls this with its retry policy's MaxDelay). A policy
// whose longest delay is 30 s needs the digits up to 40.95 s: 45 queues, where the whole
// cascade is 93; a max at or beyond the longest delay, about 7.8 days, declares all of it.
// Digits found declared already are declared again in the background, as on a delay.
func (b *Broker) DeclareDelays(ctx context.Context, max time.Duration) error {
	return b.cascadeFor(ctx, digitsFor(delayUnits(min(max, maxDelay))))
}

// Subscriber returns a subscriber (a *Subscriber) with opts. Close closes it with the broker.
func (b *Broker) Subscriber(opts broker.SubscribeOptions) broker.Subscriber {
	s := newSubscriber(b.conn, b.cfg, opts)
	s.redeclare = b.redeclare
	s.timeouts = &b.timeouts
	b.subsMu.Lock()
	b.subs = append(b.subs, s)
	b.subsMu.Unlock()
	return s
}

// Delay hands msg to the delay cascade so that it is delivered to queue after d, exact to
// DelayResolution; it returns once RabbitMQ confirmed the copy. Headers RabbitMQ owns
// (x-death) are not carried, so they do not pile up from retry to retry.
func (b *Broker) Delay(ctx context.Context, queue string, d time.Duration, msg *message.Message) error {
	if d < 0 {
		d = 0
	}
	if d > maxDelay {
		return fmt.Errorf("delay %s for queue %q: %w (%s)", d, queue, errDelayTooLong, maxDelay)
	}
	units := delayUnits(d)
	if err := b.cascadeFor(ctx, digitsFor(units)); err != nil {
		return fmt.Errorf("delay message %s: %w", msg.UUID, err)
	}
	return b.pub.PublishTo(ctx, delayEntryExchange(units), delayRoutingKey(units, queue), msg)
}

// DeadLetter publishes msg to queue's dead-letter queue through sluice.dlx and returns once
// RabbitMQ confirmed it.
func (b *Broker) DeadLetter(ctx context.Context, queue string, msg *message.Message) error {
	return b.pub.PublishTo(ctx, topology.DeadLetterExchange, queue, msg)
}

// Close closes every subscriber (draining in-flight messages), the publisher and the
// connections. It returns within closeTimeout of the drain even when RabbitMQ blocks the
// publishing connection or stopped answering.
func (b *Broker) Close() error {
	b.subsMu.Lock()
	subs := b.subs
	b.subs = nil
	b.subsMu.Unlock()
	for _, s := range subs {
		_ = s.Close()
	}
	b.closeOnce.Do(func() { close(b.closing) })
	b.cascadeBG.Wait()
	// The publishing connection goes first: closing it fails whatever still waits for a
	// confirm and ends the confirm channel with it, where channel.close on a blocked
	// connection would wait for an answer that never comes.
	pubErr := b.pubConn.close()
	_ = b.pub.Close()
	return errors.Join(pubErr, b.conn.close())
}
