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
// If the dead-letter publish fails, the step returns a hand-off error: the original is
// nacked and redelivered later, never lost, and the subscriber backs off between nacks so
// the consumer does not spin. Discard errors never reach the step: the retry step inside it
// acks them (see package retry).
package poison

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/lifecycle"
	"github.com/sluice-go/sluice/internal/report"
	"github.com/sluice-go/sluice/internal/topology"
)

// maxStackBytes is the size a panic's stack is truncated to in the record.
const maxStackBytes = 16 << 10

// ErrNoDeadLetterer is returned by New without a DeadLetterer.
var ErrNoDeadLetterer = errors.New("poison: Config.DeadLetterer is required")

// DeadLetterer publishes a message to queue's dead-letter queue and returns only once the
// broker confirmed it.
type DeadLetterer interface {
	DeadLetter(ctx context.Context, queue string, msg *message.Message) error
}

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

// Middleware returns h wrapped by the dead-letter step.
func (p *Poison) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		// As in the retry step: a step inside may replace the context and cancel it.
		ctx := msg.Context()
		out, err := h(msg)
		msg.SetContext(ctx)
		if err == nil || failure.IsHandoff(err) {
			return out, err
		}
		queue := message.SubscribeTopicFromCtx(ctx)
		record := p.Record(msg, queue, err)
		// A handler deadline outside this step must not fail the dead-letter publish.
		hctx, cancel := lifecycle.HandoffContext(ctx)
		defer cancel()
		if derr := p.cfg.DeadLetterer.DeadLetter(hctx, queue, record); derr != nil {
			derr = fmt.Errorf("dead-letter publish of message %s from queue %q: %w", msg.UUID, queue, derr)
			p.cfg.Logger.Error("dead-letter publish failed; message will be redelivered", "queue", queue, "message_id", msg.UUID, "error", derr)
			report.ReportOutcome(ctx, report.Report{Outcome: report.OutcomeNack, Attempt: sluice.RetryCount(msg.Metadata) + 1, Err: derr})
			return nil, failure.Handoff(derr)
		}
		retries := sluice.RetryCount(msg.Metadata)
		report.ReportOutcome(ctx, report.Report{Outcome: report.OutcomeDeadLetter, Attempt: retries + 1, Err: err})
		// Debug: the telemetry step writes the operator's line at info, rate-limited, so a
		// DLQ storm cannot flood the log.
		p.cfg.Logger.Debug("message dead-lettered", "queue", queue, "dlq", topology.DLQ(queue), "message_id", msg.UUID,
			"error_type", record.Metadata.Get(sluice.HeaderErrorType), "retries", retries, "error", sluice.ErrorMessage(err))
		if p.cfg.OnDeadLetter != nil {
			p.cfg.OnDeadLetter(Event{Queue: queue, MessageID: msg.UUID, ErrorType: record.Metadata.Get(sluice.HeaderErrorType), Retries: retries, Err: err})
		}
		return nil, nil
	}
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
	md.Set(sluice.HeaderErrorMessage, failure.Truncate(sluice.ErrorMessage(err), failure.MaxErrorMessageBytes))
	if stack, ok := sluice.PanicStack(err); ok {
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
