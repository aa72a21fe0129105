// Package declare holds what a stack's Run declares before anything consumes — consumed
// and output queues, partitioned queues, subscriptions with their bindings, output
// exchanges — and declares it through the broker contract, in that order.
package declare

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/topology"
)

// timeout bounds each declaration.
const timeout = 30 * time.Second

// Plan is what Run declares. The zero value is an empty plan; it is safe for concurrent
// use only under its owner's lock (the stack's).
type Plan struct {
	queues    []string // consumed plain queues
	native    []nativeQueue
	outputs   []string // output queues
	parted    []partitioned
	subscribe []subscription
	exchanges []exchange
	delays    time.Duration // the longest delay a retry hands off
}

type nativeQueue struct {
	queue string
	retry broker.NativeRetry
}

type partitioned struct {
	queue      string
	partitions int
}

type subscription struct {
	queue    string
	bindings []broker.Binding
	adopt    bool
}

type exchange struct {
	name  string
	kind  broker.ExchangeKind
	adopt bool
}

// Queue adds a consumed queue, declared with its failure paths.
func (p *Plan) Queue(queue string) { p.queues = append(p.queues, queue) }

// NativeRetryQueue adds a consumed queue whose broker holds failed deliveries back itself
// with r (broker.NativeRetrier).
func (p *Plan) NativeRetryQueue(queue string, r broker.NativeRetry) {
	p.native = append(p.native, nativeQueue{queue: queue, retry: r})
}

// Output adds a queue the stack publishes to.
func (p *Plan) Output(queue string) { p.outputs = append(p.outputs, queue) }

// Partitioned adds queue consumed as partitions.
func (p *Plan) Partitioned(queue string, partitions int) {
	p.parted = append(p.parted, partitioned{queue: queue, partitions: partitions})
}

// Subscription adds a subscriber's queue with its bindings (adopting what exists, with
// adopt).
func (p *Plan) Subscription(queue string, bindings []broker.Binding, adopt bool) {
	p.subscribe = append(p.subscribe, subscription{queue: queue, bindings: bindings, adopt: adopt})
}

// OutputExchange adds an exchange the stack publishes to.
func (p *Plan) OutputExchange(name string, kind broker.ExchangeKind, adopt bool) {
	p.exchanges = append(p.exchanges, exchange{name: name, kind: kind, adopt: adopt})
}

// Delays sets the longest delay the stack's retry step hands off (its policy's cap). A
// broker that declares its delay routes on demand (RabbitMQ's cascade, on the first delay
// that needs each part) declares them up to it at Run, while the cluster is whole: the
// first retry of a long delay can come during a partition, when a node in the minority
// accepts the declaration's connection but cannot commit it.
func (p *Plan) Delays(max time.Duration) { p.delays = max }

// delayDeclarer is a broker that can declare its delay routes ahead (amqp.Broker).
type delayDeclarer interface {
	DeclareDelays(ctx context.Context, max time.Duration) error
}

// Copy returns a copy of p to declare without the owner's lock.
func (p *Plan) Copy() Plan {
	return Plan{
		queues: slices.Clone(p.queues), native: slices.Clone(p.native), outputs: slices.Clone(p.outputs), parted: slices.Clone(p.parted),
		subscribe: slices.Clone(p.subscribe), exchanges: slices.Clone(p.exchanges), delays: p.delays,
	}
}

// Declare declares everything in p through b: the queues (an output queue nobody here
// consumes gets no failure paths of its own: its consumer's declaration adds them), the
// queues with a native delayed retry, the partitioned queues, the subscriptions, the
// output exchanges.
func (p Plan) Declare(ctx context.Context, b broker.Broker) error {
	for _, q := range append(slices.Clone(p.queues), p.outputs...) {
		if p.nativeRetry(q) {
			continue // declared below, with its arguments
		}
		err := within(ctx, func(ctx context.Context) error {
			if p.onlyOutput(q) {
				return b.DeclareOutputQueue(ctx, q)
			}
			return b.DeclareQueue(ctx, q)
		})
		if err != nil {
			return fmt.Errorf("declare queue %q: %w", q, err)
		}
	}
	if dd, ok := b.(delayDeclarer); ok && p.delays > 0 && len(p.queues)+len(p.parted) > 0 {
		if err := within(ctx, func(ctx context.Context) error { return dd.DeclareDelays(ctx, p.delays) }); err != nil {
			return fmt.Errorf("declare the delay routes of retries up to %s: %w", p.delays, err)
		}
	}
	for _, nq := range p.native {
		nr, ok := b.(broker.NativeRetrier)
		if !ok {
			// The stack checks the capability when the handler is added.
			return fmt.Errorf("declare queue %q: the broker has no native delayed retry", nq.queue)
		}
		if err := within(ctx, func(ctx context.Context) error { return nr.DeclareNativeRetryQueue(ctx, nq.queue, nq.retry) }); err != nil {
			return fmt.Errorf("declare queue %q with a native delayed retry: %w", nq.queue, err)
		}
	}
	for _, pq := range p.parted {
		if err := within(ctx, func(ctx context.Context) error { return b.DeclarePartitioned(ctx, pq.queue, pq.partitions) }); err != nil {
			return fmt.Errorf("declare queue %q as %d partitions: %w", pq.queue, pq.partitions, err)
		}
	}
	for _, sub := range p.subscribe {
		if err := within(ctx, func(ctx context.Context) error { return b.DeclareSubscription(ctx, sub.queue, sub.bindings, sub.adopt) }); err != nil {
			return fmt.Errorf("declare subscription of queue %q: %w", sub.queue, err)
		}
	}
	for _, ex := range p.exchanges {
		if err := within(ctx, func(ctx context.Context) error { return b.DeclareExchange(ctx, ex.name, ex.kind, ex.adopt) }); err != nil {
			return fmt.Errorf("declare output exchange %q: %w", ex.name, err)
		}
	}
	return nil
}

func within(ctx context.Context, declare func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return declare(ctx)
}

// onlyOutput says whether queue is published to here and consumed nowhere here.
func (p Plan) onlyOutput(queue string) bool {
	if !slices.Contains(p.outputs, queue) || slices.Contains(p.queues, queue) || p.nativeRetry(queue) {
		return false
	}
	for _, sub := range p.subscribe {
		if sub.queue == queue {
			return false
		}
	}
	return true
}

// nativeRetry says whether queue is consumed here with a native delayed retry.
func (p Plan) nativeRetry(queue string) bool {
	return slices.ContainsFunc(p.native, func(nq nativeQueue) bool { return nq.queue == queue })
}

// Consumed returns the queues the handlers consume, each once, sorted: plain and
// subscribed queues, and each partition of a partitioned one.
func (p *Plan) Consumed() []string {
	out := slices.Clone(p.queues)
	for _, nq := range p.native {
		out = append(out, nq.queue)
	}
	for _, sub := range p.subscribe {
		out = append(out, sub.queue)
	}
	for _, pq := range p.parted {
		for k := 0; k < pq.partitions; k++ {
			out = append(out, topology.Partition(pq.queue, k))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// DeadLettered returns the queues whose dead-letter queue and archive the plan declares,
// each once, sorted: the consumed queues, but a partitioned queue in place of its
// partitions, which dead-letter to its dead-letter queue.
func (p *Plan) DeadLettered() []string {
	out := slices.Clone(p.queues)
	for _, nq := range p.native {
		out = append(out, nq.queue)
	}
	for _, sub := range p.subscribe {
		out = append(out, sub.queue)
	}
	for _, pq := range p.parted {
		out = append(out, pq.queue)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
