package router

import (
	"fmt"
	"time"

	"github.com/sluice-go/sluice/broker"
)

// WithNativeRetry has the broker itself hold the handler's failed messages back between
// retries, on a linear schedule: the n-th retry waits min × n, at most max (RabbitMQ 4.3's
// delayed retry on quorum queues, the only schedule it carries out). A failed attempt with
// retries left is then rejected back to its queue instead of republished through the
// delay cascade: no copy is published, no delay queue is crossed, and the broker does a
// third less work per retry (docs/reliability.md, "4.3's native delayed retry").
//
// It replaces the stack's backoff for the handler's plain retryable failures only;
// MaxRetries, the learned policy and the overload protection still apply, and what the
// queue cannot carry still goes through the cascade: a RetryAfter or Defer wait, a delay
// the overload protection stretched, a learned policy's probe. What it costs: no jitter,
// no failure headers between native retries (so MaxTotalAge does not bound them, and the
// dead letter's history names the last attempt's error only), and the schedule is fixed
// in the queue's arguments (redeclaring it with other values fails with an
// *amqp.InequivalentError naming the argument).
//
// It needs a broker with the capability (broker.NativeRetrier): on RabbitMQ, a 4.3 node,
// amqp.Config.QueueType quorum and the stack's MaxRetries below amqp.Config.DeliveryLimit,
// checked when Run declares the queue. The embedded broker has none: Handle returns
// ErrInvalidOption. It cannot be combined with WithPartitions, WithSubscription or
// WithAdopt (ErrInvalidOption).
func WithNativeRetry(min, max time.Duration) HandlerOption {
	return func(c *handlerConfig) { c.native = &broker.NativeRetry{Min: min, Max: max} }
}

// checkNativeRetry refuses a WithNativeRetry the broker or the handler's other options
// cannot carry, and fills in the stack's MaxRetries.
func (s *Stack) checkNativeRetry(name string, hc *handlerConfig) error {
	if hc.native == nil {
		return nil
	}
	if _, ok := s.broker.(broker.NativeRetrier); !ok {
		return fmt.Errorf("%w: handler %q sets WithNativeRetry but the %s broker has no native delayed retry (RabbitMQ 4.3 has: broker/amqp)", ErrInvalidOption, name, s.broker.Name())
	}
	switch {
	case hc.partitions != 0:
		return fmt.Errorf("%w: handler %q sets WithNativeRetry with WithPartitions", ErrInvalidOption, name)
	case hc.sub.wanted():
		return fmt.Errorf("%w: handler %q sets WithNativeRetry with WithSubscription, WithAdopt or WithOutputExchange", ErrInvalidOption, name)
	case hc.batched:
		return fmt.Errorf("%w: handler %q sets WithNativeRetry on HandleBatch", ErrInvalidOption, name)
	}
	hc.native.MaxRetries = s.retry.Config().MaxRetries
	if err := hc.native.Validate(); err != nil {
		return fmt.Errorf("%w: handler %q: WithNativeRetry(%s, %s): %w", ErrInvalidOption, name, hc.native.Min, hc.native.Max, err)
	}
	return nil
}
