// Package poison is sluice's dead-letter step. What the retry step returns — a Permanent
// error, or a retryable one whose retries are exhausted — is published to the queue's
// dead-letter queue with a full failure record, and the original is acked only after
// RabbitMQ confirmed the copy. Watermill's PoisonQueue keeps only the error string;
// RabbitMQ's own dead-lettering only x-death. The record here is what an operator needs to
// find the cause and replay the message (see cmd/sluice dlq).
//
// The dead-letter copy keeps the payload byte for byte, the message id, its headers and
// AMQP properties, and adds (metadata keys of package sluice):
//
//	x-error-type, x-error-class, x-error-message (truncated to MaxErrorMessageBytes),
//	x-error-stack (a recovered panic's stack, truncated to 16 KiB),
//	x-original-queue (always the queue consumed from), x-handler (or x-failed-stage when a
//	step before the handler failed), x-retry-count, x-arrived-retry-count,
//	x-trip-attempts, x-retry-history (this failure included), x-first-failure-time,
//	x-last-failure-time, x-failed-at, x-failed-host, x-failed-pid.
//
// If the dead-letter publish fails, the message is given back (disposition.GiveBack): the
// original is nacked and redelivered later, never lost, and the subscriber backs off
// between nacks so the consumer does not spin.
//
// In sluice's stack the retry step decides every failed attempt's fate and carries it out
// through this step's Carrier (its dead letters through DeadLetter); Middleware is the step
// used alone in a Watermill router, where every failure is dead-lettered at once.
package poison

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/topology"
)

// maxStackBytes is the size a panic's stack is truncated to in the record.
const maxStackBytes = 16 << 10

// ErrNoDeadLetterer is returned by New without a DeadLetterer.
var ErrNoDeadLetterer = errors.New("poison: Config.DeadLetterer is required")

// DeadLetterer publishes a message to queue's dead-letter queue and returns only once the
// broker confirmed it. It is package broker's capability.
type DeadLetterer = broker.DeadLetterer

// Event describes one dead-lettered message, for OnDeadLetter.
type Event struct {
	Queue     string
	MessageID string
	ErrorType string
	Retries   int
	Err       error
}

// Config configures the step.
type Config struct {
	// DeadLetterer is the broker's dead-letter publish. Required.
	DeadLetterer DeadLetterer
	// OnDeadLetter is called after each confirmed dead-letter publish.
	OnDeadLetter func(Event)
	// Observer, if not nil, is told the outcome of every attempt the step carries out
	// (package disposition), once, after its hand-off.
	Observer disposition.Observer
	// Logger receives dead letters (debug level: the telemetry step writes the info line
	// operators read) and discards (warn). Nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock. Nil means time.Now.
	Now func() time.Time
	// Host is recorded as x-failed-host. Empty means os.Hostname().
	Host string
}

// Poison is the dead-letter step.
type Poison struct {
	cfg Config
	pid string
}

// New returns the step, or an error naming what is missing.
func New(cfg Config) (*Poison, error) {
	if cfg.DeadLetterer == nil {
		return nil, ErrNoDeadLetterer
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Host == "" {
		cfg.Host, _ = os.Hostname()
	}
	return &Poison{cfg: cfg, pid: strconv.Itoa(os.Getpid())}, nil
}

// Middleware returns h wrapped by the dead-letter step used alone, without the retry step
// (in the stack, the retry step carries its dead letters out through Carrier): every
// failure is dead-lettered at once (disposition.Decide with no delay: a retryable or
// deferred error too), a Discard is acked, and a message an inner step gives back
// (disposition.GiveBack) is returned unacked.
func (p *Poison) Middleware(h message.HandlerFunc) message.HandlerFunc {
	c := p.Carrier(nil, p.cfg.Logger, nil)
	return func(msg *message.Message) ([]*message.Message, error) {
		// A step inside (Watermill's Timeout) may replace the context and cancel it.
		ctx := msg.Context()
		out, err := h(msg)
		msg.SetContext(ctx)
		if err == nil && c.Observer == nil {
			return out, nil
		}
		now := p.cfg.Now()
		retries := sluice.RetryCount(msg.Metadata)
		a := carry.Attempt{Msg: msg, Queue: message.SubscribeTopicFromCtx(ctx), Retries: retries, Number: retries + 1, First: now, Now: now}
		d := disposition.Decide(disposition.Policy{NoDelay: true}, disposition.History{Retries: retries, Now: now}, err)
		if cerr := c.Carry(ctx, a, d); cerr != nil {
			return nil, cerr
		}
		if err == nil {
			return out, nil
		}
		return nil, nil
	}
}

// Carrier returns the carrier of dispositions that dead-letters through this step: the
// retry step's, with its delayer, logger and observers (New of package retry calls it).
// The step's own Observer and OnDeadLetter see every attempt it carries out.
func (p *Poison) Carrier(delayer carry.Delayer, logger *slog.Logger, observers disposition.Observers) *carry.Carrier {
	obs := append(disposition.Observers(nil), observers...)
	if p.cfg.Observer != nil {
		obs = append(obs, p.cfg.Observer)
	}
	if p.cfg.OnDeadLetter != nil {
		obs = append(obs, disposition.ObserverFunc(func(_ context.Context, o disposition.Outcome) {
			if o.Disposition.Kind == disposition.DeadLetter {
				p.cfg.OnDeadLetter(Event{Queue: o.Queue, MessageID: o.MessageID, ErrorType: o.ErrorType, Retries: o.Attempt - 1, Err: o.Disposition.Reason})
			}
		}))
	}
	c := &carry.Carrier{Delayer: delayer, DeadLetter: p.DeadLetter, Logger: logger}
	if len(obs) > 0 {
		c.Observer = obs
	}
	return c
}

// DeadLetter publishes msg's dead-letter copy for reason (Record) to queue's dead-letter
// queue and returns it once the broker confirmed it.
func (p *Poison) DeadLetter(ctx context.Context, msg *message.Message, queue string, reason error) (*message.Message, error) {
	record := p.Record(msg, queue, reason)
	if err := p.cfg.DeadLetterer.DeadLetter(ctx, queue, record); err != nil {
		return nil, err
	}
	// Debug: the telemetry step writes the operator's line at info, rate-limited, so a
	// DLQ storm cannot flood the log.
	p.cfg.Logger.Debug("message dead-lettered", "queue", queue, "dlq", topology.DLQ(queue), "message_id", msg.UUID,
		"error_type", record.Metadata.Get(sluice.HeaderErrorType), "retries", sluice.RetryCount(msg.Metadata), "error", sluice.ErrorMessage(reason))
	return record, nil
}

// Record returns the dead-letter copy of msg for err: msg's id, payload and metadata with
// the failure record added.
func (p *Poison) Record(msg *message.Message, queue string, err error) *message.Message {
	now := p.cfg.Now()
	// The failure record, the retry state and the trace context the telemetry step injects.
	rec := headers.CopyWithRoom(msg, len(headers.FailureRecord)+len(headers.RetryState)+2)
	md := rec.Metadata
	retries := sluice.RetryCount(msg.Metadata)
	errType := sluice.ErrorType(err)
	md.Set(sluice.HeaderErrorType, errType)
	md.Set(headers.ErrorClass, sluice.ClassOf(err).String())
	md.Set(headers.DeadLetterReason, disposition.DeadLetterReasonOf(err))
	md.Set(sluice.HeaderErrorMessage, failure.Truncate(sluice.ErrorMessage(err), failure.MaxErrorMessageBytes))
	if stack, ok := failure.Stack(err); ok {
		md.Set(sluice.HeaderErrorStack, failure.Truncate(stack, maxStackBytes))
	} else {
		delete(md, sluice.HeaderErrorStack)
	}
	headers.StampWhere(md, err, message.HandlerNameFromCtx(msg.Context()))
	headers.StampFailure(md, msg.Metadata, headers.Failure{Queue: queue, RetryCount: retries, Attempt: retries + 1, Now: now, Err: err})
	md.Set(headers.FailedAt, failure.FormatTime(now))
	md.Set(headers.FailedHost, p.cfg.Host)
	md.Set(headers.FailedPID, p.pid)
	return rec
}
