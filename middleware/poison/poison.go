// Package poison is sluice's dead-letter step used alone, in a Watermill router of your
// own: every failure is published to the consumed queue's dead-letter queue with a full
// failure record, and the original is acked only after the broker confirmed the copy.
// Watermill's PoisonQueue keeps only the error string; RabbitMQ's own dead-lettering only
// x-death. The record here is what an operator needs to find the cause and replay the
// message (see cmd/sluice dlq).
//
// The dead-letter copy keeps the payload byte for byte, the message id, its headers and
// AMQP properties, and adds:
//
//	x-error-type, x-error-class, x-error-message (truncated to 512 bytes),
//	x-error-stack (a recovered panic's or a stuck attempt's stack, truncated to 16 KiB),
//	x-dead-letter-reason, x-original-queue (always the queue consumed from), x-handler
//	(or x-failed-stage when a step before the handler failed), x-retry-count,
//	x-arrived-retry-count, x-trip-attempts, x-retry-history (this failure included),
//	x-first-failure-time, x-last-failure-time, x-failed-at, x-failed-host, x-failed-pid.
//
// If the dead-letter publish fails, the message is given back: nacked and redelivered
// later, never lost, and the subscriber backs off between nacks so the consumer does not
// spin. A Discard is acked; a message an inner step returns unprocessed goes back unacked.
//
// In sluice's stack (package router) the retry step decides every failed attempt's fate and
// dead-letters what it gives up on with the same record, through the same code: this step
// is for a router without retries.
package poison

import (
	"errors"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/internal/decide"
)

// errNoDeadLetterer refuses a Config without a DeadLetterer: a program fixes its code, it
// does not branch on it.
var errNoDeadLetterer = errors.New("poison: Config.DeadLetterer is required")

// Config configures the step.
type Config struct {
	// DeadLetterer is the broker's dead-letter publish (amqp.Broker and memory.Broker are
	// ones). Required.
	DeadLetterer broker.DeadLetterer
	// Observer, if not nil, is told the outcome of every attempt the step carries out
	// (package disposition), once, after its hand-off: a DeadLetter for each message
	// dead-lettered.
	Observer disposition.Observer
	// Logger receives dead letters (debug level) and discards (warn). Nil means
	// slog.Default().
	Logger *slog.Logger
	// Host is recorded as x-failed-host. Empty means os.Hostname().
	Host string
	// Now is the record's clock. Nil means time.Now.
	Now func() time.Time
}

// Middleware returns the dead-letter step: every failure is dead-lettered at once (a
// retryable or deferred error too: there is no delay to retry it with), a Discard is acked,
// and a message an inner step returns unprocessed is given back unacked. It returns
// an error without a DeadLetterer.
func Middleware(cfg Config) (message.HandlerMiddleware, error) {
	if cfg.DeadLetterer == nil {
		return nil, errNoDeadLetterer
	}
	c := carry.New(carry.Carrier{DeadLetterer: cfg.DeadLetterer, Observer: cfg.Observer, Logger: cfg.Logger, Host: cfg.Host, Now: cfg.Now})
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			// A step inside (Watermill's Timeout) may replace the context and cancel it.
			ctx := msg.Context()
			out, err := h(msg)
			msg.SetContext(ctx)
			if err == nil && cfg.Observer == nil {
				return out, nil
			}
			now := c.Now()
			retries := sluice.RetryCount(msg.Metadata)
			a := carry.Attempt{Msg: msg, Queue: message.SubscribeTopicFromCtx(ctx), Retries: retries, Number: retries + 1, First: now, Now: now}
			in := decide.Input{Err: err, Policy: decide.Policy{NoDelay: true}, History: decide.History{Retries: retries, Now: now}}
			if cerr := c.Carry(ctx, a, in); cerr != nil {
				return nil, cerr
			}
			if err == nil {
				return out, nil
			}
			return nil, nil
		}
	}, nil
}
