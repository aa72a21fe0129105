// Package broker declares what sluice's stack needs from a message broker. Both of sluice's
// brokers, broker/amqp (RabbitMQ) and broker/memory (the embedded one), implement Broker,
// checked at compile time beside each of them and at run time by the conformance suite,
// package broker/brokertest, which states what every method must do; a third broker that
// passes the suite runs the stack (package router) unchanged.
//
// Broker is the contract the stack requires; Delayer and DeadLetterer are the parts of it
// the retry and poison steps take alone. ConsumerCounter, Joiner, NativeRetrier and
// Journaler are capabilities a broker may add: the stack uses them when they are there
// (claiming partitions at start, rebalancing partitions between instances, native delayed
// retry, journaled idempotency keys) and says so in the option that needs them. The
// embedded broker lives in one process, where no other instance competes for a partition
// and nothing outlives the process, so it has none of them.
//
// How a delivery leaves its consumer is typed too: a subscriber gives each delivery's
// context a Delivery, on which the step that nacks a message says how it is settled
// (Settlement: returned unprocessed, held back by the queue, or rejected as a failure), and
// the idempotency step holds an ack until its journal record is confirmed (HoldAck).
//
// The router never asserts a broker's concrete type: what it cannot get through these
// interfaces, it does not use.
package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/binding"
)

// Broker is everything the stack (router.New) requires of a broker. The conformance
// suite, package broker/brokertest, states what each method must do and checks it on a
// running broker.
type Broker interface {
	// Name is the messaging system ("rabbitmq", "memory"), as telemetry reports it.
	Name() string
	// DeclareQueue declares queue with its dead-letter queue and its route back from the
	// delay, so that retries and dead letters have somewhere to go.
	DeclareQueue(ctx context.Context, queue string) error
	// DeclareOutputQueue declares a queue the stack only publishes to, without failure
	// paths of its own: its consumer's DeclareQueue adds them.
	DeclareOutputQueue(ctx context.Context, queue string) error
	// DeclarePartitioned declares queue as partitions key-partitioned queues
	// (router.WithPartitions) with their shared dead-letter queue and delay routes.
	DeclarePartitioned(ctx context.Context, queue string, partitions int) error
	// DeclareExchange declares exchange of kind with sluice's alternate exchange
	// sluice.unrouted, or, with adopt, uses an existing one as it is. An exchange declared
	// before with another kind is an error wrapping ErrInequivalent (without adopt).
	DeclareExchange(ctx context.Context, exchange string, kind ExchangeKind, adopt bool) error
	// DeclareSubscription declares queue with its failure paths, the bindings' exchanges
	// and the bindings (adopting what exists, with adopt). An invalid binding is an error
	// wrapping ErrBinding.
	DeclareSubscription(ctx context.Context, queue string, bindings []Binding, adopt bool) error
	// PublishConfirmed publishes messages to queue and returns once every one is
	// confirmed, or with ctx's error when ctx ends first.
	PublishConfirmed(ctx context.Context, queue string, messages ...*message.Message) error
	// PublishPartitioned publishes messages to queue's partition for key, confirmed; an
	// empty key is an error wrapping ErrPartitionKey.
	PublishPartitioned(ctx context.Context, queue, key string, messages ...*message.Message) error
	// PublishToExchange publishes messages to exchange with routingKey, confirmed.
	PublishToExchange(ctx context.Context, exchange, routingKey string, messages ...*message.Message) error
	Delayer
	DeadLetterer
	// Subscriber returns a subscriber with opts. Its deliveries' contexts carry a Delivery
	// (DeliveryFrom), and a nacked message is settled as its Delivery says.
	Subscriber(opts SubscribeOptions) Subscriber
	// QueueDepth returns queue's messages and consumers (telemetry's depth watcher, the
	// overload guard); a queue that does not exist is an error wrapping
	// sluice.ErrQueueNotFound.
	QueueDepth(ctx context.Context, queue string) (sluice.QueueDepth, error)
	// Close closes the broker and every subscriber it made; what is called after it
	// returns an error wrapping ErrClosed.
	io.Closer
}

// Errors both brokers return, so that a caller matches one name whatever the broker.
var (
	// ErrClosed is wrapped by what is called on a closed broker.
	ErrClosed = errors.New("broker: closed")
	// ErrInequivalent is wrapped by a declaration refused because the queue or exchange
	// exists with other arguments (another exchange kind, another queue type, more
	// partitions than declared now).
	ErrInequivalent = errors.New("broker: declared before with other arguments")
	// ErrPartitionKey is wrapped by PublishPartitioned's error for a key the broker cannot
	// route: empty (or, on RabbitMQ, longer than 255 bytes).
	ErrPartitionKey = errors.New("broker: invalid partition key")
)

// Delayer delivers a message again after a delay (the retry step's hand-off).
type Delayer interface {
	// Delay delivers a copy of msg to queue after d; it returns once the copy is
	// confirmed.
	Delay(ctx context.Context, queue string, d time.Duration, msg *message.Message) error
}

// DeadLetterer publishes to a queue's dead-letter queue (the poison step's hand-off).
type DeadLetterer interface {
	// DeadLetter publishes msg to queue's dead-letter queue; it returns once confirmed.
	DeadLetter(ctx context.Context, queue string, msg *message.Message) error
}

// ConsumerCounter counts a queue's consumers. A broker that has it lets the instances of
// a partitioned handler claim partitions one at a time at start (router.WithPartitions).
type ConsumerCounter interface {
	// ConsumerCount returns how many consumers queue has.
	ConsumerCount(ctx context.Context, queue string) (int, error)
}

// Joiner keeps a membership of the instances consuming one queue, for
// router.WithRebalancing.
type Joiner interface {
	// Join starts announcing this instance among queue's members and listening to the
	// others; it returns once the first announcements can be heard.
	Join(ctx context.Context, queue string, cfg MembershipConfig) (Membership, error)
}

// NativeRetrier declares a consumed queue on which the broker itself holds a failed
// delivery back before redelivering it, instead of the stack handing a copy to the delay
// (router.WithNativeRetry). RabbitMQ 4.3's quorum queues have it (x-delayed-retry-type
// "failed"); older RabbitMQ and the embedded broker do not.
type NativeRetrier interface {
	// DeclareNativeRetryQueue declares queue as Broker.DeclareQueue does, and has the
	// broker hold a delivery given back after a failure (rejected with requeue) for r's
	// delay before redelivering it; it returns an error naming what the broker lacks when it
	// cannot.
	DeclareNativeRetryQueue(ctx context.Context, queue string, r NativeRetry) error
}

// NativeRetry is the schedule of a broker's native delayed retry: linear, the n-th retry
// held back Min × n, at most Max. It is the only schedule RabbitMQ 4.3 carries out.
type NativeRetry struct {
	// Min is the first retry's delay and the step between retries. It must be at least a
	// millisecond.
	Min time.Duration
	// Max caps the delay. It must be at least Min.
	Max time.Duration
	// MaxRetries is how many retries the handler's policy allows; the broker checks it
	// leaves room below its own delivery limit.
	MaxRetries int
}

// ErrNativeRetry is wrapped by the refusal of a native delayed retry: an invalid schedule
// (NativeRetry.Validate), or a broker that cannot carry it out (DeclareNativeRetryQueue on
// a node, queue type or delivery limit without room for it, the error naming which).
var ErrNativeRetry = errors.New("broker: native delayed retry refused")

// Validate returns an error wrapping ErrNativeRetry, naming the value, when r is not a
// schedule a broker can carry out.
func (r NativeRetry) Validate() error {
	switch {
	case r.Min < time.Millisecond:
		return fmt.Errorf("%w: Min %s is below 1ms", ErrNativeRetry, r.Min)
	case r.Max < r.Min:
		return fmt.Errorf("%w: Max %s is below Min %s", ErrNativeRetry, r.Max, r.Min)
	case r.Min%time.Millisecond != 0 || r.Max%time.Millisecond != 0:
		// RabbitMQ takes whole milliseconds: a rounded delay would not be the one observed.
		return fmt.Errorf("%w: Min %s and Max %s must be whole milliseconds", ErrNativeRetry, r.Min, r.Max)
	case r.MaxRetries < 0:
		return fmt.Errorf("%w: MaxRetries %d is negative", ErrNativeRetry, r.MaxRetries)
	}
	return nil
}

// Delay is how long the broker holds a delivery back before retry n (counting from 1):
// Min × n, at most Max.
func (r NativeRetry) Delay(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	if r.Min <= 0 || time.Duration(n) > r.Max/r.Min {
		return r.Max
	}
	return min(time.Duration(n)*r.Min, r.Max)
}

// Journaler keeps append-only journals that outlive the process and are read by every
// instance: the idempotency step journals its done keys on one (RabbitMQ: a stream). A
// broker that has it lets the stack restore idempotency keys after a crash and share them
// between instances; the embedded broker loses everything with its process, so it has none.
type Journaler interface {
	// Journal returns the journal name, keeping records for at least retention (older
	// ones may be dropped). It is declared on first use.
	Journal(name string, retention time.Duration) Journal
}

// JournalRecreator is a Journaler that counts the journals it found deleted under a running
// service and declared again (sluice_idempotency_journal_recreated_total).
type JournalRecreator interface {
	JournalsRecreated() int64
}

// ErrBlocked is wrapped by a publish's error while the broker blocks publishing (a RabbitMQ
// memory or disk alarm): Journal.Append's, at once (the append was not attempted), and a
// publish's that missed its deadline meanwhile.
var ErrBlocked = errors.New("broker: publishing blocked by a resource alarm")

// Journal is one append-only journal (Journaler).
type Journal interface {
	// Append stores body as one record and returns once the broker has confirmed it; while
	// the broker blocks publishing it returns at once with an error wrapping ErrBlocked.
	Append(ctx context.Context, body []byte) error
	// Follow calls deliver with every record stored since since (and possibly a few
	// older), in order, then caughtUp once every record stored before Follow was called
	// has been delivered, then goes on delivering new records until ctx ends, when it
	// returns ctx's error. It rides out connection losses and a deleted journal by itself;
	// deliver and caughtUp run on Follow's goroutine.
	Follow(ctx context.Context, since time.Time, deliver func(body []byte), caughtUp func()) error
}

// ResyncingJournal is a Journal whose follower also says when it lost its place and when
// it found it again: behind runs when its consumer is lost after it had caught up (a
// connection loss, a broker restart, the journal deleted), and caughtUp runs again once
// it has delivered every record stored before it consumed again. Records another
// instance stored meanwhile reach it only then, while the reconnected queue consumer may
// already hold redeliveries of their keys: the idempotency step waits for the catch-up
// (bounded) before looking a key up. RabbitMQ's stream journal has it.
type ResyncingJournal interface {
	Journal
	// FollowResyncing is Follow, with behind as above; caughtUp runs once per catch-up.
	FollowResyncing(ctx context.Context, since time.Time, deliver func(body []byte), caughtUp, behind func()) error
}

// SubscribeOptions tune one subscription. The zero value means one message at a time.
type SubscribeOptions struct {
	// Concurrency is how many messages are handed out at once, each waiting for its own
	// ack. Zero means 1.
	Concurrency int
	// Prefetch is how many deliveries the broker may send ahead (RabbitMQ's QoS prefetch
	// count). Zero means Concurrency; a smaller value is raised to Concurrency. A broker
	// without prefetch ignores it.
	Prefetch int
	// SettleWithin is how long after its delivery the subscriber's user settles (acks or
	// gives back) every delivery at the latest, prefetch wait included: the broker must
	// not take a delivery back before (RabbitMQ's consumer timeout). Zero means no bound is
	// declared. A broker that takes nothing back ignores it.
	SettleWithin time.Duration
}

// Subscriber is a Watermill subscriber that can stop taking deliveries and take them
// again (the breaker's pause).
type Subscriber interface {
	message.Subscriber
	// Pause returns deliveries not yet with a handler to their queue and lets the others
	// finish.
	Pause()
	// Resume takes deliveries again: with a positive limit only that many at once, with
	// zero all of them.
	Resume(limit int)
	// Paused reports whether Pause was called after the last Resume.
	Paused() bool
}

// Membership is one instance's view of the instances consuming a queue (Joiner).
type Membership interface {
	// ID names this instance among the members.
	ID() string
	// Members lists the members heard recently, this one included.
	Members() []string
	// Changed is closed at the next change of Members.
	Changed() <-chan struct{}
	// Broadcast sends body to the other members' MembershipConfig.OnBroadcast.
	Broadcast(ctx context.Context, body []byte) error
	// Close leaves the membership: the others hear it at once.
	Close() error
}

// MembershipConfig configures Joiner.Join. The zero value gives the defaults named on
// each field.
type MembershipConfig struct {
	// ID names this instance among the others; it must be unique. Empty means a random
	// one.
	ID string
	// Interval is how often the instance announces itself. Zero means 500 ms.
	Interval time.Duration
	// Expiry is how long a member stays listed after its last announcement: a killed
	// instance (no goodbye) leaves the list within Expiry. Zero means 3 intervals; it
	// must exceed Interval.
	Expiry time.Duration
	// OnBroadcast, when set, receives what the other members Broadcast, on the listening
	// loop (keep it short). Nil means broadcasts are dropped.
	OnBroadcast func(from string, body []byte)
}

// ExchangeKind is an exchange's type, as in AMQP.
type ExchangeKind = binding.Kind

// Exchange kinds.
const (
	// Topic routes on dot-separated binding keys; * is one word, # zero or more.
	Topic = binding.Topic
	// Direct routes on the exact binding key.
	Direct = binding.Direct
	// Fanout sends every message to every bound queue.
	Fanout = binding.Fanout
	// Headers routes on header (metadata) values.
	Headers = binding.Headers
)

// Binding binds a queue to an exchange; both brokers accept and refuse the same ones
// (Validate).
type Binding = binding.Binding

// ErrBinding means a Binding is incomplete or contradicts its exchange kind.
var ErrBinding = binding.ErrInvalid

// The error types of the shared errors in failure records (see sluice.ErrorType): a handler
// output that could not be published is retried and, when its retries run out,
// dead-lettered with one of these instead of the generic "error".
func init() {
	sluice.RegisterErrorType(ErrClosed, "broker_closed")
	sluice.RegisterErrorType(ErrPartitionKey, "partition_key")
}
