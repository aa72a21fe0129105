package memory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/binding"
	"github.com/sluice-go/sluice/internal/topology"
)

// Publish/subscribe, as on RabbitMQ (see broker/amqp): a subscriber's queue is bound to
// exchanges, and what an exchange cannot route goes to the queue sluice.unrouted, keeping
// its exchange and routing key in metadata (internal/binding.MetadataExchange and
// MetadataRoutingKey, the keys broker/amqp uses too).

// errNoExchange refuses a publish to an exchange never declared (RabbitMQ closes the
// channel): a program declares its exchanges, it does not branch on this.
var errNoExchange = errors.New("memory: no such exchange")

// exchanges is the broker's set of exchanges. The zero value is empty.
type exchanges struct {
	mu  sync.Mutex
	all map[string]*exchange
}

type exchange struct {
	kind     binding.Kind
	bindings []bound
}

type bound struct {
	queue    string
	key      string
	headers  map[string]string
	matchAny bool
}

// DeclareExchange declares the exchange name of kind (zero: topic). Declaring it again with
// the same kind is harmless; with another kind it is broker.ErrInequivalent, unless adopt, which
// uses the exchange as it is.
func (b *Broker) DeclareExchange(_ context.Context, name string, kind binding.Kind, adopt bool) error {
	if b.closed() {
		return broker.ErrClosed
	}
	if name == "" {
		return fmt.Errorf("%w: empty exchange name", broker.ErrBinding)
	}
	if kind == "" {
		kind = binding.Topic
	}
	switch kind {
	case binding.Topic, binding.Direct, binding.Fanout, binding.Headers:
	default:
		return fmt.Errorf("%w: exchange %q has kind %q, want topic, direct, fanout or headers", broker.ErrBinding, name, kind)
	}
	b.ex.mu.Lock()
	defer b.ex.mu.Unlock()
	if b.ex.all == nil {
		b.ex.all = map[string]*exchange{}
	}
	e, ok := b.ex.all[name]
	switch {
	case !ok:
		b.ex.all[name] = &exchange{kind: kind}
	case e.kind != kind && !adopt:
		return fmt.Errorf("exchange %q is a %s exchange, declared now as %s: %w", name, e.kind, kind, broker.ErrInequivalent)
	}
	return nil
}

// DeclareSubscription declares queue (as DeclareQueue), each binding's exchange and the
// bindings. Retries and deferrals of the queue's messages come back to the queue itself,
// never through an exchange.
func (b *Broker) DeclareSubscription(ctx context.Context, queue string, bindings []binding.Binding, adopt bool) error {
	for i := range bindings {
		if err := bindings[i].Validate(); err != nil {
			return fmt.Errorf("subscription of queue %q: %w", queue, err)
		}
	}
	if err := b.DeclareQueue(ctx, queue); err != nil {
		return err
	}
	for _, bd := range bindings {
		if err := b.DeclareExchange(ctx, bd.Exchange, bd.Kind, adopt); err != nil {
			return err
		}
		b.ex.mu.Lock()
		e := b.ex.all[bd.Exchange]
		add := func(nb bound) {
			for _, old := range e.bindings {
				if old.queue == nb.queue && old.key == nb.key && old.matchAny == nb.matchAny && sameHeaders(old.headers, nb.headers) {
					return
				}
			}
			e.bindings = append(e.bindings, nb)
		}
		switch bd.Kind {
		case binding.Fanout:
			add(bound{queue: queue})
		case binding.Headers:
			add(bound{queue: queue, headers: bd.Headers, matchAny: bd.MatchAny})
		default:
			for _, k := range bd.Keys {
				add(bound{queue: queue, key: k})
			}
		}
		b.ex.mu.Unlock()
	}
	return nil
}

func sameHeaders(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// PublishToExchange routes copies of messages to every queue bound to exchange whose
// binding matches routingKey (or, on a headers exchange, the message's metadata), each
// queue once. A message no binding matches goes to topology.UnroutedQueue. Every copy carries its
// exchange and routing key in binding.MetadataExchange and binding.MetadataRoutingKey.
func (b *Broker) PublishToExchange(_ context.Context, exchangeName, routingKey string, messages ...*message.Message) error {
	if b.closed() {
		return broker.ErrClosed
	}
	for _, m := range messages {
		queues, err := b.route(exchangeName, routingKey, m.Metadata)
		if err != nil {
			return err
		}
		if len(queues) == 0 {
			queues = []string{topology.UnroutedQueue}
		}
		for _, q := range queues {
			c := copyMessage(m)
			c.Metadata.Set(binding.MetadataExchange, exchangeName)
			c.Metadata.Set(binding.MetadataRoutingKey, routingKey)
			b.queue(q).push(c, false)
		}
	}
	return nil
}

func (b *Broker) route(name, key string, md message.Metadata) ([]string, error) {
	b.ex.mu.Lock()
	defer b.ex.mu.Unlock()
	e, ok := b.ex.all[name]
	if !ok {
		return nil, fmt.Errorf("publish to exchange %q: %w", name, errNoExchange)
	}
	var queues []string
	for _, bd := range e.bindings {
		if !slices.Contains(queues, bd.queue) && bd.matches(e.kind, key, md) {
			queues = append(queues, bd.queue)
		}
	}
	return queues, nil
}

func (bd bound) matches(kind binding.Kind, key string, md message.Metadata) bool {
	switch kind {
	case binding.Fanout:
		return true
	case binding.Direct:
		return bd.key == key
	case binding.Headers:
		n := 0
		for k, v := range bd.headers {
			if got, ok := md[k]; ok && got == v {
				n++
			}
		}
		if bd.matchAny {
			return n > 0
		}
		return n == len(bd.headers)
	default:
		return topicMatch(bd.key, key)
	}
}

// topicMatch reports whether a topic exchange's binding key matches routingKey: words are
// separated by dots, * stands for exactly one word and # for zero or more.
func topicMatch(bindingKey, routingKey string) bool {
	return topicWords(strings.Split(bindingKey, "."), strings.Split(routingKey, "."))
}

func topicWords(pattern, words []string) bool {
	for len(pattern) > 0 {
		switch pattern[0] {
		case "#":
			for i := 0; i <= len(words); i++ {
				if topicWords(pattern[1:], words[i:]) {
					return true
				}
			}
			return false
		case "*":
			if len(words) == 0 {
				return false
			}
		default:
			if len(words) == 0 || words[0] != pattern[0] {
				return false
			}
		}
		pattern, words = pattern[1:], words[1:]
	}
	return len(words) == 0
}

// ReplayUnrouted publishes again, to their exchange with their routing key, the messages
// of topology.UnroutedQueue that came from exchange (every exchange when it is empty), and returns
// how many it took. One nobody is bound for yet comes back to topology.UnroutedQueue.
func (b *Broker) ReplayUnrouted(ctx context.Context, exchangeName string) (int, error) {
	q := b.queue(topology.UnroutedQueue)
	q.mu.Lock()
	var take, keep []*message.Message
	for _, m := range q.ready {
		if exchangeName == "" || m.Metadata.Get(binding.MetadataExchange) == exchangeName {
			take = append(take, m)
		} else {
			keep = append(keep, m)
		}
	}
	q.ready = keep
	q.mu.Unlock()
	for i, m := range take {
		if err := b.PublishToExchange(ctx, m.Metadata.Get(binding.MetadataExchange), m.Metadata.Get(binding.MetadataRoutingKey), m); err != nil {
			for _, back := range take[i:] {
				q.push(back, false)
			}
			return i, err
		}
	}
	return len(take), nil
}

// DeclareOutputQueue creates queue for a stack that only publishes to it: without the
// dead-letter queue, which its consumer's DeclareQueue adds.
func (b *Broker) DeclareOutputQueue(_ context.Context, queue string) error {
	if b.closed() {
		return broker.ErrClosed
	}
	b.queue(queue)
	return nil
}
