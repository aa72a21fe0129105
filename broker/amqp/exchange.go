package amqp

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/topology"
)

// Publish/subscribe topology (see docs/DESIGN.md, "Topology names"): a subscriber's queue Q is
// bound to exchanges; every exchange sluice declares carries alternate-exchange
// sluice.unrouted, a fanout exchange feeding the durable queue sluice.unrouted, so an event
// nobody is bound to is kept, with its exchange and routing key, instead of being dropped.
const (
	// alternateExchangeArg is RabbitMQ's exchange argument naming the alternate exchange.
	alternateExchangeArg = "alternate-exchange"
)

// routes returns the (binding key, arguments) pairs the binding declares.
func routes(b broker.Binding) []bindingRoute {
	switch b.Kind {
	case broker.Fanout:
		return []bindingRoute{{}}
	case broker.Headers:
		args := amqp.Table{"x-match": "all"}
		if b.MatchAny {
			args["x-match"] = "any"
		}
		for k, v := range b.Headers {
			args[k] = v
		}
		return []bindingRoute{{args: args}}
	}
	out := make([]bindingRoute, len(b.Keys))
	for i, k := range b.Keys {
		out[i] = bindingRoute{key: k}
	}
	return out
}

type bindingRoute struct {
	key  string
	args amqp.Table
}

// InequivalentError says that a queue or exchange exists with an argument other than the
// one sluice declares, and what to do. It matches broker.ErrInequivalent.
type InequivalentError struct {
	// What is "queue" or "exchange"; Name is its name.
	What, Name string
	// Argument is the differing argument as RabbitMQ names it (x-queue-type, durable,
	// type, alternate-exchange, ...); Detail is RabbitMQ's words on the two values.
	Argument, Detail string
}

func (e *InequivalentError) Error() string {
	return fmt.Sprintf("%s %q exists with another %s than sluice declares (%s): "+
		"adopt it as it is (router.WithAdopt; passive declare, only sluice's bindings are added), "+
		"or delete it and let sluice declare it: %v", e.What, e.Name, e.Argument, e.Detail, broker.ErrInequivalent)
}

// Unwrap makes the error match broker.ErrInequivalent.
func (e *InequivalentError) Unwrap() error { return broker.ErrInequivalent }

var inequivalentArg = regexp.MustCompile(`inequivalent arg '([^']+)' for [a-z]+ '[^']*' in vhost '[^']*': (.*)$`)

// inequivalent turns RabbitMQ's PRECONDITION_FAILED answer to a declaration into an
// *InequivalentError; any other error is returned as it is.
func inequivalent(err error, what, name string) error {
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		return err
	}
	m := inequivalentArg.FindStringSubmatch(ae.Reason)
	if m == nil {
		return &InequivalentError{What: what, Name: name, Argument: "argument", Detail: ae.Reason}
	}
	return &InequivalentError{What: what, Name: name, Argument: m[1], Detail: m[2]}
}

// is404 reports RabbitMQ's 404 NOT_FOUND channel error (a passive declare of nothing).
func is404(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.NotFound
}

// DeclareExchange declares the durable exchange name of kind with alternate-exchange
// sluice.unrouted (declared too, with its queue). With adopt, an exchange that exists is
// used as it is (passive declare: its type and arguments are not checked, and it keeps
// its own alternate exchange, if any); a missing one is declared. Without adopt, an
// exchange declared before with other arguments is an *InequivalentError.
func (b *Broker) DeclareExchange(ctx context.Context, name string, kind broker.ExchangeKind, adopt bool) error {
	if name == "" {
		return fmt.Errorf("%w: empty exchange name", broker.ErrBinding)
	}
	if kind == "" {
		kind = broker.Topic
	}
	switch kind {
	case broker.Topic, broker.Direct, broker.Fanout, broker.Headers:
	default:
		return fmt.Errorf("%w: exchange %q has kind %q, want topic, direct, fanout or headers", broker.ErrBinding, name, kind)
	}
	if err := b.declareUnrouted(ctx); err != nil {
		return err
	}
	return b.declareExchange(ctx, name, kind, adopt)
}

func (b *Broker) declareExchange(ctx context.Context, name string, kind broker.ExchangeKind, adopt bool) error {
	if adopt {
		found, err := b.passive(ctx, func(ch *amqp.Channel) error {
			return ch.ExchangeDeclarePassive(name, string(kind), true, false, false, false, nil)
		})
		if err != nil || found {
			if err != nil {
				return fmt.Errorf("adopt exchange %q: %w", name, err)
			}
			return nil
		}
	}
	ch, err := b.conn.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	args := amqp.Table{alternateExchangeArg: topology.UnroutedExchange}
	if err := ch.ExchangeDeclare(name, string(kind), true, false, false, false, args); err != nil {
		return fmt.Errorf("declare %s exchange %q: %w", kind, name, inequivalent(err, "exchange", name))
	}
	return nil
}

// passive runs a passive declaration on a channel of its own (a 404 closes the channel)
// and reports whether the object exists.
func (b *Broker) passive(ctx context.Context, declare func(*amqp.Channel) error) (bool, error) {
	ch, err := b.conn.channel(ctx)
	if err != nil {
		return false, err
	}
	defer ch.Close()
	if err := declare(ch); err != nil {
		if is404(err) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// declareUnrouted declares sluice.unrouted, exchange and queue, once per broker. The queue
// is shared by every sluice service of the vhost: one that exists is kept as it is,
// whatever its type, so services configured with other queue types do not refuse each
// other; a missing one is declared with Config.QueueType.
func (b *Broker) declareUnrouted(ctx context.Context) error {
	b.unroutedMu.Lock()
	defer b.unroutedMu.Unlock()
	if b.unroutedDeclared {
		return nil
	}
	found, err := b.passive(ctx, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(topology.UnroutedQueue, true, false, false, false, nil)
		return err
	})
	if err != nil {
		return fmt.Errorf("check queue %q: %w", topology.UnroutedQueue, err)
	}
	ch, err := b.conn.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(topology.UnroutedExchange, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %q: %w", topology.UnroutedExchange, inequivalent(err, "exchange", topology.UnroutedExchange))
	}
	if !found {
		if _, err := ch.QueueDeclare(topology.UnroutedQueue, true, false, false, false, queueArgs(b.cfg.QueueType, nil)); err != nil {
			return fmt.Errorf("declare queue %q: %w", topology.UnroutedQueue, err)
		}
	}
	if err := ch.QueueBind(topology.UnroutedQueue, "", topology.UnroutedExchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %q to %q: %w", topology.UnroutedQueue, topology.UnroutedExchange, err)
	}
	b.unroutedDeclared = true
	return nil
}

// DeclareSubscription declares queue as a subscriber's queue: the queue with its
// dead-letter queue and delay route (as DeclareQueue), each binding's exchange (as
// DeclareExchange) and the bindings. Retries and deferrals of the queue's messages come
// back to the queue through the delay cascade, never through the exchanges, so other
// subscribers never see them.
//
// With adopt, a queue or exchange that exists is used as it is (passive declare) and only
// what sluice needs is added: the bindings, Q.dlq and the route back from the delay
// cascade. An adopted queue keeps its own arguments: without sluice's
// x-dead-letter-exchange, what RabbitMQ itself dead-letters from it (delivery limit,
// length limit) does not reach Q.dlq. Without adopt, a queue or exchange declared before
// with other arguments is an *InequivalentError naming the argument.
func (b *Broker) DeclareSubscription(ctx context.Context, queue string, bindings []broker.Binding, adopt bool) error {
	for i := range bindings {
		if err := bindings[i].Validate(); err != nil {
			return fmt.Errorf("subscription of queue %q: %w", queue, err)
		}
	}
	if err := b.declareSubscriberQueue(ctx, queue, adopt); err != nil {
		return err
	}
	if len(bindings) > 0 {
		if err := b.declareUnrouted(ctx); err != nil {
			return err
		}
	}
	for _, bd := range bindings {
		if err := b.declareExchange(ctx, bd.Exchange, bd.Kind, adopt); err != nil {
			return err
		}
		if err := b.bind(ctx, queue, bd); err != nil {
			return err
		}
	}
	return nil
}

func (b *Broker) bind(ctx context.Context, queue string, bd broker.Binding) error {
	ch, err := b.conn.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	for _, r := range routes(bd) {
		if err := ch.QueueBind(queue, r.key, bd.Exchange, false, r.args); err != nil {
			return fmt.Errorf("bind queue %q to %s exchange %q with key %q: %w", queue, bd.Kind, bd.Exchange, r.key, err)
		}
	}
	return nil
}

func (b *Broker) declareSubscriberQueue(ctx context.Context, queue string, adopt bool) error {
	if adopt {
		found, err := b.passive(ctx, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
			return err
		})
		if err != nil {
			return fmt.Errorf("adopt queue %q: %w", queue, err)
		}
		if found {
			return b.declareFailurePaths(ctx, queue)
		}
	}
	if err := b.declareQueue(ctx, queue, nil); err != nil {
		return inequivalent(err, "queue", queue)
	}
	return nil
}

// declareFailurePaths declares what an adopted queue's failure paths need: Q.dlq bound to
// sluice.dlx, and the binding that brings delayed copies back to Q.
func (b *Broker) declareFailurePaths(ctx context.Context, queue string) error {
	if err := b.declareCascade(ctx); err != nil {
		return err
	}
	ch, err := b.conn.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(topology.DeadLetterExchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %q: %w", topology.DeadLetterExchange, err)
	}
	dlq := topology.DLQ(queue)
	if _, err := ch.QueueDeclare(dlq, true, false, false, false, queueArgs(b.cfg.QueueType, nil)); err != nil {
		return fmt.Errorf("declare queue %q (type %s): %w", dlq, b.cfg.QueueType, inequivalent(err, "queue", dlq))
	}
	if err := ch.QueueBind(dlq, queue, topology.DeadLetterExchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %q to %q: %w", dlq, topology.DeadLetterExchange, err)
	}
	if err := ch.QueueBind(queue, deliveryBindingKey(queue), topology.DelayDeliveryExchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %q to %q: %w", queue, topology.DelayDeliveryExchange, err)
	}
	return nil
}

// PublishToExchange publishes messages to exchange with routingKey, mandatory and
// confirmed, like every publish of the broker. On an exchange sluice declared, a message
// no queue is bound for goes to sluice.unrouted (the confirm still succeeds); on an
// exchange without an alternate exchange it fails with ErrUnroutable.
func (b *Broker) PublishToExchange(ctx context.Context, exchange, routingKey string, messages ...*message.Message) error {
	return b.pub.PublishTo(ctx, exchange, routingKey, messages...)
}
