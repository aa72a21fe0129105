package disposition

import (
	"errors"

	"github.com/sluice-go/sluice"
)

// The dead-letter reasons: why a message went to the dead-letter queue, as its
// x-dead-letter-reason header names it. The error type says what failed; the reason says
// why sluice stopped trying.
const (
	// ReasonPermanent: the handler's error was Permanent (sluice.Permanent, a decode
	// failure, a missing idempotency key).
	ReasonPermanent = "permanent"
	// ReasonRetriesExhausted: a retryable error used all of its retries.
	ReasonRetriesExhausted = "retries_exhausted"
	// ReasonMaxAge: a retryable error outlived MaxTotalAge before its retries ran out.
	ReasonMaxAge = "max_age"
	// ReasonDeferralExpired: a deferred message outlived MaxTotalAge.
	ReasonDeferralExpired = "deferral_expired"
	// ReasonRetryUnlikely: the learned retry policy judged a retry unlikely to help.
	ReasonRetryUnlikely = "retry_unlikely"
	// ReasonNoDelay: a retryable or deferred failure with no broker delay to carry it out
	// (the poison step used alone), dead-lettered at once.
	ReasonNoDelay = "no_delay"
	// ReasonFailed: any other dead letter (a Discard-class error that an inner step's own
	// decision dead-lettered).
	ReasonFailed = "failed"
)

// DeadLetterReasoner is an error that names its own dead-letter reason (the retry step's
// budget refusal names "retry_budget_exhausted").
type DeadLetterReasoner interface {
	DeadLetterReason() string
}

// DeadLetterReasonOf returns the reason a message dead-lettered for err went there: the
// first DeadLetterReasoner in err's chain, else one of the Reason constants.
func DeadLetterReasonOf(err error) string {
	var r DeadLetterReasoner
	if errors.As(err, &r) {
		return r.DeadLetterReason()
	}
	switch {
	case errors.Is(err, ErrRetryUnlikely):
		return ReasonRetryUnlikely
	case errors.Is(err, ErrDeferralExpired):
		return ReasonDeferralExpired
	}
	if ex, ok := errors.AsType[*ExhaustedError](err); ok {
		if ex.Age > 0 {
			return ReasonMaxAge
		}
		return ReasonRetriesExhausted
	}
	switch sluice.ClassOf(err) {
	case sluice.ClassPermanent:
		return ReasonPermanent
	case sluice.ClassRetryable, sluice.ClassDefer:
		return ReasonNoDelay
	}
	return ReasonFailed
}
