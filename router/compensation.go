package router

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/router/internal/output"
)

// Compensation is the event a handler publishes when a message's fate is final, so that
// the work it was part of is undone elsewhere: a saga's compensating command (an order
// cancelled when its payment gives up). See WithCompensation.
type Compensation struct {
	// Exchange is the exchange the event is published to, with RoutingKey (declared as an
	// Output's exchange, of kind Topic); empty means the queue Queue.
	Exchange, RoutingKey string
	// Queue is the queue the event is published to when Exchange is empty.
	Queue string
	// Build returns the event for msg, whose dead-letter copy (its failure record:
	// x-error-type, x-error-message, x-dead-letter-reason, ...) is record. The stack sets
	// its id (derived from the message id and its fate, the same on every redelivery, so
	// consumers deduplicate) and copies the message's correlation id onto it. An error
	// dead-letters the message without a compensation, its record saying why. Required.
	Build func(msg, record *message.Message) (*message.Message, error)
}

// WithCompensation makes the handler publish c's event when a message's fate is final:
// dead-lettered (retries exhausted, permanent, unlikely to recover, over its retry
// budget), not discarded. The event and the dead letter are published at once, both
// confirmed, before the original is acked; when either fails the original goes back to its
// queue and both are published again on its redelivery, so the event is delivered at least
// once with one id. It continues the message's trace and is counted in
// sluice_compensations_total. A message whose last attempt was abandoned at its handler
// timeout and may still be running is dead-lettered without one (its record says so: the
// operator decides). Replaying a compensated dead letter asks for an explicit confirmation
// (`sluice dlq replay --compensated`).
func WithCompensation(c Compensation) HandlerOption {
	return func(hc *handlerConfig) { hc.compensation = &c }
}

// compensation checks hc's compensation, records what Run declares for it and returns what
// the retry step publishes it with; nil without one. s.mu is held.
func (s *Stack) compensation(name string, hc handlerConfig) (*carry.Compensation, error) {
	c := hc.compensation
	if c == nil {
		return nil, nil
	}
	switch {
	case c.Build == nil:
		return nil, fmt.Errorf("%w: handler %q has WithCompensation without a Build function", ErrInvalidOption, name)
	case c.Exchange == "" && c.Queue == "":
		return nil, fmt.Errorf("%w: handler %q has WithCompensation without an Exchange or a Queue", ErrInvalidOption, name)
	}
	pub := s.chain.Queues
	to, dest := c.Queue, "queue "+c.Queue
	var prepare func(*message.Message)
	if c.Exchange != "" {
		pub = s.chain.Exchanges
		to, dest, prepare = c.Exchange, fmt.Sprintf("exchange %s, key %s", c.Exchange, c.RoutingKey), output.DefaultKey(c.RoutingKey)
		s.plan.OutputExchange(c.Exchange, broker.Topic, false)
	} else {
		s.plan.Output(c.Queue)
	}
	if s.compensations == nil {
		s.compensations = map[string]string{}
	}
	s.compensations[name] = dest
	return &carry.Compensation{Build: c.Build, To: dest, Publish: func(ctx context.Context, ev *message.Message) error {
		ev.SetContext(ctx)
		if prepare != nil {
			prepare(ev)
		}
		return pub.Publish(to, ev)
	}}, nil
}

// withCompensation has every message of h carry comp to the retry step; h itself without one.
func withCompensation(h message.HandlerFunc, comp *carry.Compensation) message.HandlerFunc {
	if comp == nil {
		return h
	}
	return func(m *message.Message) ([]*message.Message, error) {
		m.SetContext(carry.WithCompensation(m.Context(), comp))
		return h(m)
	}
}
