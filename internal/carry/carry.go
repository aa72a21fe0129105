// Package carry carries out a delivery attempt's fate (package internal/decide): the one
// place where sluice builds a failure record (the retry copy's, the deferral's, the dead
// letter's), makes the one confirmed hand-off the fate needs, settles the delivery and
// tells the observers. The retry step uses it for every attempt; the poison step, used
// alone, uses it without a delay.
package carry

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/lifecycle"
	"github.com/sluice-go/sluice/internal/topology"
)

// maxStackBytes is the size a stack is truncated to in the record.
const maxStackBytes = 16 << 10

// Carrier carries fates out.
type Carrier struct {
	// Delayer takes Retry and Defer copies. Nil only where no Retry or Defer is decided
	// (the poison step alone: decide.Policy.NoDelay).
	Delayer broker.Delayer
	// DeadLetterer takes dead letters.
	DeadLetterer broker.DeadLetterer
	// Observer, if not nil, is told every attempt's outcome, once.
	Observer disposition.Observer
	// Logger receives discards (warn), failed hand-offs (error) and hand-offs (debug).
	Logger *slog.Logger
	// Host is recorded as x-failed-host; empty means os.Hostname(). Now is the record's
	// clock; nil means time.Now.
	Host string
	Now  func() time.Time

	pid string
}

// New returns c with its defaults filled in.
func New(c Carrier) *Carrier {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Host == "" {
		c.Host, _ = os.Hostname()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	c.pid = strconv.Itoa(os.Getpid())
	return &c
}

// Attempt is the attempt whose fate is carried out.
type Attempt struct {
	Msg   *message.Message
	Queue string
	// Retries is the message's x-retry-count; Number the attempt's number (from 1).
	Retries, Number int
	// First is the first failure's time, or the attempt's (Now) for a first failure.
	First, Now time.Time
	// Dependency is the handler's dependency, for the observers.
	Dependency string
}

// Carry carries out the fate in decides for attempt a: the fate's hand-off, confirmed;
// when that fails, the fate the decision gives a failed hand-off (a give-back); then the
// delivery's settlement and the observers. It returns nil when the message is to be acked
// (what replaces it confirmed), or the error that has the subscriber settle it otherwise.
// ctx is the context the attempt arrived with.
func (c *Carrier) Carry(ctx context.Context, a Attempt, in decide.Input) error {
	d := decide.Decide(in)
	if err := c.handOff(ctx, a, d); err != nil {
		in.HandOff = err
		d = decide.Decide(in)
	}
	return c.settle(ctx, a, d)
}

// handOff makes the publish d needs, confirmed, and logs what it did.
func (c *Carrier) handOff(ctx context.Context, a Attempt, d disposition.Disposition) error {
	msg := a.Msg
	switch d.Kind {
	case disposition.Discard:
		c.Logger.Warn("message discarded", "queue", a.Queue, "message_id", msg.UUID, "attempt", a.Number, "error", sluice.ErrorMessage(d.Reason))
	case disposition.Retry:
		if d.HeldBack {
			if c.Logger.Enabled(ctx, slog.LevelDebug) {
				c.Logger.Debug("message rejected for its queue's native delayed retry", "queue", a.Queue, "message_id", msg.UUID, "attempt", a.Number, "delay", d.Delay, "error", sluice.ErrorMessage(d.Reason))
			}
			return nil
		}
		return c.delay(ctx, "retry", a, d, c.retryCopy(a, d))
	case disposition.Defer:
		return c.delay(ctx, "deferral", a, d, c.deferCopy(a))
	case disposition.DeadLetter:
		hctx, cancel := lifecycle.HandoffContext(ctx)
		defer cancel()
		rec := c.Record(msg, a.Queue, a.Retries, d.Reason)
		if err := c.DeadLetterer.DeadLetter(hctx, a.Queue, rec); err != nil {
			err = fmt.Errorf("dead-letter publish of message %s from queue %q: %w", msg.UUID, a.Queue, err)
			c.Logger.Error("dead-letter publish failed; message will be redelivered", "queue", a.Queue, "message_id", msg.UUID, "error", err)
			return err
		}
		// Debug: the telemetry step writes the operator's line at info, rate-limited.
		if c.Logger.Enabled(ctx, slog.LevelDebug) {
			c.Logger.Debug("message dead-lettered", "queue", a.Queue, "dlq", topology.DLQ(a.Queue), "message_id", msg.UUID,
				"error_type", rec.Metadata.Get(sluice.HeaderErrorType), "retries", a.Retries, "error", sluice.ErrorMessage(d.Reason))
		}
	}
	return nil
}

// settle says how the subscriber settles the delivery (broker.Delivery.Settle, on the
// context the message arrived with), tells the observers, and returns what the step
// returns: nil to ack, an error to have the message nacked. Outside a subscriber that
// gives deliveries a broker.Delivery (a plain Watermill one) the settlement is dropped and
// the nack is the subscriber's own.
func (c *Carrier) settle(ctx context.Context, a Attempt, d disposition.Disposition) error {
	msg := a.Msg
	var err error
	switch {
	case d.Kind == disposition.Retry && d.HeldBack:
		// Rejected at once: the queue holds it back (and its delivery limit counts it).
		broker.DeliveryFrom(ctx).Settle(broker.SettleHoldBack)
		err = &GiveBack{Reason: fmt.Errorf("retry %d of message %s held back by queue %q for %s: %w", a.Retries+1, msg.UUID, a.Queue, d.Delay, d.Reason)}
	case d.Kind == disposition.GiveBack:
		settlement := broker.SettleReject // a failed hand-off: counted, after a growing pause
		if d.Unprocessed {
			// No fault of the message: returned at once, and not counted toward a quorum
			// queue's delivery limit.
			settlement = broker.SettleReturn
		}
		broker.DeliveryFrom(ctx).Settle(settlement)
		err = &GiveBack{Reason: d.Reason}
	}
	c.observe(ctx, a, d)
	return err
}

// GiveBack is the error a step returns for a message going back to its queue unacked
// (GiveBack, or a Retry the queue holds back): the router settles it without logging it
// as a handler's failure.
type GiveBack struct{ Reason error }

func (e *GiveBack) Error() string { return "given back: " + e.Reason.Error() }
func (e *GiveBack) Unwrap() error { return e.Reason }

// delay gives cp to the broker's delay for d, confirmed; what names it in the error.
func (c *Carrier) delay(ctx context.Context, what string, a Attempt, disp disposition.Disposition, cp *message.Message) error {
	// A handler deadline outside the step must not fail the hand-off.
	hctx, cancel := lifecycle.HandoffContext(ctx)
	defer cancel()
	d := disp.Delay
	if err := c.Delayer.Delay(hctx, a.Queue, d, cp); err != nil {
		return fmt.Errorf("%s hand-off of message %s to queue %q (delay %s): %w", what, a.Msg.UUID, a.Queue, d, err)
	}
	// Checked first: the arguments are boxed, and the message built, even for a record it
	// drops.
	if c.Logger.Enabled(ctx, slog.LevelDebug) {
		c.Logger.Debug("message handed to broker for "+what, "queue", a.Queue, "message_id", a.Msg.UUID, "attempt", a.Number, "delay", d, "error", sluice.ErrorMessage(disp.Reason))
	}
	return nil
}

// retryCopy is the retry copy of a's message: its failure record's retry state, and room
// for the trace context the telemetry step injects.
func (c *Carrier) retryCopy(a Attempt, d disposition.Disposition) *message.Message {
	cp := headers.CopyWithRoom(a.Msg, len(headers.RetryState)+2)
	headers.StampFailure(cp.Metadata, a.Msg.Metadata, headers.Failure{
		Queue: a.Queue, RetryCount: a.Retries + 1, Attempt: a.Number, First: a.First, Now: a.Now, Err: d.Reason,
	})
	return cp
}

// deferCopy is the deferral copy of a's message: its defer count, first defer time and
// original queue, and room for the trace context.
func (c *Carrier) deferCopy(a Attempt) *message.Message {
	msg := a.Msg
	cp := headers.CopyWithRoom(msg, 3+2)
	md := cp.Metadata
	defers, _ := strconv.Atoi(msg.Metadata.Get(headers.DeferCount))
	// The header is untrusted: a huge value must not wrap around to a negative count.
	md.Set(headers.DeferCount, strconv.Itoa(min(max(defers, 0), sluice.MaxRetryCountHeader)+1))
	if _, ok := failure.Time(msg.Metadata, headers.FirstDeferTime, a.Now); !ok {
		md.Set(headers.FirstDeferTime, failure.FormatTime(a.Now))
	}
	headers.StampOrigin(md, msg.Metadata, a.Queue, headers.ReadTrip(msg.Metadata).Carried)
	return cp
}

// Record returns the dead-letter copy of msg, consumed from queue with retries retries made,
// for reason err: msg's id, payload and metadata with the failure record added (see package
// poison for its headers). It is the one builder of failure records.
func (c *Carrier) Record(msg *message.Message, queue string, retries int, err error) *message.Message {
	now := c.Now()
	rec := headers.CopyWithRoom(msg, len(headers.FailureRecord)+len(headers.RetryState)+2)
	md := rec.Metadata
	md.Set(sluice.HeaderErrorType, sluice.ErrorType(err))
	md.Set(headers.ErrorClass, sluice.ClassOf(err).String())
	md.Set(headers.DeadLetterReason, decide.ReasonOf(err))
	md.Set(sluice.HeaderErrorMessage, failure.Truncate(sluice.ErrorMessage(err), failure.MaxErrorMessageBytes))
	if stack, ok := failure.Stack(err); ok {
		md.Set(sluice.HeaderErrorStack, failure.Truncate(stack, maxStackBytes))
	} else {
		delete(md, sluice.HeaderErrorStack)
	}
	headers.StampWhere(md, err, message.HandlerNameFromCtx(msg.Context()))
	headers.StampFailure(md, msg.Metadata, headers.Failure{Queue: queue, RetryCount: retries, Attempt: retries + 1, Now: now, Err: err})
	md.Set(headers.FailedAt, failure.FormatTime(now))
	md.Set(headers.FailedHost, c.Host)
	md.Set(headers.FailedPID, c.pid)
	return rec
}

// observe tells the observers the attempt's outcome.
func (c *Carrier) observe(ctx context.Context, a Attempt, d disposition.Disposition) {
	if c.Observer == nil {
		return
	}
	o := disposition.Outcome{
		Disposition: d, Attempt: a.Number, Queue: a.Queue, MessageID: a.Msg.UUID,
		Handler: message.HandlerNameFromCtx(ctx), Dependency: a.Dependency,
	}
	if d.Reason != nil {
		o.ErrorType = sluice.ErrorType(d.Reason)
	}
	if a.Number > 1 {
		// Only a retried message has a failure before this attempt to name.
		o.RetriedErrorType = a.Msg.Metadata.Get(sluice.HeaderLastError)
	}
	c.Observer.Observe(ctx, o)
}
