package retrystats

import (
	"errors"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
)

// RetryEnd is how a message's retries ended, as the retry statistics count it.
type RetryEnd uint8

// The ends of a message's retries.
const (
	// EndNone: the message goes on (it was retried, or the attempt says nothing).
	EndNone RetryEnd = iota
	// Recovered: acked at an attempt after a failure.
	Recovered
	// Exhausted: dead-lettered with its retries used up or older than MaxTotalAge.
	Exhausted
	// MadePermanent: dead-lettered because its error was Permanent.
	MadePermanent
	// Discarded: discarded (sluice.Discard).
	Discarded
	// DeadLettered: dead-lettered for another reason (a deferral past its age, a refused
	// retry budget).
	DeadLettered
	// Unlikely: dead-lettered by the learned retry policy (ErrRetryUnlikely) without
	// retrying.
	Unlikely
)

// String returns the end's name, the outcome label of sluice_retry_outcomes_total.
func (e RetryEnd) String() string {
	switch e {
	case Recovered:
		return "recovered"
	case Exhausted:
		return "exhausted"
	case MadePermanent:
		return "permanent"
	case Discarded:
		return "discarded"
	case DeadLettered:
		return "dead_lettered"
	case Unlikely:
		return "retry_unlikely"
	}
	return ""
}

// RetryEvent is what one attempt's Outcome tells the retry statistics about an error type.
//
// A message is counted under each error type it failed with (NewMessage on the first
// failure of a run of that type); its end is counted under the type of its last failure:
// a recovery under the type it recovered from, a dead letter under its own error's type.
type RetryEvent struct {
	// ErrorType is the type the event counts under: the attempt's error's type when it
	// failed, else the type of the failure it recovered from.
	ErrorType string
	// NewMessage is true when the attempt failed with ErrorType and the failure before it
	// (if any) had another type: one more message that failed with ErrorType.
	NewMessage bool
	// Retried is true when a retry was spent on ErrorType.
	Retried bool
	// Resolved is the error type of the failure whose retry this attempt was, "" on a
	// first attempt: the retry of that type is no longer in flight.
	Resolved string
	// End is how the message ended; EndNone while it goes on.
	End RetryEnd
	// Attempt is the attempt's number, from 1.
	Attempt int
}

// Evidence reports whether the event is evidence of whether retrying ErrorType helps: a
// message that was retried after a failure of ErrorType and whose retries ended (in a
// recovery or a dead letter), not by the learned policy's own decision.
func (e RetryEvent) Evidence() bool {
	return e.End != EndNone && e.End != Unlikely && e.Resolved == e.ErrorType && e.ErrorType != ""
}

// RetryEventOf returns what o tells the retry statistics; false for an attempt that tells
// them nothing: a first attempt that succeeded (the success path costs one comparison),
// a deferral or a give-back (no attempt used).
func RetryEventOf(o disposition.Outcome) (RetryEvent, bool) {
	prev := o.RetriedErrorType
	switch o.Disposition.Kind {
	case disposition.Ack, disposition.Duplicate:
		if prev == "" {
			return RetryEvent{}, false
		}
		return RetryEvent{ErrorType: prev, Resolved: prev, End: Recovered, Attempt: o.Attempt}, true
	case disposition.Retry, disposition.DeadLetter, disposition.Discard:
	default:
		return RetryEvent{}, false
	}
	ev := RetryEvent{ErrorType: o.ErrorType, NewMessage: o.ErrorType != prev, Resolved: prev, Attempt: o.Attempt}
	switch reason := o.Disposition.Reason; o.Disposition.Kind {
	case disposition.Retry:
		ev.Retried = true
	case disposition.Discard:
		ev.End = Discarded
	default:
		switch {
		case errors.Is(reason, disposition.ErrRetryUnlikely):
			ev.End = Unlikely
		case errors.Is(reason, disposition.ErrRetriesExhausted):
			ev.End = Exhausted
		case sluice.ClassOf(reason) == sluice.ClassPermanent && !errors.Is(reason, disposition.ErrDeferralExpired):
			ev.End = MadePermanent
		default:
			ev.End = DeadLettered
		}
	}
	return ev, true
}
