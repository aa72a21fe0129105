// Package disposition holds the fate of one delivery attempt as a typed value, as observers
// of the stack see it.
//
// A handler's attempt ends in exactly one Disposition: Ack, Retry after a delay (handed to
// the broker's delay, or held back by the queue itself), Defer (try again later without
// using an attempt), DeadLetter with a reason, Discard, or GiveBack (return the message to
// its queue unacked, to be redelivered). One function decides it, from explicit inputs only,
// and one place carries it out (sluice's retry step); Describe shows the same decision
// table in words.
//
// Observers see every attempt's Outcome: the step that carries the disposition out calls
// Observer.Observe once per attempt, after the hand-off it made was confirmed (or failed).
package disposition

import (
	"errors"
	"fmt"
	"time"
)

// Kind is what happens to the message after one attempt.
type Kind uint8

// The kinds of disposition.
const (
	// Ack acknowledges the message: the handler succeeded.
	Ack Kind = iota
	// Retry hands a copy to the broker's delay, to be tried again after Delay, and acks
	// the original once the copy is confirmed; with HeldBack, the queue holds the message
	// back itself and nothing is handed off.
	Retry
	// Defer is Retry without using an attempt: the message was not processed.
	Defer
	// DeadLetter publishes the message with its failure record to its queue's dead-letter
	// queue and acks the original once the copy is confirmed.
	DeadLetter
	// Discard acks the message without processing it any further; it is logged.
	Discard
	// GiveBack returns the message to its queue unacked: it is redelivered and no attempt
	// is used. A failed hand-off, a stopping consumer and an open breaker that pauses its
	// handler end this way.
	GiveBack
	// Duplicate acks a message the idempotency step found already done, without calling
	// the handler. Only observed: Decide never returns it.
	Duplicate
)

// String returns the kind's name as the outcome label of metrics, spans and logs (the
// labels sluice has always used: Defer is "deferred", GiveBack is "nack").
func (k Kind) String() string {
	switch k {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case Defer:
		return "deferred"
	case DeadLetter:
		return "dead_letter"
	case Discard:
		return "discard"
	case GiveBack:
		return "nack"
	case Duplicate:
		return "duplicate"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Disposition is the fate of one attempt.
type Disposition struct {
	Kind Kind
	// Delay is how long the broker holds the copy of a Retry or Defer.
	Delay time.Duration
	// Reason is the error behind every kind but Ack: the handler's error, or what ended
	// the retries (an *ExhaustedError wrapping it), or why a message is given back.
	Reason error
	// Unprocessed, on a GiveBack, says the handler never processed the message (a paused
	// handler, a stopping consumer): it is returned with a basic.nack, which RabbitMQ 4.x
	// does not count toward a quorum queue's delivery limit. A GiveBack without it (a
	// failed hand-off) is a basic.reject, which it counts, so a hand-off that keeps failing
	// ends in the queue's DLQ rather than in an endless loop.
	Unprocessed bool
	// HeldBack, on a Retry, says the queue holds the message back for Delay itself (a
	// broker's native delayed retry, router.WithNativeRetry): it is rejected back to its
	// queue and nothing is handed to a delay.
	HeldBack bool
	// Compensate, on a DeadLetter, says the handler's compensation event
	// (router.WithCompensation) is published beside the dead letter, both confirmed before
	// the ack. It is not set when the message's last attempt was abandoned at its handler
	// timeout and may still be running: its effect may still happen.
	Compensate bool
}

// Errors that end a message's retries; they are matched (errors.Is) by a DeadLetter's
// Reason.
var (
	// ErrRetriesExhausted matches the reason of a message that used all its retries or
	// grew older than the retry policy's MaxTotalAge.
	ErrRetriesExhausted = errors.New("retries exhausted")
	// ErrDeferralExpired matches the reason of a message deferred for longer than
	// MaxTotalAge.
	ErrDeferralExpired = errors.New("deferred past the maximum total age")
	// ErrRetryUnlikely matches the reason of a message the learned retry policy
	// dead-lettered without retrying, because messages that failed with its error type have
	// not been recovering. Its dead letter replays like any other.
	ErrRetryUnlikely = errors.New("retry_unlikely")
)
