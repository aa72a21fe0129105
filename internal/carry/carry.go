// Package carry carries out a delivery attempt's fate (package internal/decide): the one
// place where sluice builds a failure record (the retry copy's, the deferral's, the dead
// letter's), makes the one confirmed hand-off the fate needs, settles the delivery and
// tells the observers. The retry step uses it for every attempt; the poison step, used
// alone, uses it without a delay.
package carry

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
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
	// Compensation is the handler's compensation event; nil without one.
	Compensation *Compensation
}

// Compensation is a handler's compensation: the event published beside a dead letter whose
// fate is final (disposition.Disposition.Compensate).
type Compensation struct {
	// Build returns the event for msg, whose dead letter is record; its id is set after.
	Build func(msg, record *message.Message) (*message.Message, error)
	// Publish publishes the event, confirmed; To names where, for records and logs.
	Publish func(ctx context.Context, event *message.Message) error
	To      string
}

// Carry carries out the fate in decides for attempt a: the fate's hand-off, confirmed;
// when that fails, the fate the decision gives a failed hand-off (a give-back); then the
// delivery's settlement and the observers. It returns nil when the message is to be acked
// (what replaces it confirmed), or the error that has the subscriber settle it otherwise.
// ctx is the context the attempt arrived with.
func (c *Carrier) Carry(ctx context.Context, a Attempt, in decide.Input) error {
	d := decide.Decide(in)
	comp, err := c.handOff(ctx, a, d)
	if err != nil {
		in.HandOff = err
		d, comp = decide.Decide(in), ""
	}
	return c.settle(ctx, a, d, comp)
}

// handOff makes the publish d needs, confirmed, and logs what it did. On the dead letter
// of a handler with a compensation it also says what became of the event
// (disposition.Outcome.Compensation).
func (c *Carrier) handOff(ctx context.Context, a Attempt, d disposition.Disposition) (comp string, err error) {
	msg := a.Msg
	switch d.Kind {
	case disposition.Discard:
		c.Logger.Warn("message discarded", "queue", a.Queue, "message_id", msg.UUID, "attempt", a.Number, "error", sluice.ErrorMessage(d.Reason))
	case disposition.Retry:
		if d.HeldBack {
			if c.Logger.Enabled(ctx, slog.LevelDebug) {
				c.Logger.Debug("message rejected for its queue's native delayed retry", "queue", a.Queue, "message_id", msg.UUID, "attempt", a.Number, "delay", d.Delay, "error", sluice.ErrorMessage(d.Reason))
			}
			return "", nil
		}
		return "", c.delay(ctx, "retry", a, d, c.retryCopy(a, d))
	case disposition.Defer:
		return "", c.delay(ctx, "deferral", a, d, c.deferCopy(a))
	case disposition.DeadLetter:
		hctx, cancel := lifecycle.HandoffContext(ctx)
		defer cancel()
		rec := c.Record(msg, a.Queue, a.Retries, d.Reason)
		if a.Compensation != nil {
			if d.Compensate {
				return c.compensate(hctx, a, rec)
			}
			// Its last attempt may still run and have its effect: compensating now could undo
			// work that then happens. The operator decides, told why by the record.
			rec.Metadata.Set(headers.CompensationError, compensationWithheld)
			comp = disposition.CompensationWithheld
		}
		if err := c.DeadLetterer.DeadLetter(hctx, a.Queue, rec); err != nil {
			err = fmt.Errorf("dead-letter publish of message %s from queue %q: %w", msg.UUID, a.Queue, err)
			c.Logger.Error("dead-letter publish failed; message will be redelivered", "queue", a.Queue, "message_id", msg.UUID, "error", err)
			return "", err
		}
		// Debug: the telemetry step writes the operator's line at info, rate-limited.
		if c.Logger.Enabled(ctx, slog.LevelDebug) {
			c.Logger.Debug("message dead-lettered", "queue", a.Queue, "dlq", topology.DLQ(a.Queue), "message_id", msg.UUID,
				"error_type", rec.Metadata.Get(sluice.HeaderErrorType), "retries", a.Retries, "error", sluice.ErrorMessage(d.Reason))
		}
		return comp, nil
	}
	return "", nil
}

// settle says how the subscriber settles the delivery (broker.Delivery.Settle, on the
// context the message arrived with), tells the observers, and returns what the step
// returns: nil to ack, an error to have the message nacked. Outside a subscriber that
// gives deliveries a broker.Delivery (a plain Watermill one) the settlement is dropped and
// the nack is the subscriber's own.
func (c *Carrier) settle(ctx context.Context, a Attempt, d disposition.Disposition, comp string) error {
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
	c.observe(ctx, a, d, comp)
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
	// Only this fate's compensation may be named (compensate sets them again): a producer's
	// x-compensation-* would make the DLQ tools refuse a replay for an event never sent.
	delete(md, headers.CompensationID)
	delete(md, headers.CompensationTo)
	delete(md, headers.CompensationError)
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
func (c *Carrier) observe(ctx context.Context, a Attempt, d disposition.Disposition, comp string) {
	if c.Observer == nil {
		return
	}
	o := disposition.Outcome{
		Disposition: d, Attempt: a.Number, Queue: a.Queue, MessageID: a.Msg.UUID,
		Handler: message.HandlerNameFromCtx(ctx), Dependency: a.Dependency, Compensation: comp,
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

// compensationWithheld is the record's x-compensation-error when the last attempt may still
// run.
const compensationWithheld = "withheld: the last attempt was abandoned at its handler timeout and may still be running, so its effect may still happen; compensate by hand if it did not"

type compensationKey struct{}

// WithCompensation returns ctx carrying the handler's compensation, for the retry step to
// find (the router sets it on the messages of a handler that has one).
func WithCompensation(ctx context.Context, c *Compensation) context.Context {
	return context.WithValue(ctx, compensationKey{}, c)
}

// CompensationFrom returns the compensation ctx carries, nil when none.
func CompensationFrom(ctx context.Context) *Compensation {
	c, _ := ctx.Value(compensationKey{}).(*Compensation)
	return c
}

// compensate publishes a's dead letter rec and its compensation event at once, both
// confirmed: the original is acked only when both are, and given back when either fails,
// so that the redelivery hands both off again. The event's id is the same on every
// redelivery, so its consumers deduplicate.
func (c *Carrier) compensate(ctx context.Context, a Attempt, rec *message.Message) (string, error) {
	comp := a.Compensation
	event, err := comp.Build(a.Msg, rec)
	switch {
	case err != nil:
		// A builder that fails would fail on every redelivery: the dead letter goes alone,
		// and its record says why, for the operator.
		rec.Metadata.Set(headers.CompensationError, failure.Truncate(err.Error(), failure.MaxErrorMessageBytes))
		c.Logger.Error("compensation event not built; dead-lettering without it", "queue", a.Queue, "message_id", a.Msg.UUID, "error", err)
		event = nil
	case event == nil:
		rec.Metadata.Set(headers.CompensationError, "the compensation builder returned no event")
	}
	if event == nil {
		if err := c.DeadLetterer.DeadLetter(ctx, a.Queue, rec); err != nil {
			err = fmt.Errorf("dead-letter publish of message %s from queue %q: %w", a.Msg.UUID, a.Queue, err)
			c.Logger.Error("dead-letter publish failed; message will be redelivered", "queue", a.Queue, "message_id", a.Msg.UUID, "error", err)
			return "", err
		}
		return disposition.CompensationBuildFailed, nil
	}
	event.UUID = CompensationID(a.Msg)
	if event.Metadata == nil {
		event.Metadata = message.Metadata{}
	}
	for _, k := range []string{headers.CorrelationID, headers.WatermillCorrelationID} {
		if v := a.Msg.Metadata.Get(k); v != "" && event.Metadata.Get(k) == "" {
			event.Metadata.Set(k, v)
		}
	}
	event.Metadata.Set(headers.CompensationOf, a.Msg.UUID)
	event.SetContext(ctx) // the message's trace: the publisher's span continues it
	rec.Metadata.Set(headers.CompensationID, event.UUID)
	rec.Metadata.Set(headers.CompensationTo, comp.To)
	var wg sync.WaitGroup
	var eventErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		eventErr = comp.Publish(ctx, event)
	}()
	deadErr := c.DeadLetterer.DeadLetter(ctx, a.Queue, rec)
	wg.Wait()
	if err := errors.Join(deadErr, eventErr); err != nil {
		err = fmt.Errorf("dead letter and compensation of message %s from queue %q: %w", a.Msg.UUID, a.Queue, err)
		c.Logger.Error("dead-letter or compensation publish failed; message will be redelivered", "queue", a.Queue, "message_id", a.Msg.UUID, "error", err)
		return "", err
	}
	if c.Logger.Enabled(ctx, slog.LevelDebug) {
		c.Logger.Debug("message dead-lettered and compensated", "queue", a.Queue, "message_id", a.Msg.UUID, "compensation_id", event.UUID, "to", comp.To)
	}
	return disposition.CompensationSent, nil
}

// CompensationID is the id of the compensation event of msg's final fate: derived from the
// message id and the number of times an operator replayed it, so it is the same on every
// redelivery and native retry of one fate, and new for the fate a replay starts. A UUID
// (version 8, from SHA-256), as Watermill's ids are.
func CompensationID(msg *message.Message) string {
	h := sha256.Sum256([]byte("sluice compensation\x00" + msg.UUID + "\x00" + msg.Metadata.Get(headers.ReplayCount)))
	b := h[:16]
	b[6] = (b[6] & 0x0f) | 0x80 // version 8
	b[8] = (b[8] & 0x3f) | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
