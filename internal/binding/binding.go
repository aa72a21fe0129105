// Package binding holds the exchange binding both brokers declare: its kinds, its fields and
// the rules a binding must follow, so that RabbitMQ and the embedded broker accept and refuse
// the same ones.
package binding

import (
	"errors"
	"fmt"
)

// Kind is an AMQP exchange type.
type Kind string

// Exchange kinds, as in AMQP.
const (
	// Topic routes on dot-separated binding keys with * (one word) and # (zero or more).
	Topic Kind = "topic"
	// Direct routes on the exact binding key.
	Direct Kind = "direct"
	// Fanout sends every message to every bound queue.
	Fanout Kind = "fanout"
	// Headers routes on header values (Binding.Headers).
	Headers Kind = "headers"
)

// MetadataExchange and MetadataRoutingKey are the message metadata keys that say which
// exchange and routing key a message was published with (or, on a delivery, came from):
// broker/amqp's marshaler and broker/memory both use them, so handlers read one pair.
const (
	MetadataExchange   = "amqp-exchange"
	MetadataRoutingKey = "amqp-routing-key"
)

// ErrInvalid means a Binding is incomplete or contradicts its exchange kind.
var ErrInvalid = errors.New("sluice: invalid binding")

// Binding binds a queue to an exchange.
type Binding struct {
	// Exchange is the exchange's name; it must not be empty (the default exchange takes
	// no bindings).
	Exchange string
	// Kind is the exchange's type. Zero means Topic.
	Kind Kind
	// Keys are the binding keys, one binding each. Empty means "#" on a topic exchange
	// (every event); a direct exchange needs at least one; fanout and headers exchanges
	// ignore keys.
	Keys []string
	// Headers are the header values a headers exchange matches (all of them, or any with
	// MatchAny). Only for Headers, where at least one is needed.
	Headers map[string]string
	// MatchAny makes a headers binding match when any header matches instead of all.
	MatchAny bool
}

// Validate fills the kind's default and checks that the binding can be declared.
func (b *Binding) Validate() error {
	if b.Exchange == "" {
		return fmt.Errorf("%w: empty exchange name", ErrInvalid)
	}
	if b.Kind == "" {
		b.Kind = Topic
	}
	switch b.Kind {
	case Topic:
		if len(b.Keys) == 0 {
			b.Keys = []string{"#"}
		}
	case Direct:
		if len(b.Keys) == 0 {
			return fmt.Errorf("%w: direct exchange %q needs a binding key", ErrInvalid, b.Exchange)
		}
	case Fanout:
	case Headers:
		if len(b.Headers) == 0 {
			return fmt.Errorf("%w: headers exchange %q needs headers to match", ErrInvalid, b.Exchange)
		}
	default:
		return fmt.Errorf("%w: exchange %q has kind %q, want topic, direct, fanout or headers", ErrInvalid, b.Exchange, b.Kind)
	}
	if b.Kind != Headers && len(b.Headers) > 0 {
		return fmt.Errorf("%w: headers given for %s exchange %q", ErrInvalid, b.Kind, b.Exchange)
	}
	return nil
}
