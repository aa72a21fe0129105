// Package output is the stack's output step: the messages a handler returns are published,
// confirmed, to a queue or an exchange, before the consumed message is acked, and the
// step returns none to the router. So the idempotency step outside marks a key done only
// once its outputs are on the broker, and a failed output publish is retried and
// dead-lettered like a handler failure.
package output

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/lifecycle"
)

// ErrNoTopic is the (permanent) failure of a handler that returned output messages where
// nothing says where they go (router.ErrOutputWithoutTopic is this value): acking would
// drop them, nacking would loop.
var ErrNoTopic = errors.New("router: handler returned output messages but has no output topic")

// RoutingKeyMetadata is the metadata key with which a handler gives one output message its
// own routing key on an exchange (router.RoutingKeyMetadata is this value); it is removed
// before the message is published.
const RoutingKeyMetadata = "sluice-routing-key"

// Step publishes the handler's outputs with pub to topic, confirmed; an empty topic means
// the handler's publish topic (message.PublishTopicFromCtx). Each output passes through
// prepare first, when it is not nil. A failed publish is an ordinary retryable error.
func Step(pub message.Publisher, topic string, prepare func(*message.Message)) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			// A step inside (Watermill's Timeout) may replace the context and cancel it on
			// return; the outputs are published with the one the attempt arrived with.
			ctx := msg.Context()
			out, err := h(msg)
			msg.SetContext(ctx)
			if err != nil || len(out) == 0 {
				return nil, err
			}
			to := topic
			if to == "" {
				to = message.PublishTopicFromCtx(ctx)
			}
			if to == "" {
				return nil, sluice.Permanent(fmt.Errorf("%w: %d message(s) from handler %q", ErrNoTopic, len(out), message.HandlerNameFromCtx(ctx)))
			}
			// Without the handler's deadline: the hand-off has its own bound.
			hctx, cancel := lifecycle.HandoffContext(ctx)
			defer cancel()
			for _, o := range out {
				o.SetContext(hctx)
				if prepare != nil {
					prepare(o)
				}
			}
			if err := pub.Publish(to, out...); err != nil {
				return nil, fmt.Errorf("publish %d output message(s) to %q: %w", len(out), to, err)
			}
			return nil, nil
		}
	}
}

// Exchange is a message.Publisher whose topic is an exchange and whose routing key is each
// message's RoutingKeyMetadata, published through b, confirmed.
type Exchange struct{ B broker.Broker }

// Publish publishes messages to exchange, a batch per run of one routing key.
func (p Exchange) Publish(exchange string, messages ...*message.Message) error {
	for len(messages) > 0 {
		key := messages[0].Metadata.Get(RoutingKeyMetadata)
		n := 1
		for n < len(messages) && messages[n].Metadata.Get(RoutingKeyMetadata) == key {
			n++
		}
		batch := messages[:n]
		messages = messages[n:]
		for _, m := range batch {
			delete(m.Metadata, RoutingKeyMetadata)
		}
		ctx, cancel := lifecycle.MessageDeadline(batch[0])
		err := p.B.PublishToExchange(ctx, exchange, key, batch...)
		cancel()
		if err != nil {
			return fmt.Errorf("routing key %q: %w", key, err)
		}
	}
	return nil
}

// Close does nothing: the broker's owner closes it.
func (Exchange) Close() error { return nil }

// DefaultKey gives an output message without RoutingKeyMetadata the routing key key.
func DefaultKey(key string) func(*message.Message) {
	return func(m *message.Message) {
		if m.Metadata.Get(RoutingKeyMetadata) == "" {
			m.Metadata.Set(RoutingKeyMetadata, key)
		}
	}
}
