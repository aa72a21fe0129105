// Package carry carries out a delivery attempt's disposition (package disposition): the
// one place where sluice builds a failure record, makes the confirmed hand-off it needs
// (the retry or deferral copy to the broker's delay, the dead-letter copy to the DLQ), and
// tells the observers the attempt's outcome. The retry step uses it for every attempt; the
// poison step uses it alone, without a delay.
package carry

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/lifecycle"
)

// Delayer hands a message to the broker so it is delivered to queue after d, confirmed:
// package broker's capability.
type Delayer = broker.Delayer

// DeadLetterFunc publishes msg's dead-letter copy for reason to queue's DLQ, confirmed, and
// returns the copy it published (its record).
type DeadLetterFunc func(ctx context.Context, msg *message.Message, queue string, reason error) (*message.Message, error)

// Carrier carries dispositions out.
type Carrier struct {
	// Delayer takes Retry and Defer copies. Nil only where Decide never returns either.
	Delayer Delayer
	// DeadLetter publishes DeadLetter copies.
	DeadLetter DeadLetterFunc
	// Observer, if not nil, is told every attempt's outcome.
	Observer disposition.Observer
	// Logger receives discards (warn), failed dead-letter publishes (error) and
	// hand-offs (debug).
	Logger *slog.Logger
}

// Attempt is the attempt whose disposition is carried out.
type Attempt struct {
	Msg   *message.Message
	Queue string
	// Retries is the message's x-retry-count; Number the attempt's number (from 1).
	Retries, Number int
	// First is the first failure's time, or the attempt's (Now) for a first failure.
	First, Now time.Time
	// Dependency is the handler's dependency, for the observers.
	Dependency string
	// Requeue, on a Retry, has the queue itself hold the message back for the retry's
	// delay (a broker's native delayed retry, broker.NativeRetrier): the message goes back
	// to its queue rejected, with nothing handed to the Delayer. It is observed as the
	// Retry it is.
	Requeue bool
}

// Carry carries d out for attempt a, then tells the observers. It returns nil when the
// message is to be acked (its replacement, if any, confirmed) and a GiveBack error when it
// goes back to its queue unacked. ctx is the context the attempt arrived with.
func (c *Carrier) Carry(ctx context.Context, a Attempt, d disposition.Disposition) error {
	msg := a.Msg
	var err error
	switch d.Kind {
	case disposition.Discard:
		c.Logger.Warn("message discarded", "queue", a.Queue, "message_id", msg.UUID, "attempt", a.Number, "error", sluice.ErrorMessage(d.Reason))
	case disposition.Retry:
		if a.Requeue {
			// Returned as a give-back without Unprocessed: the subscriber rejects it, which
			// is what the queue's delayed retry holds back (and its delivery limit counts).
			msg.Metadata.Set(headers.HeldBack, "1")
			if c.Logger.Enabled(context.Background(), slog.LevelDebug) {
				c.Logger.Debug("message rejected for its queue's native delayed retry", "queue", a.Queue, "message_id", msg.UUID, "attempt", a.Number, "delay", d.Delay, "error", sluice.ErrorMessage(d.Reason))
			}
			c.observe(ctx, a, d)
			return disposition.GiveBackError(fmt.Errorf("retry %d of message %s held back by queue %q for %s: %w", a.Retries+1, msg.UUID, a.Queue, d.Delay, d.Reason))
		}
		// The failure record, and the trace context the telemetry step injects.
		cp := headers.CopyWithRoom(msg, len(headers.RetryState)+2)
		headers.StampFailure(cp.Metadata, msg.Metadata, headers.Failure{
			Queue: a.Queue, RetryCount: a.Retries + 1, Attempt: a.Number, First: a.First, Now: a.Now, Err: d.Reason,
		})
		err = c.handOff(ctx, "retry", a, d, cp)
	case disposition.Defer:
		// The defer count, first defer time and original queue, and the trace context.
		cp := headers.CopyWithRoom(msg, 3+2)
		md := cp.Metadata
		defers, _ := strconv.Atoi(msg.Metadata.Get(headers.DeferCount))
		// The header is untrusted: a huge value must not wrap around to a negative count.
		md.Set(headers.DeferCount, strconv.Itoa(min(max(defers, 0), sluice.MaxRetryCountHeader)+1))
		if _, ok := failure.Time(msg.Metadata, headers.FirstDeferTime, a.Now); !ok {
			md.Set(headers.FirstDeferTime, failure.FormatTime(a.Now))
		}
		headers.StampOrigin(md, msg.Metadata, a.Queue, headers.ReadTrip(msg.Metadata).Carried)
		err = c.handOff(ctx, "deferral", a, d, cp)
	case disposition.DeadLetter:
		hctx, cancel := lifecycle.HandoffContext(ctx)
		_, derr := c.DeadLetter(hctx, msg, a.Queue, d.Reason)
		cancel()
		if derr != nil {
			err = fmt.Errorf("dead-letter publish of message %s from queue %q: %w", msg.UUID, a.Queue, derr)
			c.Logger.Error("dead-letter publish failed; message will be redelivered", "queue", a.Queue, "message_id", msg.UUID, "error", err)
		}
	case disposition.GiveBack:
		err = d.Reason
		if d.Unprocessed {
			// A stopping consumer, a paused handler: no fault of the message, so the
			// subscriber returns it with a basic.nack, which RabbitMQ 4.x does not count
			// toward a quorum queue's delivery limit (see Disposition.Unprocessed).
			msg.Metadata.Set(headers.GivenBack, "1")
		}
	}
	if err != nil {
		d = disposition.Disposition{Kind: disposition.GiveBack, Reason: err}
	}
	c.observe(ctx, a, d)
	if d.Kind == disposition.GiveBack {
		if disposition.IsGiveBack(err) {
			return err
		}
		return disposition.GiveBackError(err)
	}
	return nil
}

// handOff gives cp to the broker's delay for d, confirmed; what for names it in the error.
func (c *Carrier) handOff(ctx context.Context, what string, a Attempt, disp disposition.Disposition, cp *message.Message) error {
	// A handler deadline outside the step must not fail the hand-off.
	hctx, cancel := lifecycle.HandoffContext(ctx)
	defer cancel()
	d := disp.Delay
	if err := c.Delayer.Delay(hctx, a.Queue, d, cp); err != nil {
		return fmt.Errorf("%s hand-off of message %s to queue %q (delay %s): %w", what, a.Msg.UUID, a.Queue, d, err)
	}
	// Checked first, as Debug checks (with a background context): the arguments are
	// boxed, and the message built, even for a record it drops.
	if c.Logger.Enabled(context.Background(), slog.LevelDebug) {
		c.Logger.Debug("message handed to broker for "+what, "queue", a.Queue, "message_id", a.Msg.UUID, "attempt", a.Number, "delay", d, "error", sluice.ErrorMessage(disp.Reason))
	}
	return nil
}

// observe tells the observers the attempt's outcome.
func (c *Carrier) observe(ctx context.Context, a Attempt, d disposition.Disposition) {
	if c.Observer == nil {
		return
	}
	o := disposition.Outcome{
		Disposition: d, Attempt: a.Number, Queue: a.Queue, MessageID: a.Msg.UUID,
		Handler: message.HandlerNameFromCtx(ctx), Dependency: a.Dependency,
		HeldBack: a.Requeue && d.Kind == disposition.Retry,
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
