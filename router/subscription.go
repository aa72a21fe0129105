package router

import (
	"errors"
	"fmt"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/router/internal/output"
)

// ExchangeKind is the type of an exchange a handler subscribes or publishes to: package
// broker's.
type ExchangeKind = broker.ExchangeKind

// Exchange kinds, as in AMQP.
const (
	// Topic routes on dot-separated binding keys; * is one word, # zero or more.
	Topic = broker.Topic
	// Direct routes on the exact binding key.
	Direct = broker.Direct
	// Fanout sends every event to every bound queue.
	Fanout = broker.Fanout
	// Headers routes on header (metadata) values.
	Headers = broker.Headers
)

// RoutingKeyMetadata is the metadata key with which a handler gives one output message its
// own routing key (see WithOutputExchange). It is removed before the message is published.
const RoutingKeyMetadata = output.RoutingKeyMetadata

// ErrSubscription means a handler's subscription options contradict each other.
var ErrSubscription = errors.New("router: invalid subscription")

// Binding binds a handler's queue to an exchange: every event the exchange routes to it
// reaches the handler once, whichever of its keys match. It is package broker's Binding;
// Run declares its exchange durable, with the alternate exchange sluice.unrouted, unless
// WithAdopt adopts an existing one.
type Binding = broker.Binding

// Output is the exchange a handler publishes its output messages to.
type Output struct {
	// Exchange is the exchange's name (not empty); declared like a Binding's.
	Exchange string
	// Kind is the exchange's type. Zero means Topic.
	Kind ExchangeKind
	// RoutingKey is the routing key of an output message without RoutingKeyMetadata.
	RoutingKey string
}

// WithSubscription makes the handler a subscriber: its queue is bound to each binding's
// exchange, and Run declares the queue, the exchanges and the bindings. Each subscriber
// (each handler, each service) needs its own queue to get its own copy of every event.
// A retry, deferral or dead-letter replay of a message goes back to the handler's queue
// only, never through the exchange, so other subscribers never see it again. Not
// available with WithPartitions.
func WithSubscription(bindings ...Binding) HandlerOption {
	return func(c *handlerConfig) { c.sub.bindings = append(c.sub.bindings, bindings...) }
}

// WithAdopt uses the handler's queue and exchanges as they are when they exist already,
// declared by someone else with other arguments: Run declares them passively and adds
// only what sluice needs (the bindings, the queue's dead-letter queue and its route back
// from the delay cascade). Without it, Run refuses such a queue or exchange with an error
// naming the differing argument. An adopted queue keeps its own dead-letter settings, so
// what RabbitMQ itself dead-letters from it does not reach sluice's DLQ.
func WithAdopt() HandlerOption { return func(c *handlerConfig) { c.sub.adopt = true } }

// WithOutputExchange publishes the handler's output messages to an exchange, confirmed,
// with out.RoutingKey or the message's own RoutingKeyMetadata, instead of to a queue; use
// it with HandleWithOutput and an empty output topic. An event nobody is bound for is
// kept in sluice.unrouted (see topology.UnroutedQueue), from where `sluice dlq replay
// --unrouted` sends it again once someone subscribes.
func WithOutputExchange(out Output) HandlerOption {
	return func(c *handlerConfig) { c.sub.output = &out }
}

// subscription is a handler's exchange options.
type subscription struct {
	bindings []Binding
	adopt    bool
	output   *Output
}

func (s subscription) wanted() bool { return len(s.bindings) > 0 || s.adopt || s.output != nil }

// registerExchanges checks the handler's exchange options and records what Run declares.
// It reports whether the queue is a plain one, for Broker.DeclareQueue. s.mu is held.
func (s *Stack) registerExchanges(name, queue, outputTopic string, hc handlerConfig) (plain bool, err error) {
	sub := hc.sub
	if !sub.wanted() {
		return true, nil
	}
	if sub.output != nil {
		if outputTopic != "" {
			return false, fmt.Errorf("%w: handler %q has output queue %q and output exchange %q; give one", ErrSubscription, name, outputTopic, sub.output.Exchange)
		}
		if sub.output.Exchange == "" {
			return false, fmt.Errorf("%w: handler %q has an output exchange without a name", ErrSubscription, name)
		}
		s.plan.OutputExchange(sub.output.Exchange, sub.output.Kind, sub.adopt)
	}
	if len(sub.bindings) == 0 && !sub.adopt {
		return true, nil
	}
	if hc.partitions != 0 {
		return false, fmt.Errorf("%w: handler %q: WithSubscription and WithAdopt do not combine with WithPartitions", ErrSubscription, name)
	}
	for _, b := range sub.bindings {
		if b.Exchange == "" {
			return false, fmt.Errorf("%w: handler %q binds to an exchange without a name", ErrSubscription, name)
		}
	}
	s.plan.Subscription(queue, sub.bindings, sub.adopt)
	return false, nil
}
