// Package memory is sluice's embedded broker, for demos and tests: in-process
// queues with the same semantics the stack relies on from RabbitMQ — competing consumers,
// acks and requeue on nack, a dead-letter queue per queue, and delayed re-delivery by a
// scheduler (one timer goroutine; no handler ever sleeps). Nothing survives the process.
package memory

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sluice-go/sluice/broker"
)

// Config's zero values.
const (
	defaultNackBackoffMax = 10 * time.Second
	defaultDrainTimeout   = 30 * time.Second
)

// Config configures the embedded broker. The zero value is ready to use.
type Config struct {
	// NackBackoffMax caps how long a nacked message waits before it is requeued, so a
	// failing hand-off does not spin. Zero means 10s.
	NackBackoffMax time.Duration
	// DrainTimeout is how long a closing subscriber (or broker) waits for the verdict on a
	// message a handler holds before it returns the message to its queue and cancels the
	// message's context, as the RabbitMQ subscriber does. Zero means 30s.
	DrainTimeout time.Duration
	// Logger receives broker events. Nil means slog.Default().
	Logger *slog.Logger
}

// Broker is the embedded broker. Queues are created on first use.
type Broker struct {
	cfg Config

	mu     sync.Mutex
	queues map[string]*queue
	parts  partitionSet // partitioned queues (partition.go)
	ex     exchanges    // exchanges and bindings (exchange.go)

	sched   scheduleHeap
	wake    chan struct{}
	closing chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

// The embedded broker is everything the stack requires (package broker). It has no
// broker.ConsumerCounter or broker.Joiner: in one process no other instance competes for a
// partition.
var (
	_ broker.Broker     = (*Broker)(nil)
	_ broker.Subscriber = (*subscriber)(nil)
)

// New starts an embedded broker: nothing outside the process can publish to it, and its
// messages die with the process.
func New(cfg Config) *Broker {
	if cfg.NackBackoffMax <= 0 {
		cfg.NackBackoffMax = defaultNackBackoffMax
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = defaultDrainTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	b := &Broker{cfg: cfg, queues: map[string]*queue{}, wake: make(chan struct{}, 1), closing: make(chan struct{})}
	b.wg.Add(1)
	go b.runScheduler()
	return b
}

// Name returns "memory".
func (b *Broker) Name() string { return "memory" }

func (b *Broker) closed() bool {
	select {
	case <-b.closing:
		return true
	default:
		return false
	}
}

// Close stops the scheduler and every subscription. Scheduled messages are dropped with
// the process, as everything in the embedded broker is.
func (b *Broker) Close() error {
	b.once.Do(func() { close(b.closing) })
	b.wg.Wait()
	return nil
}

// String describes the broker for logs.
func (b *Broker) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return fmt.Sprintf("memory broker (%d queues)", len(b.queues))
}
